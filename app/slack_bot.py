"""The Slack bot: slack_bolt behind its FastAPI adapter, thin over the one `ask` core.

`/deepspeed <question>` posts to `POST /slack/commands`, app mentions to `POST /slack/events`
(URL verification included). Bolt checks the signing secret and the timestamp (a bad signature or
one older than five minutes is a 401), acknowledges at once and answers in the background: a slash
command through its response_url, a mention with chat.postMessage in the thread. The reply is Block
Kit: the answer, the top citations as links and one snippet, a statically checked one first.
Without a signing secret the routes exist but answer 503 with how to configure them.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from app.ask import ask, best_snippets
from app.engine import Engine
from app.errors import DsqaError, InvalidInput, NotConfigured, as_text
from app.schemas import MAX_QUESTION_CHARS, AskRequest, AskResponse
from app.settings import Settings

if TYPE_CHECKING:  # slack_bolt is imported only where the bot is configured (a server without it saves ~4 MB a worker)
    from slack_bolt import App
    from slack_bolt.authorization import AuthorizeResult
    from slack_sdk import WebClient

log = logging.getLogger(__name__)

EngineGetter = Callable[[], Engine]
COMMAND = "/deepspeed"
MENTION = re.compile(r"<@[A-Z0-9]+(\|[^>]*)?>")
SECTION_CHARS = 2900  # Block Kit caps a section's text at 3000
CODE_CHARS = 2500
SOURCES = 5
NOT_CONFIGURED = (
    "Slack is not configured on this dsqa: set SLACK_SIGNING_SECRET (or DSQA_SLACK_SIGNING_SECRET) and "
    "SLACK_BOT_TOKEN, then restart the service."
)


def escape(text: str) -> str:
    """Slack's mrkdwn control characters."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_mrkdwn(text: str) -> str:
    text = escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"*\1*", text)  # Markdown bold -> mrkdwn bold
    return re.sub(r"^#+\s*(.+)$", r"*\1*", text, flags=re.M)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def answer_blocks(question: str, resp: AskResponse) -> tuple[list[dict[str, Any]], str]:
    """Block Kit for one answer, and the plain-text fallback Slack shows in notifications."""
    blocks: list[dict[str, Any]] = [
        {"type": "context", "elements": [{"type": "mrkdwn", "text": f"*Q:* {_clip(escape(question), 280)}"}]},
        {"type": "section", "text": {"type": "mrkdwn", "text": _clip(to_mrkdwn(resp.answer), SECTION_CHARS)}},
    ]
    if resp.passages:
        links = []
        for n, p in enumerate(resp.passages[:SOURCES], 1):
            where = p.title if not p.heading or p.heading == p.title else f"{p.title} › {p.heading}"
            links.append(f"[{n}] <{p.url}|{escape(where).replace('|', '/')}>")
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": _clip("*Sources*\n" + "\n".join(links), SECTION_CHARS)}})
    for s in best_snippets(resp.snippets, 1):
        code = _clip(escape(s.code.rstrip()).replace("```", "ˋˋˋ"), CODE_CHARS)
        blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": f"```{code}```"}})
        blocks.append({
            "type": "context",
            "elements": [{"type": "mrkdwn", "text": f"`{s.id}` · {s.kind} · *{escape(s.label or s.status)}*: {escape(s.stamp)} · <{s.source_url}|source>"}],
        })
    idx = resp.index or {}
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": f"dsqa · deepspeed {idx.get('deepspeed_version') or '?'}"}]})
    return blocks, _clip(resp.answer, 300)


def error_blocks(message: str) -> tuple[list[dict[str, Any]], str]:
    return [{"type": "section", "text": {"type": "mrkdwn", "text": _clip(escape(message), SECTION_CHARS)}}], message


def reply_for(get_engine: EngineGetter, question: str) -> tuple[list[dict[str, Any]], str]:
    """The answer as Block Kit; dsqa's own errors become their text, anything else a short apology."""
    try:
        if len(question) > MAX_QUESTION_CHARS:
            raise InvalidInput(f"the question is longer than {MAX_QUESTION_CHARS} characters", field_name="question")
        return answer_blocks(question, ask(get_engine(), AskRequest(question=question, k=SOURCES)))
    except DsqaError as exc:
        return error_blocks(as_text(exc))
    except Exception:
        log.exception("slack: answering %r failed", question[:200])
        return error_blocks("Error: dsqa could not answer that just now; the failure is in the service logs.")


