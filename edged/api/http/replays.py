"""Replays on a connection: a request that repeats, byte for byte but for its last bytes (a
tensor's), one its handler left a `Replayer` on (`Request.replay`) is handed to that Replayer
as it is read, without being parsed, while the connection has nothing else in hand (its
answer then keeps its place in the connection's order). What the usual path would work out
again from the same bytes on the same connection (the head's bounds and meaning, the route,
the peer) came to the same answer the first time; what can change between requests the
Replayer checks itself, or declines and the bytes are parsed as any other request's.

`_Connection` (edged.api.http.connection) mixes this in and hands every read to `_replay`
first (when there is something to replay) and then to `_feed`, which parses it and tells the
bytes of a request that came alone, to be learned once it is answered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from edged.api.http.messages import HttpError, Request, Response, error_response

logger = logging.getLogger(__name__)

# The largest request whose bytes are told (and may be replayed), and how long the first
# reads of one that may repeat a replayable request wait for the rest before they are parsed.
MAX_REPLAY_BYTES = 256 * 1024
HOLD_S = 0.05
HEAD_BYTES = 4096  # an answer's status line and headers, at most (a margin)
_END_OF_HEAD = b"\r\n\r\n"


class Replays:
    """The replay side of a connection (see the module)."""

    # The last answered request its handler left a Replayer on: the bytes it began with (all
    # but the Replayer's tail), its length, the request.
    replay: tuple[bytes, int, Request] | None = None
    _told: Request | None = None  # the last request that came alone, until it is answered
    _told_reads: Sequence[bytes] = ()  # its bytes, as read
    # Reads that may become a repeat of the replayable request, and their bytes.
    _held: list[bytes] | tuple[()] = ()
    _held_bytes = 0
    _reads: list[bytes] | None = None  # of the message being parsed, while it came alone
    _read_bytes = 0  # in _reads

    # The connection's own, used here.
    queue: Any
    parsing: Request | None
    unparsed: bytes | memoryview
    paused: bool
    write_paused: asyncio.Future[None] | None
    failed: HttpError | None
    eof: bool
    done_reading: bool
    timing: str
    transport: Any
    server: Any
    _fed: int
    _arm: Callable[[float, Callable[[], None], str], None]
    loop: Callable[[], asyncio.AbstractEventLoop]
    _write: Callable[[Request, Response, bool], None]
    close: Callable[[], None]
    _parse: Callable[[], None]
    _answer: Callable[[Request, Response], Coroutine[Any, Any, None]]

    def _replay(self, data: bytes) -> bytes:
        """Offer a read: held while it (with what was held) may still become the whole of a
        repeat of the replayable request (bounded by HOLD_S, then parsed as any other),
        handed to the Replayer once it is. Returns what is to be parsed (b"": nothing)."""
        held = self._held
        if not held and not self._idle():
            return data
        if self._told is not None:
            self._learn(self._told, self._told_reads)
        if self.replay is None:
            return data
        prefix, length, request = self.replay
        start = self._held_bytes
        end = start + len(data)
        matches = data.startswith(prefix) if end == length and not start else \
            _goes_on(prefix, length, start, data)  # all of it in one read, or in pieces
        if matches and end < length:
            if not held:
                held = self._held = []
            held.append(data)
            self._held_bytes = end
            if self.timing != "hold":
                self._arm(HOLD_S, self._unhold, "hold")
            return b""
        if held:
            data = b"".join([*held, data])
            self._held, self._held_bytes = (), 0
        if not matches:
            return data
        assert request.replay is not None  # what is learned has one
        answer = request.replay(data)
        if answer is None:
            return data
        if isinstance(answer, Response) and self._fits(answer):
            # Written now, as _answer writes it: the transport takes it without pausing, so
            # nothing is left to wait for but the next request.
            self._write(request, answer, True)
            self._arm(self.server.keepalive_s, self.close, "idle")
            return b""
        self.queue.append(request)  # in hand until answered: what is read waits
        if isinstance(answer, Response):
            task = self._answer(request, answer)
        else:
            self.server.handling += 1
            task = self._answer_later(request, answer)
        self.loop().create_task(task)
        return b""

    async def _answer_later(self, request: Request, answer: Awaitable[Response]) -> None:
        """A replayed request the Replayer answers later (counted as a handler until then)."""
        try:
            response = await answer
        except Exception:  # the Replayer answers its own failures: this is a bug
            logger.exception("%s %s: replaying it failed", request.method, request.path)
            response = error_response(500, "internal error", "internal")
            response.close = True
        finally:
            self.server.handling -= 1
        await self._answer(request, response)

    def _fits(self, response: Response) -> bool:
        """Whether writing `response` (it keeps the connection open) cannot make the
        transport pause writing: what it holds and the answer stay under its high-water
        mark (the head takes at most HEAD_BYTES)."""
        transport = self.transport
        return not response.close and transport.get_write_buffer_size() + response.length \
            + HEAD_BYTES <= transport.get_write_buffer_limits()[1]

    def _learn(self, told: Request, reads: Sequence[bytes]) -> None:
        """The request told whole has been answered (nothing is in hand): its repeats may be
        replayed if its handler left a Replayer on it (on a 200 answer), its bytes are one
        head and its Content-Length body (not several requests one answered early), and its
        client sends its body without waiting for a 100 Continue."""
        self._told, self._told_reads = None, ()
        replayer, length = told.replay, told.content_length
        if replayer is None or length is None or "expect" in told.headers:
            return
        raw = b"".join(reads)
        if raw.find(_END_OF_HEAD) == len(raw) - length - len(_END_OF_HEAD):
            self.replay = (raw[:len(raw) - replayer.tail], len(raw), told)

    def _idle(self) -> bool:
        """Nothing in hand: no request queued, parsed in part or left unparsed, no answer
        waiting to be taken, nothing said of the end."""
        return not (self.queue or self.parsing is not None or self.unparsed or self._fed
                    or self.paused or self.write_paused is not None or self.eof
                    or self.server.closing)

    def _unhold(self) -> None:
        """The rest of a request that began as a replay's did not come in time: parse what
        came as any other request's (its own bounds apply from here)."""
        held, self._held, self._held_bytes = self._held, (), 0
        if held and self.transport is not None and not self.done_reading:
            self._feed(b"".join(held))

    def _feed(self, data: bytes) -> None:
        """Parse a read; a request that came alone (its reads began with nothing in hand and
        ended where it did) is told, with its bytes, to be learned once answered."""
        reads = self._reads
        if not self.unparsed and not self._fed and not self.queue:  # one begins here
            reads = self._reads = [data]
            self._read_bytes = len(data)
        elif reads is not None:
            reads.append(data)
            self._read_bytes += len(data)
        if self._read_bytes > MAX_REPLAY_BYTES:
            reads = self._reads = None
        self.unparsed = bytes(self.unparsed) + data if self.unparsed else data
        self._parse()
        if reads is None or self.parsing is not None or self._fed:
            return  # not alone, or not over yet
        self._reads = None
        queue = self.queue
        if not self.unparsed and self.failed is None and queue and queue[-1].complete:
            self._told, self._told_reads = queue[-1], reads


def _goes_on(prefix: bytes, length: int, start: int, data: bytes) -> bool:
    """Whether `data`, read after `start` bytes that matched, may still be part of a request
    of `length` bytes that begins with `prefix` (then any tail)."""
    if start + len(data) > length:
        return False
    if start >= len(prefix):
        return True  # the tail: any bytes
    if len(data) <= len(prefix) - start:
        return prefix.startswith(data, start)
    return data.startswith(prefix[start:])
