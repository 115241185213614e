"""Optional API keys for the doors that answer (`/ask`, `/mcp`): with `DSQA_API_KEYS` set, a request
must carry one (`Authorization: Bearer KEY` or `X-API-Key: KEY`) or gets 401, and each key has its
own rate limit (a token bucket of `DSQA_API_RATE_PER_MINUTE`; past it, 429 with `Retry-After`).
Without keys every door stays open, as before. Keys are compared in constant time and never logged.

Plain ASGI, so the MCP stream passes through untouched once a request is let in.
"""

from __future__ import annotations

import hmac
import json
import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

GUARDED_PREFIXES = ("/ask", "/mcp")


@dataclass
class Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """A token bucket per key: `per_minute` requests a minute, bursts up to the same number."""

    def __init__(self, per_minute: int) -> None:
        self.capacity = float(max(1, per_minute))
        self.rate = self.capacity / 60.0
        self.buckets: dict[str, Bucket] = {}
        self.lock = threading.Lock()

    def take(self, key: str, now: float | None = None) -> float:
        """0 when the request may go; else the seconds until a token is back."""
        now = time.monotonic() if now is None else now
        with self.lock:
            bucket = self.buckets.setdefault(key, Bucket(self.capacity, now))
            bucket.tokens = min(self.capacity, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / self.rate


def parse_keys(raw: str | None) -> list[str]:
    return [k.strip() for k in (raw or "").split(",") if k.strip()]


class ApiKeys:
    def __init__(self, app: ASGIApp, keys: Iterable[str], per_minute: int, prefixes: tuple[str, ...] = GUARDED_PREFIXES) -> None:
        self.app = app
        self.keys = [k.encode() for k in keys]
        self.limiter = RateLimiter(per_minute)
        self.prefixes = prefixes

    def _key_of(self, scope: Scope) -> bytes | None:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"").strip()
        for key in self.keys:
            if given and hmac.compare_digest(given, key):
                return key
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not self.keys or not path.startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        key = self._key_of(scope)
        if key is None:
            await _reply(send, 401, {"error": "unauthorised", "message": "this service needs an API key: Authorization: Bearer KEY or X-API-Key: KEY"},
                         [(b"www-authenticate", b"Bearer")])
            return
        wait = self.limiter.take(key.decode())
        if wait > 0:
            await _reply(send, 429, {"error": "rate_limited", "message": f"too many requests for this key; retry in {math.ceil(wait)} s"},
                         [(b"retry-after", str(math.ceil(wait)).encode())])
            return
        await self.app(scope, receive, send)


async def _reply(send: Send, status: int, body: dict[str, str], headers: list[tuple[bytes, bytes]]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})
