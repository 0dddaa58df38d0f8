"""Bounds on the connections the API keeps open, which aiohttp does not set: at most
`max_connections` at once (more are closed as they arrive, so idle or half-sent connections
cannot use up the process's file descriptors, `LimitNOFILE` in the unit), and a first
request's headers within `header_timeout_s` (a connection that sends nothing, or trickles
its headers, is closed). Each listening socket is served through a guard that sits between
asyncio's transport and aiohttp's protocol.

A request aiohttp refuses before any handler sees it (a malformed request line or header, both
`Transfer-Encoding: chunked` and `Content-Length`) is answered with the same `{"error": ...}`
body as every other error, not aiohttp's plain text."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

logger = logging.getLogger(__name__)

HEADERS_END = b"\r\n\r\n"


class ConnectionGuard:
    def __init__(self, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.live = 0
        self.refused = 0  # over the cap
        self.timed_out = 0  # no complete first request headers in time

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Guarded(_json_errors(factory()), self)


class _JsonErrors(RequestHandler):
    """aiohttp's handler for one connection, its own error answers in the API's JSON."""

    __slots__ = ()

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: an answer is under way already
            raise ConnectionError("a response is being sent: no error answer can follow")
        if status >= 500:
            logger.error("API: a request failed before its handler", exc_info=exc)
            text = "internal error"
        else:  # the client's fault (a malformed request): no traceback for it
            text = " ".join((message or str(exc or "bad request")).split())
            logger.info("API: refused a malformed request: %s", text)
        response = web.json_response({"error": text, "code": "http"}, status=status)
        response.force_close()
        return response


def _json_errors(protocol: asyncio.Protocol) -> asyncio.Protocol:
    """aiohttp makes its RequestHandler itself and has no hook for the class: it becomes the
    subclass (which adds no state) in place."""
    if type(protocol) is RequestHandler:
        protocol.__class__ = _JsonErrors
    return protocol


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, counted, with a deadline for its first headers.
    Everything else passes through unchanged."""

    def __init__(self, inner: asyncio.Protocol, guard: ConnectionGuard) -> None:
        self.inner = inner
        self.guard = guard
        # asyncio's or uvloop's stream transport (uvloop's are not asyncio.Transport subclasses)
        self.transport: Any = None
        self.timer: asyncio.TimerHandle | None = None
        self.tail = b""  # the last bytes seen while waiting for the end of the headers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self.guard
        if guard.live >= guard.max_connections:
            guard.refused += 1
            if guard.refused == 1 or guard.refused % 1000 == 0:
                logger.warning("API: %d connections are open (api.max_connections); refused "
                               "%d so far", guard.live, guard.refused)
            transport.abort()  # type: ignore[attr-defined]  # a stream's (uvloop's too)
            return
        guard.live += 1
        self.transport = transport
        self.timer = asyncio.get_running_loop().call_later(guard.header_timeout_s,
                                                           self._too_slow)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self.timer is not None:
            seen = self.tail + data[:64 * 1024]
            if HEADERS_END in seen:
                self.timer.cancel()
                self.timer = None
                self.tail = b""
            else:
                self.tail = seen[-3:]
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return  # refused: aiohttp never saw it
        self.guard.live -= 1
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.inner.connection_lost(exc)

    def _too_slow(self) -> None:
        self.timer = None
        self.guard.timed_out += 1
        if self.transport is not None:
            self.transport.abort()


class GuardedSite(web.SockSite):
    """aiohttp's SockSite, serving its socket through a ConnectionGuard. (Its start is
    SockSite's with the protocol factory wrapped; aiohttp offers no hook for that.)"""

    def __init__(self, runner: web.BaseRunner, sock: socket.socket,
                 guard: ConnectionGuard) -> None:
        super().__init__(runner, sock)
        self.guard = guard

    async def start(self) -> None:
        await web.BaseSite.start(self)
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            self.guard.wrap(server), sock=self._sock, backlog=self._backlog)
