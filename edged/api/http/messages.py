"""What the API's HTTP layer (`edged.api.http.connection`) hands handlers and takes back: a
`Request` (headers lowercased, its `Body` as it arrives) and a `Response` (one buffer, or parts
written without joining them), and the errors the layer answers itself."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol
from urllib.parse import parse_qsl

# Body bytes a connection holds unread before reading pauses: outside the body budget (which
# charges a body once its handler reads it), so small; 512 connections hold 128 MiB at most.
BODY_BUFFER_BYTES = 256 * 1024
# A handler waiting for a body is woken when it has all come, or when this much waits: a
# 110 KB tensor arriving in a dozen reads woke its handler a dozen times (each a turn of the
# loop for the task).
WAKE_BYTES = BODY_BUFFER_BYTES // 2
# Pieces of a body smaller than this are joined as they come: a body sent in tiny chunks (a
# byte each) would otherwise be an object of ~35 bytes per byte of it, here and in its reader.
JOIN_SMALL_BYTES = 16 * 1024
JSON_TYPE = "application/json; charset=utf-8"


class Reader(Protocol):
    """The connection a body arrives on, as the body sees it."""

    buffered: int  # body bytes parsed and not yet read, all its requests together
    paused: bool

    def flow(self) -> None: ...

    def interim_continue(self) -> None: ...


class HttpError(Exception):
    """An answer the HTTP layer itself gives (404, 405, 413, 431, a malformed request)."""

    def __init__(self, status: int, message: str, allow: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.allow = allow


class BrokenBody(Exception):
    """The body cannot be read on: its framing is malformed (a bad chunk)."""


class Headers(dict[str, str]):
    """A request's headers, names lowercased; the first of repeated ones is kept."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)


class Body:
    """A request's body as it arrives: `readany()` gives the next bytes, b"" at its end."""

    __slots__ = ("_buffered", "_chunks", "_connection", "_continue", "_done", "_error",
                 "_waiter")

    def __init__(self, connection: Reader, expect_continue: bool = False) -> None:
        self._chunks: deque[bytes | bytearray] = deque()
        self._buffered = 0
        self._done = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._connection = connection
        # `Expect: 100-continue`: the interim answer goes out when the handler first waits
        # for the body, so a request refused before that (404, 413, 403) never gets it.
        self._continue = expect_continue

    @property
    def buffered(self) -> int:
        return self._buffered

    @property
    def connection_gone(self) -> bool:
        """The client hung up (a long answer may stop early): its connection is lost, or it
        sent its end (EOF). A client that only half-closes to wait for its answer looks the
        same as one that left; HTTP clients do not, and a generation should not run on for
        nobody."""
        connection = self._connection
        return getattr(connection, "transport", True) is None or getattr(connection, "eof",
                                                                         False) is True

    @property
    def ready(self) -> bool:
        """A read would not wait."""
        return bool(self._chunks) or self._done or self._error is not None

    def feed(self, data: bytes) -> None:
        chunks = self._chunks
        last = chunks[-1] if chunks else None
        if last is not None and len(data) < JOIN_SMALL_BYTES and len(last) < JOIN_SMALL_BYTES:
            if type(last) is bytes:  # a second small piece: the two become one, and so on
                last = chunks[-1] = bytearray(last)
            last += data
        else:
            chunks.append(data)
        self._buffered += len(data)
        self._connection.buffered += len(data)
        if self._buffered >= WAKE_BYTES:
            self._wake()
        if self._connection.buffered > BODY_BUFFER_BYTES:
            self._connection.flow()

    def finish(self) -> None:
        self._done = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        """Fail a read waiting for more, and every later one (a timeout, a lost connection)."""
        if self._error is None and not (self._done and not self._chunks):
            self._error = exc
            self._wake()

    def drop(self) -> None:
        """Nobody reads the rest: what is buffered goes, and what comes later."""
        self._chunks.clear()
        self._connection.buffered -= self._buffered
        self._buffered = 0
        self._connection.flow()

    def whole(self, length: int) -> bytes | bytearray | None:
        """The whole body, taken at once, when it has all come in one piece of `length` bytes
        and none of it was read (readany() would give it, then b""); else None."""
        chunks = self._chunks
        if not self._done or len(chunks) != 1 or len(chunks[0]) != length:
            return None
        chunk = chunks.popleft()
        self._buffered = 0
        connection = self._connection
        connection.buffered -= length
        if connection.paused:
            connection.flow()
        return chunk

    async def readany(self) -> bytes | bytearray:
        while True:
            if self._error is not None:
                raise self._error
            if self._chunks:
                chunk = self._chunks.popleft()
                self._buffered -= len(chunk)
                connection = self._connection
                connection.buffered -= len(chunk)
                if connection.paused:
                    connection.flow()
                return chunk
            if self._done:
                return b""
            if self._continue:
                self._continue = False
                self._connection.interim_continue()
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Request:
    __slots__ = (
        "body_timeout_s",
        "complete",
        "content",
        "content_length",
        "headers",
        "is_unix",
        "keep_alive",
        "match_info",
        "method",
        "path",
        "query_string",
        "replay",
        "sock",
        "version",
    )

    def __init__(self, method: str, path: str, query_string: str, headers: Headers,
                 version: str, keep_alive: bool, content: Body, sock: Any, is_unix: bool,
                 body_timeout_s: float) -> None:
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.version = version
        self.keep_alive = keep_alive
        self.content = content
        self.sock = sock  # the connection's socket (None where the transport has none)
        self.is_unix = is_unix  # a Unix socket's (or no socket: nothing on the network)
        self.body_timeout_s = body_timeout_s
        self.match_info: dict[str, str] = {}
        self.complete = False  # the whole message (its body too) has been parsed
        # Set by its handler: how a request that repeats this one may be answered at once.
        self.replay: Replayer | None = None
        length = headers.get("content-length")
        self.content_length = int(length) if length is not None else None  # llhttp: digits

    @property
    def content_type(self) -> str:
        """The media type alone, lowercased (as aiohttp: octet-stream when none is given)."""
        raw = self.headers.get("content-type")
        if not raw:
            return "application/octet-stream"
        return raw.split(";", 1)[0].strip().lower()

    @property
    def query(self) -> dict[str, str]:
        pairs = parse_qsl(self.query_string, keep_blank_values=True)
        return {k: v for k, v in reversed(pairs)}  # the first of repeated keys, as aiohttp


