"""What of a fragmented MP4 is whole: its top-level boxes read in order (`ftyp`, `moov`, then
`moof`+`mdat` pairs, one per group of pictures), to the end of the last fragment whose `mdat`
is complete. A write that failed mid-fragment (the disk filled) leaves a tail that no player
can use; cutting the file there leaves a valid MP4 of every fragment before it. The samples
count is read from the kept fragments' `trun` boxes (ISO/IEC 14496-12, 8.8.8)."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

HEADER = struct.Struct(">I4s")
CONTAINERS = {b"moof", b"traf"}  # the boxes whose children hold the sample counts


@dataclass(frozen=True)
class WholePart:
    size: int  # bytes from the start that hold whole boxes, ending with a whole fragment
    fragments: int  # moof+mdat pairs in them
    samples: int  # pictures in those fragments


def whole_part(path: Path) -> WholePart:
    """Scan `path` (a fragmented MP4, maybe cut anywhere) for its whole fragments."""
    with path.open("rb") as f:
        end = f.seek(0, 2)
        f.seek(0)
        return _scan(f, end)


def cut_to_whole(path: Path) -> WholePart:
    """Truncate `path` after its last whole fragment (truncating never needs free space)."""
    part = whole_part(path)
    with path.open("r+b") as f:
        f.truncate(part.size)
    return part


def _scan(f: BinaryIO, end: int) -> WholePart:
    at = 0
    good = 0  # the end of the last whole box that leaves the file valid
    fragments = samples = 0
    header_done = False  # ftyp and moov both read
    seen: set[bytes] = set()
    pending: int | None = None  # samples of a moof whose mdat has not been read yet
    while at + HEADER.size <= end:
        f.seek(at)
        size, kind = HEADER.unpack(f.read(HEADER.size))
        header = HEADER.size
        if size == 1:  # a 64-bit size follows
            raw = f.read(8)
            if len(raw) < 8:
                break
            size, header = struct.unpack(">Q", raw)[0], 16
        elif size == 0:  # to the end of the file: only a last box may say so
            size = end - at
        if size < header or at + size > end:
            break  # cut in this box
        if kind == b"moof":
            f.seek(at + header)
            pending = _trun_samples(f.read(size - header))
        elif kind == b"mdat" and pending is not None:
            fragments += 1
            samples += pending
            pending = None
            good = at + size
        elif kind in (b"ftyp", b"moov"):
            seen.add(kind)
            header_done = seen == {b"ftyp", b"moov"}
            if header_done:
                good = at + size
        elif pending is None and header_done:
            good = at + size  # (mfra, free, and what else follows a whole fragment)
        at += size
    if not header_done:
        return WholePart(0, 0, 0)
    return WholePart(good, fragments, samples)


def _trun_samples(body: bytes) -> int:
    """The samples of every `trun` in a `moof`'s body (its `traf`s)."""
    count = 0
    at = 0
    while at + HEADER.size <= len(body):
        size, kind = HEADER.unpack_from(body, at)
        if size < HEADER.size or at + size > len(body):
            break
        if kind in CONTAINERS:
            count += _trun_samples(body[at + HEADER.size:at + size])
        elif kind == b"trun" and size >= HEADER.size + 8:
            count += struct.unpack_from(">I", body, at + HEADER.size + 4)[0]
        at += size
    return count
