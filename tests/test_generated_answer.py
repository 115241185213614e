"""Generated answers through an OpenAI-compatible endpoint (a local fake at its HTTP boundary)."""

from __future__ import annotations

import http.server
import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.ask import ask
from app.engine import load_engine
from app.schemas import AskRequest
from indexer.embedder import HashEmbedder
from tests.small_index import build_small_index, small_settings


@pytest.fixture(scope="module")
def llm() -> Iterator[tuple[str, list[dict]]]:
    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            if self.path.startswith("/broken"):
                self.send_response(500)
                self.end_headers()
                return
            if self.path.startswith("/slow"):
                time.sleep(2)
            reply = {"choices": [{"message": {"content": "Set zero_optimization.stage to 2 [1]."}}]}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_index(tmp_path_factory)


def _ask(index: Path, url: str, timeout: float = 5.0) -> str:
    settings = small_settings(index, llm_url=url, llm_api_key="sk-test", llm_timeout_s=timeout)
    return ask(load_engine(settings, HashEmbedder()), AskRequest(question="How do I configure ZeRO stage 2?")).answer


def test_generated_answer_uses_the_passages(index: Path, llm: tuple[str, list[dict]]) -> None:
    url, seen = llm
    assert _ask(index, url + "/v1") == "Set zero_optimization.stage to 2 [1]."
    call = seen[-1]
    assert call["path"] == "/v1/chat/completions" and call["auth"] == "Bearer sk-test"
    prompt = call["body"]["messages"][-1]["content"]
    assert "[1]" in prompt and "How do I configure ZeRO stage 2?" in prompt


@pytest.mark.parametrize("path", ["/broken", "/slow"])
def test_endpoint_failure_or_timeout_falls_back_to_extractive(index: Path, llm: tuple[str, list[dict]], path: str) -> None:
    url, _ = llm
    answer = _ask(index, url + path, timeout=0.5)
    assert answer != "Set zero_optimization.stage to 2 [1]." and re.search(r"\[\d\]", answer)