class Response:
    """An answer: one body, or `parts` written one after another without joining them, or a
    `stream` of parts without end (sent as they come; the connection closes after it)."""

    __slots__ = ("body", "close", "content_type", "headers", "parts", "status", "stream")

    def __init__(self, body: bytes | memoryview = b"", *, status: int = 200,
                 content_type: str = "application/octet-stream",
                 headers: dict[str, str] | None = None,
                 parts: list[bytes | memoryview] | None = None) -> None:
        self.status = status
        self.body = body
        self.parts = parts
        self.content_type = content_type
        self.headers = headers
        self.close = False  # close the connection once this is sent
        self.stream: Stream | None = None

    @property
    def length(self) -> int:
        if self.parts is None:
            return len(self.body)
        return sum(len(p) for p in self.parts)


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json.dumps(data).encode(), status=status, content_type=JSON_TYPE)


def error_response(status: int, message: str, code: str = "http") -> Response:
    return json_response({"error": message, "code": code}, status=status)


Handler = Callable[[Request], Awaitable[Response]]


class Stream(Protocol):
    """A streamed answer's parts. `aclose()` is always called once it is done with, whether
    it was read or not (the client may have gone before the first part)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    async def aclose(self) -> None: ...


class Replayer(Protocol):
    """What a handler leaves on a request (`Request.replay`) that a repeat of it may be
    answered by: a request on the same connection whose bytes are the same as that
    request's but for the last `tail` (a tensor's), read while the connection has nothing
    else in hand (`edged.api.http.replays`). It answers at once, or later (an awaitable,
    counted in `HttpServer.handling` until it gives the answer), or says None and the
    request is parsed and handled as any other (nothing done meanwhile)."""

    tail: int

    def __call__(self, data: bytes) -> Response | Awaitable[Response] | None: ...
