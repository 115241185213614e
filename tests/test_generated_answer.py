"""Generated answers through an OpenAI-compatible endpoint, replaced at its HTTP boundary by
`httpx.MockTransport`: the one client, the draft and passages sent, the citation check, the
fallbacks, and `"stream": true` as server-sent events."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from app.api import create_app
from app.ask import ask
from app.engine import load_engine
from app.schemas import AskRequest
from indexer.embedder import HashEmbedder
from tests.small_index import build_small_index, small_settings

QUESTION = "How do I configure ZeRO stage 2?"
GOOD = "Set zero_optimization.stage to 2 [1]."


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_index(tmp_path_factory)


def endpoint(reply: str | None, seen: list[httpx.Request], chunks: list[str] | None = None) -> httpx.Client:
    """A client whose transport plays the endpoint: `reply` as a completion (None: HTTP 500), or as
    server-sent deltas (`chunks`) when the request asks to stream."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if reply is None:
            return httpx.Response(500, json={"error": "down"})
        if json.loads(request.content).get("stream"):
            lines = [f"data: {json.dumps({'choices': [{'delta': {'content': c}}]})}\n\n" for c in (chunks or [reply])]
            return httpx.Response(200, text="".join(lines) + "data: [DONE]\n\n", headers={"content-type": "text/event-stream"})
        return httpx.Response(200, json={"choices": [{"message": {"content": reply}}]})

    return httpx.Client(transport=httpx.MockTransport(handle))


def _engine(index: Path, client: httpx.Client, url: str = "http://llm.test/v1"):  # noqa: ANN202
    settings = small_settings(index, llm_url=url, llm_api_key="sk-test", llm_timeout_s=5.0)
    return load_engine(settings, HashEmbedder(), llm_http=client)


def test_generated_answer_uses_the_passages_and_one_client(index: Path) -> None:
    seen: list[httpx.Request] = []
    client = endpoint(GOOD, seen)
    engine = _engine(index, client)
    assert engine.llm is not None and engine.llm.http is client
    for _ in range(2):
        assert ask(engine, AskRequest(question=QUESTION)).answer == GOOD
    assert len(seen) == 2 and all(r.url == httpx.URL("http://llm.test/v1/chat/completions") for r in seen)
    assert seen[0].headers["Authorization"] == "Bearer sk-test"
    prompt = json.loads(seen[0].content)["messages"][-1]["content"]
    draft = ask(load_engine(small_settings(index), HashEmbedder()), AskRequest(question=QUESTION)).answer
    assert "[1]" in prompt and QUESTION in prompt and draft.split(" [")[0] in prompt  # the extractive draft is sent


def _raises_timeout(seen: list[httpx.Request]) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        raise httpx.ReadTimeout("timed out", request=request)

    return httpx.Client(transport=httpx.MockTransport(handle))


@pytest.mark.parametrize(
    "make",
    [
        lambda seen: endpoint(None, seen),  # HTTP 500
        _raises_timeout,
        lambda seen: endpoint("ZeRO stage 2 partitions gradients.", seen),  # cites nothing
        lambda seen: endpoint("See the pipeline docs [9].", seen),  # cites a passage it was not given
        lambda seen: endpoint("   ", seen),  # empty
    ],
    ids=["http-500", "timeout", "no-citation", "unknown-citation", "empty"],
)
def test_unusable_generation_falls_back_to_extractive(index: Path, make: Callable[[list[httpx.Request]], httpx.Client]) -> None:
    seen: list[httpx.Request] = []
    answer = ask(_engine(index, make(seen)), AskRequest(question=QUESTION)).answer
    extractive = ask(load_engine(small_settings(index), HashEmbedder()), AskRequest(question=QUESTION)).answer
    assert seen and answer == extractive and re.search(r"\[\d\]", answer)


def _events(body: str) -> list[tuple[str, dict]]:
    out = []
    for block in body.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def _stream(engine, question: str = QUESTION) -> tuple[str, list[tuple[str, dict]]]:  # noqa: ANN001
    settings = engine.settings
    with TestClient(create_app(settings, engine)) as http:
        resp = http.post("/ask", json={"question": question, "stream": True})
        assert resp.status_code == 200
        return resp.headers["content-type"], _events(resp.text)


def test_stream_sends_passages_then_deltas_then_the_checked_answer(index: Path) -> None:
    seen: list[httpx.Request] = []
    ctype, events = _stream(_engine(index, endpoint(GOOD, seen, chunks=["Set zero_optimization", ".stage to 2", " [1]."])))
    assert ctype.startswith("text/event-stream")
    names = [name for name, _ in events]
    assert names == ["passages", "delta", "delta", "delta", "answer"]
    assert events[0][1]["passages"] and events[0][1]["covered"] is True
    assert "".join(d["text"] for n, d in events if n == "delta") == GOOD
    assert events[-1][1]["answer"] == GOOD and json.loads(seen[0].content)["stream"] is True


def test_stream_with_bad_citations_ends_with_the_extractive_answer(index: Path) -> None:
    _, events = _stream(_engine(index, endpoint("Trust me [7].", [])))
    names = [name for name, _ in events]
    assert names == ["passages", "delta", "fallback", "answer"]
    final = events[-1][1]["answer"]
    assert final == events[2][1]["answer"] and final != "Trust me [7]." and re.search(r"\[\d\]", final)


def test_stream_without_an_endpoint_is_passages_then_answer(index: Path) -> None:
    _, events = _stream(load_engine(small_settings(index), HashEmbedder()))
    assert [name for name, _ in events] == ["passages", "answer"]
    assert events[-1][1]["passages"] == events[0][1]["passages"]
