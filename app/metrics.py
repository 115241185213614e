"""Prometheus metrics (prometheus_client) and the ASGI middleware that records each request.

The middleware is plain ASGI (not BaseHTTPMiddleware) so the MCP and Slack streams pass through
untouched; it labels requests by route template, never by raw path, and writes the one JSON access
line per request (`dsqa.access`, formatted by `app.logs`).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

access_log = logging.getLogger("dsqa.access")

# Module-level: one set per process, shared by every app the process creates (tests make several).
REQUESTS = Counter("dsqa_http_requests_total", "HTTP requests by route template and status.", ["route", "method", "status"])
LATENCY = Histogram(
    "dsqa_http_request_duration_seconds", "HTTP request latency by route template.", ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
INDEX_CHUNKS = Gauge("dsqa_index_chunks", "Chunks in the loaded index (0 when none is loaded).")
RUNNER_RESULTS = Counter("dsqa_runner_results_total", "Snippet runs by result status (incremented by the runner).", ["status"])
RUNNER_STATUSES = ("passed", "failed", "timeout", "killed", "skipped")  # eval/runner.py's RunResult statuses
for _status in RUNNER_STATUSES:
    RUNNER_RESULTS.labels(status=_status)  # export the series at 0 before the first run


def record_runner_result(status: str) -> None:
    """What the runner calls once per executed snippet; an unknown status counts as `other`."""
    RUNNER_RESULTS.labels(status=status if status in RUNNER_STATUSES else "other").inc()


VERIFY_DONE = Gauge("dsqa_verify_snippets_done", "Snippets the background verify run has finished.")
VERIFY_TOTAL = Gauge("dsqa_verify_snippets_total", "Snippets the background verify run will run.")


def set_verify_progress(done: int, total: int) -> None:
    VERIFY_DONE.set(done)
    VERIFY_TOTAL.set(total)


def set_index_chunks(n: int) -> None:
    INDEX_CHUNKS.set(n)


def route_of(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return str(path) if path else "unmatched"


class RequestObserver:
    """Counts, times and logs every HTTP request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            elapsed = time.perf_counter() - start
            route = route_of(scope)
            REQUESTS.labels(route=route, method=scope.get("method", ""), status=str(status)).inc()
            LATENCY.labels(route=route).observe(elapsed)
            extra: dict[str, Any] = {
                "route": route, "method": scope.get("method", ""), "path": scope.get("path", ""),
                "status": status, "duration_ms": round(elapsed * 1000, 2),
            }
            access_log.info("%s %s %s", extra["method"], route, status, extra={"fields": extra})


def mount_metrics(app: FastAPI) -> None:
    app.add_middleware(RequestObserver)

    @app.get("/metrics", tags=["operations"], include_in_schema=False)
    async def metrics(request: Request) -> Response:
        verifier = getattr(request.app.state, "verifier", None)  # app/background_verify.py, under `dsqa up`
        if verifier is not None:
            progress = verifier.progress()
            set_verify_progress(int(progress.get("done", 0)), int(progress.get("total", 0)))
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
