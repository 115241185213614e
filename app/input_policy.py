"""One input policy for every HTTP door: a body size limit (413), JSON read with a depth and a key
count limit, strings without lone surrogates, and every failure a 422 `invalid_input` that names
the limit (never a 400 "error parsing the body" or a 500).

`BodyLimit` is plain ASGI, so it guards every route (the API, MCP, Slack, the runner) before any
of them reads a byte it should not: a declared Content-Length over the limit is refused at once,
and a streamed body is cut off as soon as it passes the limit.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.errors import InvalidInput
from indexer.json_text import brackets


@dataclass(frozen=True)
class InputLimits:
    max_body_bytes: int = 1_000_000
    max_json_depth: int = 64
    max_json_keys: int = 20_000  # keys and list items, over the whole document


def check_json(value: Any, limits: InputLimits, field_name: str = "body") -> None:
    """Depth, size and surrogate checks on a parsed JSON value, without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    items = 0
    while stack:
        node, depth = stack.pop()
        if depth > limits.max_json_depth:
            raise InvalidInput(f"JSON nested deeper than {limits.max_json_depth} levels", field_name=field_name)
        if isinstance(node, dict):
            items += len(node)
            for key, child in node.items():
                _check_text(key, field_name)
                stack.append((child, depth + 1))
        elif isinstance(node, list):
            items += len(node)
            stack.extend((child, depth + 1) for child in node)
        elif isinstance(node, str):
            _check_text(node, field_name)
        if items > limits.max_json_keys:
            raise InvalidInput(f"JSON with more than {limits.max_json_keys} keys and items", field_name=field_name)


def _check_text(text: str, field_name: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput("text with a lone surrogate (\\ud800-\\udfff) is not valid Unicode", field_name=field_name) from exc


def parse_json(raw: bytes, limits: InputLimits, field_name: str = "body") -> Any:
    """A request body as JSON under the limits; InvalidInput (422) for anything else."""
    if len(raw) > limits.max_body_bytes:
        raise InvalidInput(f"body larger than {limits.max_body_bytes} bytes", field_name=field_name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"body is not UTF-8 (byte {exc.start})", field_name=field_name) from exc
    if _nesting(text) > limits.max_json_depth:  # before json.loads, which recurses
        raise InvalidInput(f"JSON nested deeper than {limits.max_json_depth} levels", field_name=field_name)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"body is not JSON: {exc}", field_name=field_name) from exc
    check_json(value, limits, field_name)
    return value


def _nesting(text: str) -> int:
    """The deepest bracket nesting of a JSON text (brackets inside strings not counted)."""
    depth = deepest = 0
    for ch in brackets(text):
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


class BodyLimit:
    """413 for a body over the limit, whether declared (Content-Length) or streamed."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def limited() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:  # end the body here; whatever the app replies becomes a 413
                    refused = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return message

        answered = False

        async def replaced(message: Message) -> None:
            nonlocal answered
            if not refused:
                await send(message)
            elif not answered:
                answered = True
                await self._refuse(send)

        await self.app(scope, limited, replaced)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"error": "payload_too_large", "message": f"body larger than {self.max_bytes} bytes", "field": "body"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
