"""Hostile images built by hand: a PNG that declares more pixels than it is bytes (a
decompression bomb), without the pixels ever in memory."""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + \
        struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_of_zeros(width: int, height: int, rows: int | None = None) -> bytes:
    """A grey PNG declaring width x height (its pixel data `rows` rows of zeros, all by
    default), built without the pixels in memory."""
    pack = zlib.compressobj(9)
    row = b"\x00" * (width + 1)
    data = b"".join(pack.compress(row) for _ in range(height if rows is None else rows))
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0,
                                                                0, 0, 0)) + \
        _chunk(b"IDAT", data + pack.flush()) + _chunk(b"IEND", b"")
