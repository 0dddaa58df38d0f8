"""edged's HTTP/1.1 server for the socket API: httptools' parser (llhttp, what uvicorn runs on)
under an `asyncio.Protocol`, with the API's bounds built in rather than wrapped around a
framework: aiohttp's objects, router and middleware cost ~80 µs of server CPU a request
against this server's ~29 (`docs/decisions/021-own-http-stack.md`).

What a connection gets:
- at most `max_connections` open at once (more are closed as they arrive);
- its request headers within `header_timeout_s` of the connection, or of a kept-alive
  request's first byte, within the bounds of `edged.api.http.framing` (431; a chunked body's
  framing and chunk count too);
- keep-alive (HTTP/1.1 default; 1.0 with `Connection: keep-alive`), closed after
  `keepalive_s` idle; pipelined requests answered in order, at most MAX_QUEUED parsed ahead;
- a body read as it arrives (`Body`), reading paused while BODY_BUFFER_BYTES wait unread;
- malformed requests answered `{"error": ..., "code": "http"}` (400) and the connection
  closed; an answer sent before its request's body has all come closes the connection once the
  rest is read and dropped (for at most `linger_s`), so the client still reads the answer.
Handlers never see a transport: a `Request` in, a `Response` out (`edged.api.http.messages`),
one without end sent by `edged.api.http.streaming`; routes are `edged.api.http.routing`."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httptools

from edged.api.http.framing import MAX_HEAD_BYTES, MessageLimits
from edged.api.http.heads import answer_head, http_date
from edged.api.http.messages import (
    BODY_BUFFER_BYTES,
    Body,
    BrokenBody,
    Handler,
    Headers,
    HttpError,
    Request,
    Response,
    error_response,
)
from edged.api.http.replays import Replays
from edged.api.http.streaming import send_stream
from edged.api.http.timing import Timing

logger = logging.getLogger(__name__)

FEED_BYTES = 64 * 1024  # a read is parsed in slices this large, so that a pause takes hold
# ... and in slices this large outside a body (heads, pipelined requests): a slice is parsed
# whole, so this bounds how many requests can queue past MAX_QUEUED (~130 of the smallest).
PIPELINED_FEED_BYTES = 4 * 1024
MAX_QUEUED = 8  # pipelined requests parsed ahead of their turn before reading pauses
LINGER_S = 2.0


class HttpServer:
    """Listening sockets and their connections, serving `handle` (which answers every request
    with a Response: it turns its own failures into answers)."""

    def __init__(self, handle: Handler, *, max_connections: int, header_timeout_s: float,
                 keepalive_s: float, body_timeout_s: float, max_header_fields: int = 100,
                 max_header_line_bytes: int = 8192, linger_s: float = LINGER_S) -> None:
        self.handle = handle
        self.max_connections = max_connections
        self.head_bounds = (max_header_fields, max_header_line_bytes)  # MessageLimits'
        self.header_timeout_s = header_timeout_s
        self.keepalive_s = keepalive_s
        self.body_timeout_s = body_timeout_s
        self.linger_s = linger_s  # how long the rest of an answered request is read and dropped
        self.connections: set[_Connection] = set()
        self.refused = 0  # over the cap
        self.timed_out = 0  # no complete request headers in time
        # Requests whose handlers have started and not yet answered. A handler is started as
        # its headers are parsed, and every read of a turn of the loop is parsed before any
        # handler runs: so a handler that sees 1 here arrived alone.
        self.handling = 0
        self.closing = False
        self._servers: list[asyncio.AbstractServer] = []

    @property
    def live(self) -> int:
        return len(self.connections)

    async def listen(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_server(lambda: _Connection(self), sock=sock))

    async def stop_accepting(self) -> None:
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting; answer what is in flight (within `timeout_s`), then close all."""
        self.closing = True
        await self.stop_accepting()
        for connection in list(self.connections):
            if not connection.busy:
                connection.close()
        # A connection leaves once its last answer has been sent (closing waits for the
        # transport to drain): answers still being written are not cut off.
        deadline = time.monotonic() + timeout_s
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            connection.abort()


