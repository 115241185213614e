"""The HTTP API on a real uvicorn server over a small index (hash embedder: fast)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.api import create_app
from app.engine import load_engine
from app.settings import Settings
from indexer.embedder import HashEmbedder
from tests.conftest import ServerThread
from tests.small_index import build_small_index, small_app


@pytest.fixture(scope="module")
def small_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    with ServerThread(small_app(build_small_index(tmp_path_factory))) as server:
        yield server


def test_health_ready_and_openapi(small_server: ServerThread) -> None:
    assert httpx.get(small_server.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(small_server.url + "/readyz")
    assert ready.status_code == 200 and ready.json()["index"]["model"] == "hash-64"
    assert "/ask" in httpx.get(small_server.url + "/openapi.json").json()["paths"]
    assert httpx.get(small_server.url + "/docs").status_code == 200


def test_ask_returns_passages_and_snippets(small_server: ServerThread) -> None:
    r = httpx.post(small_server.url + "/ask", json={"question": "How do I configure ZeRO stage 2 overlap_comm?", "k": 3}, timeout=30)
    assert r.status_code == 200
    body = r.json()
    assert set(body) >= {"answer", "passages", "snippets", "index", "timings_ms"}
    assert 1 <= len(body["passages"]) <= 3
    top = body["passages"][0]
    assert set(top) >= {"id", "text", "path", "url", "title", "heading", "score"}
    assert top["path"] == "docs/_tutorials/tiny.md" and top["url"].startswith("https://www.deepspeed.ai/tutorials/tiny/")
    kinds = {s["kind"] for s in body["snippets"]}
    assert {"ds_config", "launcher"} <= kinds
    assert all(s["status"] for s in body["snippets"])
    assert "[1]" in body["answer"]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"question": ""}, "question"),
        ({"question": "   "}, "question"),
        ({"question": "x" * 5000}, "question"),
        ({"question": 42}, "question"),
        ({"question": "zero", "k": 0}, "k"),
        ({"question": "zero", "k": 1000}, "k"),
        ({"question": "zero", "k": "five"}, "k"),
        ({"question": "zero", "topic": ["a"]}, "topic"),
        ({"question": "zero", "source": "web"}, "source"),
        ({"k": 3}, "question"),
        ({"question": "zero", "surprise": 1}, "surprise"),
        ([1, 2], "body"),
    ],
)
def test_bad_input_is_a_4xx_naming_the_field(small_server: ServerThread, payload: object, field: str) -> None:
    r = httpx.post(small_server.url + "/ask", json=payload)
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "invalid_input" and body["field"] == field and field in body["message"]


@pytest.mark.parametrize("question", ['is this config right? {"a": ' + "[" * 1500, "{" * 1999,
                                      'my config {"train_batch_size": 8, "bf16": {"enabled": true}, "zero_optimization": ' + "[" * 600 + "]" * 600 + "}"])
def test_a_question_holding_deeply_nested_json_is_answered(small_server: ServerThread, question: str) -> None:
    """Nesting deeper than json's parser goes raised RecursionError from the pasted-config reading: a 500."""
    r = httpx.post(small_server.url + "/ask", json={"question": question}, timeout=30)
    assert r.status_code == 200 and r.json()["answer"]


def test_malformed_json_is_a_4xx(small_server: ServerThread) -> None:
    r = httpx.post(small_server.url + "/ask", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["field"] == "body"


def test_not_ready_without_index(tmp_path: Path) -> None:
    settings = Settings(index_dir=tmp_path / "missing")
    with ServerThread(create_app(settings, load_engine(settings, HashEmbedder()))) as server:
        assert httpx.get(server.url + "/readyz").status_code == 503
        r = httpx.post(server.url + "/ask", json={"question": "zero"})
        assert r.status_code == 503 and r.json()["error"] == "index_not_ready"


def test_validate_config_route(small_server: ServerThread) -> None:
    ok = httpx.post(small_server.url + "/validate-config", json={"train_batch_size": 8, "bf16": {"enabled": True}}, timeout=30)
    assert ok.status_code == 200 and ok.json()["valid"] is True
    as_string = httpx.post(small_server.url + "/validate-config", json='{"train_batch_size": 8, "fp16": {"enabld": true}}', timeout=30)
    assert as_string.json()["errors"][0]["pointer"] == "/fp16/enabld"
    junk = httpx.post(small_server.url + "/validate-config", content=b"{nope", headers={"content-type": "application/json"})
    assert junk.status_code == 422 and junk.json()["field"] == "body"
