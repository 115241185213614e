"""One input policy at every door, over a real uvicorn server: a body limit (413), JSON depth, key
count and surrogate limits (422 naming the limit), strict types, invalid UTF-8 as 422, load
shedding on /ask; the same limits in the CLI and the MCP tool."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.errors import InvalidInput
from app.input_policy import InputLimits, check_json, parse_json
from tests.conftest import ServerThread
from tests.small_index import build_small_index, small_app

DEEP = b"[" * 1000 + b"]" * 1000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    index = build_small_index(tmp_path_factory)
    with ServerThread(small_app(index, max_body_bytes=100_000, max_inflight_asks=1)) as s:
        yield s


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b'\xff\xfe{"question": "x"}', "body", "not valid JSON"),
        (b'{"question": ' + DEEP + b"}", "body", "not valid JSON"),
        (b'{"question": "x", "k": true}', "k", "valid integer"),
        (b'{"question": "x", "checked_only": 0}', "checked_only", "valid boolean"),
        (b'{"question": "x", "stream": "yes"}', "stream", "valid boolean"),
        (b'{"question": "\\ud800"}', "question", "unicode"),
    ],
)
def test_ask_refuses_bad_bodies_with_422_naming_the_field(server: ServerThread, body: bytes, field: str, words: str) -> None:
    r = httpx.post(server.url + "/ask", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "invalid_input" and r.json()["field"] == field and words in r.json()["message"]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (DEEP, "nested deeper than 64"),
        (b'{"optimizer": {"params": ' + b'{"a": ' * 800 + b"1" + b"}" * 800 + b"}}", "nested deeper than 64"),
        (b'{"\\ud800": 1}', "lone surrogate"),
        (b'{"optimizer": {"params": {"betas": [' + b"0," * 30_000 + b"0]}}}", "more than 20000 keys and items"),
    ],
)
def test_validate_config_limits_are_422_not_500(server: ServerThread, body: bytes, words: str) -> None:
    r = httpx.post(server.url + "/validate-config", content=body)
    assert r.status_code == 422 and words in r.json()["message"], r.text


def test_bodies_over_the_limit_are_413_before_they_are_read(server: ServerThread) -> None:
    big = b'{"question": "' + b"x" * 200_000 + b'"}'
    for path in ("/ask", "/validate-config", "/slack/commands"):
        r = httpx.post(server.url + path, content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and r.json()["error"] == "payload_too_large", path

    def chunks() -> Iterator[bytes]:  # no Content-Length: the streamed body is cut off at the limit
        yield b'{"question": "'
        for _ in range(40):
            yield b"x" * 10_000
        yield b'"}'

    r = httpx.post(server.url + "/ask", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


def test_ask_sheds_load_with_503_and_retry_after(tmp_path_factory: pytest.TempPathFactory) -> None:
    index = build_small_index(tmp_path_factory)
    with ServerThread(small_app(index, max_inflight_asks=0)) as full:  # every slot taken
        r = httpx.post(full.url + "/ask", json={"question": "How do I configure ZeRO stage 2?"})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1" and r.json()["error"] == "overloaded"


def test_concurrent_asks_get_answers_or_a_fast_503(server: ServerThread) -> None:
    results: list[int] = []

    def one() -> None:
        results.append(httpx.post(server.url + "/ask", json={"question": "How do I configure ZeRO stage 2?"}, timeout=30).status_code)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 12 and set(results) <= {200, 503} and 200 in results


def test_asks_beyond_the_answering_threads_wait_for_one(tmp_path_factory: pytest.TempPathFactory) -> None:
    """More questions in flight than `ask_threads` (under `max_inflight_asks`) queue for a thread and are all
    answered, and no more threads than that ever answer at once."""
    index = build_small_index(tmp_path_factory)
    results: list[int] = []
    busiest = [0]

    def one(url: str) -> None:
        results.append(httpx.post(url + "/ask", json={"question": "How do I configure ZeRO stage 2?"}, timeout=60).status_code)
        busiest[0] = max(busiest[0], sum(1 for th in threading.enumerate() if th.name.startswith("dsqa-ask") and th not in before))

    before = set(threading.enumerate())  # other servers' answering threads
    with ServerThread(small_app(index, max_inflight_asks=32, ask_threads=2)) as s:
        threads = [threading.Thread(target=one, args=(s.url,)) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert results == [200] * 10 and 1 <= busiest[0] <= 2


def test_limits_without_recursion() -> None:
    limits = InputLimits(max_body_bytes=10_000, max_json_depth=8, max_json_keys=50)
    with pytest.raises(InvalidInput, match="deeper than 8"):
        parse_json(b"[" * 9 + b"]" * 9, limits)
    assert parse_json(b'{"a": "[[[[[[[[[[[[[[["}', limits) == {"a": "[" * 15}  # brackets in strings are text
    with pytest.raises(InvalidInput, match="more than 50"):
        check_json(list(range(60)), limits)
    with pytest.raises(InvalidInput, match="larger than"):
        parse_json(b" " * 10_001, limits)


def test_cli_validate_config_says_why_and_exits_2(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_bytes(DEEP)
    r = subprocess.run([sys.executable, "-m", "app.cli", "validate-config", str(deep)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "nested deeper than 64" in r.stderr and "Traceback" not in r.stderr


def test_api_keys_guard_ask_and_mcp_with_a_rate_limit_per_key(tmp_path_factory: pytest.TempPathFactory) -> None:
    index = build_small_index(tmp_path_factory)
    with ServerThread(small_app(index, api_keys="k-alpha, k-beta", api_rate_per_minute=2)) as s:
        q = {"question": "How do I configure ZeRO stage 2?"}
        assert httpx.post(s.url + "/ask", json=q).status_code == 401
        assert httpx.post(s.url + "/ask", json=q, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.post(s.url + "/mcp", json={}).status_code == 401
        alpha = {"Authorization": "Bearer k-alpha"}
        assert [httpx.post(s.url + "/ask", json=q, headers=alpha).status_code for _ in range(2)] == [200, 200]
        limited = httpx.post(s.url + "/ask", json=q, headers=alpha)
        assert limited.status_code == 429 and int(limited.headers["Retry-After"]) >= 1
        assert httpx.post(s.url + "/ask", json=q, headers={"X-API-Key": "k-beta"}).status_code == 200  # its own bucket
        assert httpx.get(s.url + "/healthz").status_code == 200 and httpx.post(s.url + "/validate-config", json={}).status_code == 200


def test_reload_swaps_a_rebuilt_index_under_load_with_no_failed_request(tmp_path_factory: pytest.TempPathFactory) -> None:
    from indexer.build import build_index
    from indexer.embedder import HashEmbedder
    from tests.conftest import RST, TUTORIAL

    index = build_small_index(tmp_path_factory)
    with ServerThread(small_app(index, admin_token="adm-1")) as s:
        assert httpx.post(s.url + "/admin/reload").status_code == 401
        statuses: list[int] = []
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                statuses.append(httpx.post(s.url + "/ask", json={"question": "How do I configure ZeRO stage 2?"}, timeout=30).status_code)

        workers = [threading.Thread(target=hammer) for _ in range(4)]
        for w in workers:
            w.start()
        root = tmp_path_factory.mktemp("docs2") / "DeepSpeed"
        (root / "docs/_tutorials").mkdir(parents=True)
        (root / "docs/code-docs/source").mkdir(parents=True)
        (root / "docs/_tutorials/tiny.md").write_text(TUTORIAL + "\n## Reloaded\n\nA section that only the rebuilt index has, about reloading.\n")
        (root / "docs/code-docs/source/pipeline.rst").write_text(RST)
        before = httpx.get(s.url + "/readyz").json()["index"]["built_at"]
        build_index(index, HashEmbedder(), docs_dir=root, notes_dir=None, cache_dir=None, progress=False)  # rebuilt in place
        reply = httpx.post(s.url + "/admin/reload", headers={"Authorization": "Bearer adm-1"}, timeout=60)
        stop.set()
        for w in workers:
            w.join()
    assert reply.status_code == 200 and reply.json()["index"]["built_at"] != before
    assert statuses and set(statuses) == {200}, sorted(set(statuses))


def test_slow_header_connections_time_out_and_the_server_keeps_serving(tmp_path_factory: pytest.TempPathFactory) -> None:
    import socket
    import time

    index = build_small_index(tmp_path_factory)
    with ServerThread(small_app(index), header_timeout_s=1.0) as s:
        slow = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(20)]
        silent = socket.create_connection(("127.0.0.1", s.port), timeout=10)  # never sends a byte
        for c in slow:
            c.sendall(b"POST /ask HTTP/1.1\r\nHost: x\r\n")  # a request line, then nothing more
        started = time.monotonic()
        for c in slow[:5]:
            c.sendall(b"X-Drip: 1\r\n")  # a drip of headers does not extend the deadline
        replies = [c.recv(4096) for c in [*slow, silent]]
        waited = time.monotonic() - started
        assert all(r.startswith(b"HTTP/1.1 408") for r in replies), replies[:2]
        assert all(c.recv(10) == b"" for c in slow[:3])  # closed after the reply
        assert waited < 5
        r = httpx.post(f"{s.url}/ask", json={"question": "how do I enable ZeRO stage 3?"}, timeout=30)
        assert r.status_code == 200  # a well-behaved client is served as before
        keep = httpx.Client(base_url=s.url, timeout=30)  # kept-alive connections serve request after request
        assert all(keep.get("/healthz").status_code == 200 for _ in range(3))
        keep.close()
        for c in [*slow, silent]:
            c.close()