class _Connection(asyncio.Protocol, Replays, Timing):
    """One connection: parses requests, queues them, answers them in order.

    One timer at a time bounds what the client owes: its request's head (`header_timeout_s`,
    from the connection or the head's first byte, while no answer is pending), taking an
    answer (`send_timeout_s` while writing waits on it), the rest of a body being dropped
    (`linger_s`) or the next request on an idle kept-alive connection (`keepalive_s`)."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: Any = None  # asyncio's or uvloop's stream transport
        self.sock: Any = None
        self.is_unix = True
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()  # parsed (headers complete), not yet answered
        self.parsing: Request | None = None  # headers complete, body still coming
        # The one timer's bound (edged.api.http.timing): set here, as the hot path reads them.
        self.timing = ""
        self.due: float | None = None
        self.then: Callable[[], None] = self.close
        self.timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.paused = False
        self.buffered = 0  # body bytes parsed and not yet read, all requests together
        self.unparsed: bytes | memoryview = b""  # the rest of a read, while reading is paused
        self.write_paused: asyncio.Future[None] | None = None
        self.failed: HttpError | None = None  # a malformed request: answered, then closed
        self.answered = False  # the malformed request has had its answer
        self.lingering = False  # answered before its body came: drop the rest, then close
        self.done_reading = False  # closed, lingered out, or the client said it would send no more
        self.eof = False  # the client has half-closed: answer what it sent, then close
        self.in_head = False  # a request's head has begun and not ended
        self._url: list[bytes] = []
        self._headers = Headers()
        self.limits = MessageLimits(*server.head_bounds)
        self._fed = 0  # bytes fed to the parser since the last message ended
        self._body_left = 0  # of a Content-Length body being parsed (0 if chunked)
        self._body_fed = 0  # of which body
        # The last answer's head: what it said (status, type, length, keep-alive, 1.0, Date),
        # its headers, its bytes.
        self._head: tuple[tuple[object, ...], dict[str, str] | None, bytes] | None = None

    @property
    def busy(self) -> bool:
        return bool(self.queue)

    # -- asyncio.Protocol ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        server = self.server
        if len(server.connections) >= server.max_connections:
            server.refused += 1
            if server.refused == 1 or server.refused % 1000 == 0:
                logger.warning("API: %d connections are open (api.max_connections); refused "
                               "%d so far", len(server.connections), server.refused)
            transport.abort()  # type: ignore[attr-defined]  # a stream's (uvloop's too)
            return
        server.connections.add(self)
        self.transport = transport
        self.sock = transport.get_extra_info("socket")
        self.is_unix = self.sock is None or self.sock.family == socket.AF_UNIX
        self._arm(server.header_timeout_s, self._too_slow, "head")

    def data_received(self, data: bytes) -> None:
        if self.failed is not None or self.done_reading:
            return  # not parsed: dropped (a failed request's lingering, a closing connection)
        if (self.replay is None and self._told is None) or (data := self._replay(data)):
            self._feed(data)  # parsed (`edged.api.http.replays`: unless replayed, or held)

    def _parse(self) -> None:
        """Feed what was read to the parser in slices, stopping where reading pauses (the
        rest waits in `unparsed`). What a message holds besides its body (request line,
        headers, chunk framing, trailers) is bounded (`MessageLimits.check`) slice by slice:
        httptools gathers a header line in memory until it ends, however long."""
        data, pos = memoryview(self.unparsed), 0
        try:
            while pos < len(data) and not self.paused and self.failed is None \
                    and not self.done_reading:
                if self._fed - self._body_fed > MAX_HEAD_BYTES:
                    self.limits.check(self._fed - self._body_fed, self.in_head)
                # Large slices only for what is left of a body of known length: no slice then
                # holds more than a small one's worth of requests after it.
                size = PIPELINED_FEED_BYTES if self.parsing is None else \
                    max(PIPELINED_FEED_BYTES, min(FEED_BYTES, self._body_left))
                piece = data[pos:pos + size]
                self._fed += len(piece)
                self.parser.feed_data(piece)
                pos += len(piece)
        except HttpError as exc:
            self._fail(exc)
        except httptools.HttpParserUpgrade:
            self._fail(HttpError(400, "protocol upgrades are not supported"))
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__cause__ or exc.__context__
            self._fail(cause if isinstance(cause, HttpError) else HttpError(400, str(exc)))
        except httptools.HttpParserError as exc:
            if not self.done_reading:  # else: bytes after a `Connection: close` request
                self._fail(HttpError(400, str(exc)))
        self.unparsed = data[pos:] if pos < len(data) and self.failed is None else b""

    def eof_received(self) -> bool | None:
        if self.parsing is not None:
            self.parsing.content.set_exception(ConnectionResetError("the client stopped "
                                                                    "sending mid-body"))
        self.eof = True
        self.done_reading = True
        return True if self.queue else None  # answer what was asked, then close

    def pause_writing(self) -> None:
        if self.write_paused is None:
            self.write_paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        waiter, self.write_paused = self.write_paused, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return  # refused at the cap
        self.server.connections.discard(self)
        self._drop_timer()
        self.done_reading = True
        for request in self.queue:
            request.content.set_exception(ConnectionResetError("the client hung up"))
        self.resume_writing()
        self.transport = None

    # -- httptools callbacks -------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._url.clear()
        self.limits.begin()
        self._headers = Headers()
        self.in_head = True
        if not self.queue and self.timing != "head":  # idle: keep-alive gives way
            self._arm(self.server.header_timeout_s, self._too_slow, "head")

    def on_url(self, url: bytes) -> None:
        self.limits.url(len(url))
        self._url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.limits.field(name, value)
        self._headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.timing == "head":
            self._disarm()
        parser = self.parser
        if parser.should_upgrade():
            raise HttpError(400, "protocol upgrades are not supported")
        url = httptools.parse_url(b"".join(self._url))
        version = parser.get_http_version()
        expect = self._headers.get("expect", "").lower() == "100-continue" and version == "1.1"
        request = Request(parser.get_method().decode("ascii"), url.path.decode("latin-1"),
                          (url.query or b"").decode("latin-1"), self._headers, version,
                          parser.should_keep_alive(), Body(self, expect), self.sock,
                          self.is_unix, self.server.body_timeout_s)
        self.parsing = request
        self._body_left = request.content_length or 0
        self.queue.append(request)
        if len(self.queue) == 1:
            self._start(request)
        elif len(self.queue) > MAX_QUEUED:
            self.flow()

    def on_chunk_header(self) -> None:
        self.limits.chunk()

    def on_body(self, body: bytes) -> None:
        self._body_fed += len(body)
        self._body_left -= len(body)
        request = self.parsing
        if request is not None and not self.lingering:
            request.content.feed(body)

    def on_message_complete(self) -> None:
        self._fed = self._body_fed = 0
        request, self.parsing = self.parsing, None
        if request is None:
            return
        request.complete = True
        request.content.finish()
        if self.lingering:
            self.close()
        elif not request.keep_alive:
            self.done_reading = True  # nothing after it is a request: not even parsed

    # -- serving -------------------------------------------------------------------------
    def _start(self, request: Request) -> None:
        self.server.handling += 1
        self.loop().create_task(self._serve(request))

    def interim_continue(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    async def _serve(self, request: Request) -> None:
        try:
            response = await self.server.handle(request)
        except Exception:  # `handle` answers its own failures: this is a bug, not the client's
            logger.exception("%s %s failed", request.method, request.path)
            response = error_response(500, "internal error", "internal")
            response.close = True
        finally:
            self.server.handling -= 1
        try:
            await self._answer(request, response)
        except BaseException:  # a bug past the handler: the connection cannot go on in order
            logger.exception("%s %s: answering failed", request.method, request.path)
            self.abort()
            raise

    async def _answer(self, request: Request, response: Response) -> None:
        if response.stream is not None:  # an answer without end (live.mjpeg), then closed
            return await send_stream(self, request, response)
        transport = self.transport
        if transport is None or transport.is_closing():
            logger.info("%s %s: the client hung up before its answer", request.method,
                        request.path)
            return
        keep = (request.keep_alive and not response.close and not self.server.closing
                and self.failed is None and not self.eof)
        # Answered before all of its body came: the rest is read and dropped before closing,
        # or the client, still sending, may never read the answer.
        linger = not request.complete and not response.close and self.failed is None \
            and not self.done_reading
        self._write(request, response, keep and not linger)
        if self.write_paused is not None:  # the client reads slowly: answer no more meanwhile
            self._arm(self.server.body_timeout_s, self._too_slow, "send")
            await self.write_paused
            if self.timing == "send":
                self._disarm()
        self.queue.popleft()
        if self.transport is None:
            return  # lost while the answer went out: nothing more to serve here
        if linger:
            request.content.drop()
            self.lingering = True
            self._arm(self.server.linger_s, self.close, "linger")
        elif not keep:
            self._finish_failed()
        elif self.queue:
            self.flow()
            self._start(self.queue[0])
        else:
            self.flow()
            if self.in_head:  # the next request's head has begun: it is owed in time
                self._arm(self.server.header_timeout_s, self._too_slow, "head")
            else:
                self._arm(self.server.keepalive_s, self.close, "idle")

    def _write(self, request: Request, response: Response, keep: bool) -> None:
        body = response.body
        length = len(body) if response.parts is None else response.length
        headers = response.headers
        # The head as the last answer's on this connection when it says the same (a client's
        # loop asks the same thing again): the same status, type, length, headers, keep-alive
        # and Date (formatted once a second) make the same bytes.
        key = (response.status, response.content_type, length, keep,
               keep and request.version == "1.0", http_date())
        last = self._head
        if last is not None and last[0] == key and last[1] == headers:
            data = last[2]
        else:
            data = answer_head(response, length, keep, request.version, key[5])
            self._head = (key, dict(headers) if headers else headers, data)
        if request.method == "HEAD":
            self.transport.write(data)
        elif response.parts is None:
            self.transport.write(data + body)
        else:
            self.transport.writelines([data, *response.parts])

    def _fail(self, error: HttpError) -> None:
        """A malformed request: nothing more is read. One whose handler runs (a broken chunk
        in its body) is answered by it; one that never became a request is answered here, once
        those before it are."""
        self.failed = error
        if self.timing == "head":
            self._disarm()
        if self.parsing is not None:  # its handler waits for the rest of its body
            self.parsing.content.set_exception(BrokenBody(str(error)))
            self.parsing = None
            self.answered = True
        if not self.queue:
            self._finish_failed()

    def _finish_failed(self) -> None:
        """Close, after answering a malformed request that no handler answered."""
        error = self.failed
        if error is not None and not self.answered and self.transport is not None \
                and not self.transport.is_closing():
            if error.status >= 500:
                logger.error("API: a request failed before its handler: %s", error)
            else:
                logger.info("API: refused a malformed request: %s", error)
            text = " ".join(str(error).split())
            self._write(_NO_REQUEST, error_response(error.status, text), keep=False)
            self.answered = True
            # What the client is still sending is read and dropped for a while (it is not
            # parsed: `failed`): closing on unread bytes resets the connection, and the client
            # might never read the answer.
            self.done_reading = False
            if self.paused:
                self.paused = False
                self.transport.resume_reading()
            self._arm(self.server.linger_s, self.close, "linger")
            return
        self.close()

    def flow(self) -> None:
        """Pause reading while too much waits unread (body bytes, pipelined requests); on
        resuming, parse what the last read left."""
        if self.transport is None:
            return
        waiting = self.buffered > BODY_BUFFER_BYTES or len(self.queue) > MAX_QUEUED
        if waiting and not self.paused:
            self.transport.pause_reading()
            self.paused = True
        elif not waiting and self.paused:
            self.paused = False
            if not self.done_reading:
                self.transport.resume_reading()
            if self.unparsed:
                asyncio.get_running_loop().call_soon(self._parse)

    def _too_slow(self) -> None:
        self.server.timed_out += 1
        self.abort()

    def close(self) -> None:
        """Close once what is written has gone; a client that will not take it is cut off
        after the send timeout."""
        self._disarm()
        self.done_reading = True
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()
            if transport.get_write_buffer_size():
                self._arm(self.server.body_timeout_s, self._too_slow, "send")

    def abort(self) -> None:
        self._disarm()
        self.done_reading = True
        if self.transport is not None:
            self.transport.abort()


# Stands for the request a malformed one could not become, when its error is written.
_NO_REQUEST: Any = SimpleNamespace(method="POST", version="1.1")
