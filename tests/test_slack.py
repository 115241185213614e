"""The Slack bot on a real uvicorn server: signed requests in, Web API calls out to a local server."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import httpx
import pytest
from slack_sdk.signature import SignatureVerifier

from app.schemas import AskResponse, Passage, SnippetOut
from app.slack_bot import answer_blocks
from tests.conftest import ServerThread
from tests.small_index import build_small_index, small_app

SECRET = "test-signing-secret"
BOT_USER = "UBOT"


class FakeSlack:
    """A local stand-in for slack.com: the Web API under /api/ and response_url under /response/."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                raw = self.rfile.read(int(self.headers.get("content-length") or 0)).decode()
                body = json.loads(raw) if raw.startswith("{") else {k: v[0] for k, v in parse_qs(raw).items()}
                with fake.lock:
                    fake.calls.append((self.path, body))
                reply: dict[str, Any] = {"ok": True}
                if self.path.endswith("auth.test"):
                    reply.update(user_id=BOT_USER, bot_id="BBOT", team_id="T1", team="test", user="dsqa", url="https://test.slack.com/")
                elif self.path.endswith("chat.postMessage"):
                    reply.update(channel=body.get("channel"), ts="999.1")
                data = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait_for(self, path: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for p, body in self.calls:
                    if p == path:
                        return body
            time.sleep(0.05)
        raise AssertionError(f"nothing was posted to {path}; calls: {[p for p, _ in self.calls]}")


@pytest.fixture(scope="module")
def fake_slack() -> Iterator[FakeSlack]:
    fake = FakeSlack()
    fake.thread.start()
    yield fake
    fake.server.shutdown()


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_small_index(tmp_path_factory)


@pytest.fixture(scope="module")
def slack_server(index_dir: Path, fake_slack: FakeSlack) -> Iterator[ServerThread]:
    app = small_app(index_dir, slack_signing_secret=SECRET, slack_bot_token="xoxb-test", slack_api_url=fake_slack.url + "/api/")
    with ServerThread(app) as server:
        yield server


def signed(body: str, *, secret: str = SECRET, timestamp: int | None = None, content_type: str) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {"X-Slack-Request-Timestamp": ts, "X-Slack-Signature": signature, "content-type": content_type}


def command_body(fake: FakeSlack, text: str, n: int) -> str:
    return urlencode({
        "token": "legacy", "team_id": "T1", "team_domain": "test", "channel_id": "C1", "channel_name": "general",
        "user_id": "U1", "user_name": "ada", "command": "/deepspeed", "text": text, "api_app_id": "A1",
        "response_url": f"{fake.url}/response/{n}", "trigger_id": "1.2.3",
    })


FORM = "application/x-www-form-urlencoded"


def test_slash_command_acks_fast_and_answers_through_response_url(slack_server: ServerThread, fake_slack: FakeSlack) -> None:
    body = command_body(fake_slack, "How do I configure ZeRO stage 2 overlap_comm?", 1)
    start = time.monotonic()
    r = httpx.post(slack_server.url + "/slack/commands", content=body, headers=signed(body, content_type=FORM), timeout=10)
    assert r.status_code == 200 and time.monotonic() - start < 3
    assert "Looking it up" in r.text
    reply = fake_slack.wait_for("/response/1")
    assert reply["response_type"] == "in_channel"
    texts = [b["text"]["text"] for b in reply["blocks"] if b["type"] == "section"]
    assert "[1]" in texts[0]  # the answer with its citations
    assert any(t.startswith("*Sources*") and "<https://www.deepspeed.ai/tutorials/tiny/" in t for t in texts)
    assert any(t.startswith("```") for t in texts)  # one snippet
    contexts = [e["text"] for b in reply["blocks"] if b["type"] == "context" for e in b["elements"]]
    assert any("*checked*: checked statically against deepspeed" in c for c in contexts)


def test_empty_command_gets_usage(slack_server: ServerThread, fake_slack: FakeSlack) -> None:
    body = command_body(fake_slack, "  ", 2)
    r = httpx.post(slack_server.url + "/slack/commands", content=body, headers=signed(body, content_type=FORM), timeout=10)
    assert r.status_code == 200 and "/deepspeed" in r.text


@pytest.mark.parametrize(
    "headers",
    [
        {"secret": "wrong-secret"},
        {"timestamp": int(time.time()) - 6 * 60},  # signed correctly, but older than five minutes
        {"strip": True},
    ],
)
def test_bad_signature_or_stale_timestamp_is_401(slack_server: ServerThread, fake_slack: FakeSlack, headers: dict[str, Any]) -> None:
    body = command_body(fake_slack, "zero", 3)
    h = signed(body, secret=headers.get("secret", SECRET), timestamp=headers.get("timestamp"), content_type=FORM)
    if headers.get("strip"):
        h = {"content-type": FORM}
    r = httpx.post(slack_server.url + "/slack/commands", content=body, headers=h, timeout=10)
    assert r.status_code == 401
    assert not any(p == "/response/3" for p, _ in fake_slack.calls)


@pytest.mark.parametrize("stamp", ["abc", "1e9", "", "-5"])
def test_a_malformed_timestamp_is_401_not_500(slack_server: ServerThread, fake_slack: FakeSlack, stamp: str) -> None:
    body = command_body(fake_slack, "zero", 4)
    h = {**signed(body, content_type=FORM), "X-Slack-Request-Timestamp": stamp}
    r = httpx.post(slack_server.url + "/slack/commands", content=body, headers=h, timeout=10)
    assert r.status_code == 401 and r.json()["error"] == "unauthorised"


def test_a_signed_malformed_body_is_400_not_500(slack_server: ServerThread) -> None:
    body = '{"type": "event_callback", "event": '  # cut short, but signed
    r = httpx.post(slack_server.url + "/slack/events", content=body, headers=signed(body, content_type="application/json"), timeout=10)
    assert r.status_code in (400, 401) and r.status_code != 500


def test_a_replayed_signed_command_is_answered_once(slack_server: ServerThread, fake_slack: FakeSlack) -> None:
    body = command_body(fake_slack, "How do I configure ZeRO stage 2 overlap_comm?", 5)
    headers = signed(body, content_type=FORM)
    first = httpx.post(slack_server.url + "/slack/commands", content=body, headers=headers, timeout=10)
    fake_slack.wait_for("/response/5")
    again = httpx.post(slack_server.url + "/slack/commands", content=body, headers=headers, timeout=10)
    assert first.status_code == 200 and "Looking it up" in first.text
    assert again.status_code == 200 and again.text == ""
    time.sleep(1.0)
    assert sum(1 for p, _ in fake_slack.calls if p == "/response/5") == 1


def test_events_url_verification(slack_server: ServerThread) -> None:
    body = json.dumps({"token": "legacy", "challenge": "challenge-xyz", "type": "url_verification"})
    r = httpx.post(slack_server.url + "/slack/events", content=body, headers=signed(body, content_type="application/json"), timeout=10)
    assert r.status_code == 200 and r.json() == {"challenge": "challenge-xyz"}


def test_app_mention_answers_in_the_thread(slack_server: ServerThread, fake_slack: FakeSlack) -> None:
    event = {"type": "app_mention", "user": "U1", "text": f"<@{BOT_USER}> how do I launch deepspeed with --num_gpus?", "ts": "1700000000.000100", "channel": "C9", "event_ts": "1700000000.000100"}
    body = json.dumps({"token": "legacy", "team_id": "T1", "api_app_id": "A1", "type": "event_callback", "event_id": "Ev1", "event_time": 1700000000, "event": event, "authorizations": [{"team_id": "T1", "user_id": BOT_USER, "is_bot": True}]})
    start = time.monotonic()
    r = httpx.post(slack_server.url + "/slack/events", content=body, headers=signed(body, content_type="application/json"), timeout=10)
    assert r.status_code == 200 and time.monotonic() - start < 3
    post = fake_slack.wait_for("/api/chat.postMessage")
    assert post["channel"] == "C9" and post["thread_ts"] == "1700000000.000100"
    blocks = post["blocks"]
    assert any(b["type"] == "section" and "<https://www.deepspeed.ai/tutorials/tiny/" in b["text"]["text"] for b in blocks)
    assert post["text"]  # the notification fallback


def test_without_a_signing_secret_slack_routes_are_503(index_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLACK_SIGNING_SECRET", "DSQA_SLACK_SIGNING_SECRET"):
        monkeypatch.delenv(name, raising=False)
    with ServerThread(small_app(index_dir)) as server:
        for path in ("/slack/commands", "/slack/events"):
            r = httpx.post(server.url + path, content="x=1", headers={"content-type": FORM})
            assert r.status_code == 503
            assert r.json()["error"] == "not_configured" and "SLACK_SIGNING_SECRET" in r.json()["message"]


def test_blocks_prefer_a_checked_snippet_and_escape_text() -> None:
    def snip(i: str, status: str) -> SnippetOut:
        return SnippetOut(id=i, language="python", kind="python", code=f"x = {i!r}  # a < b", source_url="https://x/y", status=status, stamp=status)

    resp = AskResponse(
        answer="Use **ZeRO** & offload [1].", covered=True,
        passages=[Passage(id="p", text="t", path="p", url="https://d/#a", title="T|x", heading="H <1>", score=1.0, source="docs")],
        snippets=[snip("bad", "fails"), snip("good", "checked")], index={"deepspeed_version": "0.19.8"}, timings_ms={},
    )
    blocks, fallback = answer_blocks("why <b>?", resp)
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section"]
    assert sections[0] == "Use *ZeRO* &amp; offload [1]."
    assert "<https://d/#a|T/x › H &lt;1&gt;>" in sections[1]
    assert "'good'" in sections[2] and "'bad'" not in sections[2] and "a &lt; b" in sections[2]
    assert fallback.startswith("Use **ZeRO**")


def test_slash_command_works_without_a_bot_token(index_dir: Path, fake_slack: FakeSlack, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLACK_BOT_TOKEN", "DSQA_SLACK_BOT_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with ServerThread(small_app(index_dir, slack_signing_secret=SECRET, slack_api_url=fake_slack.url + "/api/")) as server:
        body = command_body(fake_slack, "What is PipelineModule?", 4)
        r = httpx.post(server.url + "/slack/commands", content=body, headers=signed(body, content_type=FORM), timeout=10)
        assert r.status_code == 200
        reply = fake_slack.wait_for("/response/4")
    assert any("*Sources*" in b["text"]["text"] for b in reply["blocks"] if b["type"] == "section")
