"""The MCP tools at `/mcp` of the HTTP service, built on the first request to them.

The MCP SDK and what it pulls in (its types, the client, opentelemetry, rich, pygments) cost each
worker process ~20 MB of memory that a server answering only `/ask` never needs (measured: two
workers' PSS 536 -> 490 MB). So the route is there from the start, and its first request builds the
server (`app/mcp_server.py`, ~0.6 s) and starts the SDK's session manager in a task of its own, which
the service's shutdown stops. The transport is stateless: any worker answers any request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.routing import Route

from app.settings import Settings

if TYPE_CHECKING:
    from app.engine import Engine

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"


class LazyMcp:
    """An ASGI app for `/mcp` that builds the MCP server on its first request."""

    def __init__(self, settings: Settings, get_engine: Callable[[], Engine]) -> None:
        self.settings = settings
        self.get_engine = get_engine
        self._http: Any = None  # the SDK's Starlette app, once built
        self._ready: asyncio.Event | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self._start()
        if self._error is not None:  # said to the client, the traceback in the log once
            reply = JSONResponse({"error": "unavailable", "message": f"the MCP server could not start: {type(self._error).__name__}"},
                                 status_code=503)
            await reply(scope, receive, send)
            return
        await self._http(scope, receive, send)

    async def _start(self) -> None:
        if self._ready is None:  # the first request: no await before this point, so only one builds
            self._ready = asyncio.Event()
            self._task = asyncio.create_task(self._serve(), name="mcp-session-manager")
        await self._ready.wait()

    async def _serve(self) -> None:
        assert self._ready is not None
        try:
            from app.mcp_server import build_mcp_server

            server = build_mcp_server(self.get_engine, self.settings)
            self._http = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True, host=self.settings.host)
            async with server.session_manager.run():  # entered and left in this one task
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # an import or start failure: every request says so (a 500 in the log)
            self._error = exc
            log.exception("dsqa MCP: the server could not start")
        finally:
            self._ready.set()

    async def aclose(self) -> None:
        """Stop the session manager, if a request started it (the service's shutdown)."""
        self._stop.set()
        if self._task is not None:
            await self._task


def mount_mcp(app: FastAPI, settings: Settings, get_engine: Callable[[], Engine]) -> LazyMcp:
    """Streamable HTTP at `/mcp`; the caller awaits `aclose()` at shutdown."""
    lazy = LazyMcp(settings, get_engine)
    app.router.routes.append(Route(MCP_PATH, endpoint=lazy))
    return lazy
