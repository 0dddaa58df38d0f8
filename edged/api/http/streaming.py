"""Answers without an end (`Response.stream`: the live MJPEG views): the head without a length
(`Connection: close`: the end of the connection ends the answer), then each part as the stream
gives it, until the client goes, the stream ends or the server stops. A client that stops
reading pauses the stream (nothing piles up in memory) and is cut off after the send timeout.
The stream is closed in every case, the client gone before its first part included, so what
it holds (a viewer's place) is given back.

An answer whose headers say `Transfer-Encoding: chunked` is sent in chunks, ended by the last
chunk only when its stream ended well: a stream that fails (raises) is cut short without it,
so the client knows it has not got the whole (a span export). One that gives
`Content-Length` is read to that length by the client."""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus
from typing import TYPE_CHECKING

from edged.api.http.heads import http_date
from edged.api.http.messages import Request, Response
from edged.core.errors import EdgedError

if TYPE_CHECKING:
    from edged.api.http.connection import _Connection

logger = logging.getLogger(__name__)

async def send_stream(connection: _Connection, request: Request, response: Response) -> None:
    stream = response.stream
    assert stream is not None
    server = connection.server
    try:
        transport = connection.transport
        if transport is None or transport.is_closing():
            return
        connection.done_reading = True  # nothing after it is served on this connection
        head = [f"HTTP/1.1 {response.status} {HTTPStatus(response.status).phrase}\r\n"
                f"Content-Type: {response.content_type}\r\nDate: {http_date()}\r\n"]
        head += [f"{k}: {v}\r\n" for k, v in (response.headers or {}).items()]
        transport.write("".join([*head, "Connection: close\r\n\r\n"]).encode("latin-1"))
        if request.method == "HEAD":
            return
        chunked = (response.headers or {}).get("Transfer-Encoding") == "chunked"
        try:
            async for part in stream:
                transport = connection.transport
                if transport is None or transport.is_closing() or server.closing:
                    return
                if chunked:
                    if not part:
                        continue  # (an empty chunk would end the answer)
                    transport.writelines([b"%x\r\n" % len(part), part, b"\r\n"])
                else:
                    transport.write(part)
                if connection.write_paused is not None:  # the client reads slowly
                    try:
                        await asyncio.wait_for(asyncio.shield(connection.write_paused),
                                               server.body_timeout_s)
                    except asyncio.TimeoutError:
                        server.timed_out += 1
                        connection.abort()
                        return
        except Exception as exc:  # the stream failed: the answer is cut short
            # a typed refusal says what it is; anything else is a bug or a library's error,
            # whose traceback is kept
            logger.warning("%s %s: the answer is cut short: %s", request.method, request.path,
                           exc, exc_info=not isinstance(exc, EdgedError))
            return
        transport = connection.transport
        if chunked and transport is not None and not transport.is_closing():
            transport.write(b"0\r\n\r\n")
    except asyncio.CancelledError:
        # The loop is closing (the daemon stopped) while the stream waited for its next frame,
        # its client gone: nothing is left to answer, and that is no failure.
        pass
    finally:
        try:
            await stream.aclose()
        finally:
            if connection.queue:
                connection.queue.popleft()
            connection.close()
