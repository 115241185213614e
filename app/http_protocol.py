"""uvicorn's httptools protocol with a deadline for a request's headers (slow-header, "slowloris", clients).

uvicorn times out idle keep-alive connections, but not a connection that never finishes its request
line and headers: a few hundred clients sending a byte every few seconds would hold every slot. Here
a connection gets `header_timeout_s` from when it opens (or from when a kept-alive connection starts
its next request) to deliver complete headers; past it, a 408 reply and the connection is closed.

httptools (llhttp, in C) rather than h11 (pure Python), on uvloop where it is installed: under h11 the
12 kB reply's framing was a quarter of the event loop's work per question (py-spy); with one client
over the real index, /ask p50 was 0.35 ms lower (two runs each, within the ±0.4 ms that runs of the
same code vary by on 2 cores).
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

TIMEOUT_REPLY = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: 78\r\n\r\n"
    b'{"error":{"code":"request_timeout","message":"request headers took too long."}}'
)


class HeaderDeadlineProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0

    _header_timer: asyncio.TimerHandle | None = None
    _awaiting_headers = False  # a request (or the connection) has begun and its headers are not all in

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._awaiting_headers = True
        self._arm()

    def on_message_begin(self) -> None:  # the first byte of a request, on a new or a kept-alive connection
        super().on_message_begin()
        self._awaiting_headers = True
        self._arm()

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self._awaiting_headers and not self.transport.is_closing():
            self.transport.write(TIMEOUT_REPLY)
            self.transport.close()


EVENT_LOOP = "auto"  # uvloop where installed (Linux, as the images are), else asyncio's own


def header_deadline_protocol(timeout_s: float) -> type[HeaderDeadlineProtocol]:
    """The protocol class uvicorn is given (`http=`), with this deadline."""
    return type("HeaderDeadlineProtocol", (HeaderDeadlineProtocol,), {"header_timeout_s": timeout_s})


def server_config(app: Any, *, host: str, port: int, header_timeout_s: float, log_level: str = "info",
                  access_log: bool = True) -> uvicorn.Config:
    """The one uvicorn configuration the service (and its integration tests) run with."""
    return uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log,
                          http=header_deadline_protocol(header_timeout_s), loop=EVENT_LOOP)