def _no_token(enterprise_id: str | None, team_id: str | None) -> AuthorizeResult:
    """Without a bot token slash commands still work (they answer through response_url)."""
    from slack_bolt.authorization import AuthorizeResult

    return AuthorizeResult(enterprise_id=enterprise_id, team_id=team_id)


def build_bolt_app(settings: Settings, get_engine: EngineGetter) -> App:
    from slack_bolt import App
    from slack_sdk import WebClient

    client = WebClient(token=settings.slack_bot_token, base_url=settings.slack_api_url)
    bolt = App(
        signing_secret=settings.slack_signing_secret,
        client=client,
        token_verification_enabled=False,  # auth.test on the first request, not at start-up
        authorize=None if settings.slack_bot_token else _no_token,
        process_before_response=False,  # ack first, answer in Bolt's listener threads
    )

    @bolt.command(COMMAND)
    def on_command(ack: Any, command: dict[str, Any], respond: Any) -> None:
        question = (command.get("text") or "").strip()
        if not question:
            ack(text=f"Ask a question about DeepSpeed: `{COMMAND} how do I offload optimizer states to CPU?`")
            return
        ack(text=f"Looking it up: {_clip(question, 200)}")
        blocks, text = reply_for(get_engine, question)
        respond(text=text, blocks=blocks, response_type="in_channel", replace_original=False)

    @bolt.event("app_mention")
    def on_mention(event: dict[str, Any], client: WebClient) -> None:
        question = MENTION.sub("", event.get("text") or "").strip()
        thread = event.get("thread_ts") or event.get("ts")
        if not question:
            blocks, text = error_blocks("Mention me with a question about DeepSpeed.")
        else:
            blocks, text = reply_for(get_engine, question)
        if not client.token:
            log.warning("slack: a mention arrived but SLACK_BOT_TOKEN is not set, so it cannot be answered")
            return
        client.chat_postMessage(channel=event["channel"], thread_ts=thread, text=text, blocks=blocks)

    return bolt


REPLAY_WINDOW_S = 300  # Slack's own: a signed request older than five minutes is refused


class ReplayGuard:
    """Each signature is answered once within the window (a replayed signed request is not)."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S) -> None:
        self.window_s = window_s
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def answered(self, signature: str, now: float) -> bool:
        with self.lock:
            for sig, at in list(self.seen.items()):
                if now - at > self.window_s:
                    del self.seen[sig]
            return signature in self.seen

    def record(self, signature: str, now: float) -> None:
        with self.lock:
            self.seen[signature] = now


def _unauthorised(message: str) -> Response:
    return Response(status_code=401, media_type="application/json",
                    content=json.dumps({"error": "unauthorised", "message": message}))


def mount_slack(app: FastAPI, settings: Settings, get_engine: EngineGetter) -> None:
    handler = None
    if settings.slack_signing_secret:
        from slack_bolt.adapter.fastapi import SlackRequestHandler

        handler = SlackRequestHandler(build_bolt_app(settings, get_engine))
    guard = ReplayGuard()

    async def slack_route(request: Request) -> Response:
        if handler is None:
            raise NotConfigured(NOT_CONFIGURED)
        stamp = request.headers.get("x-slack-request-timestamp", "")
        signature = request.headers.get("x-slack-signature", "")
        if not stamp.isdigit() or not signature:  # Bolt would raise on int("abc")
            return _unauthorised("missing or malformed X-Slack-Request-Timestamp / X-Slack-Signature")
        if guard.answered(signature, time.time()):
            log.warning("slack: a replayed signed request was not answered again")
            return Response(status_code=200, content=b"")
        try:
            reply = await handler.handle(request)
        except Exception:  # noqa: BLE001 - a signed but malformed body must not be a 500
            log.warning("slack: a request Bolt could not read (malformed body)")
            return Response(status_code=400, media_type="application/json",
                            content=json.dumps({"error": "invalid_input", "message": "the Slack payload could not be read", "field": "body"}))
        if reply.status_code == 200:  # only a verified request is remembered
            guard.record(signature, time.time())
        return reply

    for path, summary in (("/slack/commands", "Slack slash command /deepspeed"), ("/slack/events", "Slack Events API (app mentions)")):
        app.add_api_route(path, slack_route, methods=["POST"], tags=["slack"], summary=summary, include_in_schema=True)

