"""A file's bytes as an answer's body, read CHUNK at a time as the client takes them (the
connection pauses the reading while the client is slow): a 1 GB recording costs a chunk of
memory, not a GB. The file is opened by the handler before the answer starts, so a file
deleted meanwhile (the recording budget) is still read whole."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import BinaryIO

logger = logging.getLogger(__name__)

CHUNK = 256 * 1024  # bytes read at a time


class FileBody:
    """`length` bytes of `file` from `offset`; the file is closed once done with."""

    def __init__(self, file: BinaryIO, offset: int, length: int, chunk: int = CHUNK) -> None:
        self.file = file
        self.offset = offset
        self.length = length
        self.chunk = chunk
        self.reads = 0  # how many reads it took (each at most `chunk` bytes)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._parts()

    async def _parts(self) -> AsyncIterator[bytes]:
        left = self.length
        at = self.offset
        while left > 0:
            data = await asyncio.to_thread(self._read, at, min(self.chunk, left))
            if not data:  # the file shrank under us: the answer ends short (and the
                logger.warning("%s ended %d bytes early", self.file.name, left)  # client
                return  # sees fewer bytes than Content-Length said)
            self.reads += 1
            left -= len(data)
            at += len(data)
            yield data

    def _read(self, at: int, size: int) -> bytes:
        self.file.seek(at)
        return self.file.read(size)

    async def aclose(self) -> None:
        self.file.close()
