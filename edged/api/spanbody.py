"""A span of recordings joined as it is sent: `recording.concat.concatenate_into` runs in a
thread of its own and hands the fragmented MP4 it makes to the connection in CHUNK pieces,
at most SLOTS of them waiting (a client that reads slowly pauses the remux, nothing piles
up). A client that goes away stops it; a remux that fails ends the answer without its
chunked end, so the client knows it is cut short."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from edged.recording.concat import concatenate_into

logger = logging.getLogger(__name__)

CHUNK = 256 * 1024  # bytes handed over at a time
SLOTS = 8  # pieces waiting for the client at most


class _Stopped(Exception):
    """The client went away: the remux stops."""


class SpanBody:
    def __init__(self, parts: Sequence[Path]) -> None:
        self.parts = list(parts)
        self.packets = 0
        self._slots = threading.Semaphore(SLOTS)
        self._stop = threading.Event()
        self._buffer = bytearray()
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="span-export", daemon=True)
        self._thread.start()
        while True:
            piece = await self._queue.get()
            self._slots.release()
            if piece is None:
                return
            if isinstance(piece, BaseException):
                raise piece
            yield piece

    async def aclose(self) -> None:
        self._stop.set()
        for _ in range(SLOTS):  # a producer waiting for a slot wakes and sees the stop
            self._slots.release()
        thread = self._thread
        if thread is not None:
            await asyncio.to_thread(thread.join, 10.0)

    # -- the remux's thread ----------------------------------------------------------------
    def write(self, data: bytes) -> int:
        self._buffer += data
        if len(self._buffer) >= CHUNK:
            self._hand(bytes(self._buffer))
            self._buffer.clear()
        return len(data)

    def _run(self) -> None:
        try:
            self.packets = concatenate_into(self.parts, self)
            if self._buffer:
                self._hand(bytes(self._buffer))
            self._hand(None)
        except _Stopped:
            pass
        except Exception as exc:  # PyAV, a file deleted under us: the answer is cut short
            logger.warning("span export of %d segments failed: %s", len(self.parts), exc)
            try:
                self._hand(exc)
            except _Stopped:
                pass

    def _hand(self, piece: bytes | BaseException | None) -> None:
        while not self._slots.acquire(timeout=1.0):
            if self._stop.is_set():
                raise _Stopped
        if self._stop.is_set():
            raise _Stopped
        loop = self._loop
        assert loop is not None
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, piece)
        except RuntimeError as exc:  # the loop closed (the daemon stopped)
            raise _Stopped from exc
