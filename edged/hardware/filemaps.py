"""Host memory that maps a file another process can shrink (a client's POSIX shared memory), and
copying out of it without touching the mapping.

An input handed to a model as a view of a client's mapping faults (SIGBUS, which kills the
daemon) if the client truncates its object before the view is read. Where the bytes are copied
anyway (into a pooled batch buffer, into pinned memory for a GPU), `copy_into` reads them from
the file with `preadv` straight into that buffer instead: the same one copy, and a shrunk
file is a short read (`SourceShrunk`, an error for that request), not a fault. A view is still
handed over as it is where it saves the only copy (a batch of one that a CPU session reads in
place); `edged/api/shm.py` lends views only to peers that could kill the daemon anyway.

The owner of a mapping says where it lies with `track` (and `untrack` before unmapping it):
each tracked range keeps a descriptor of its own, closed once no copy reads through it."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from edged.core.errors import InvalidInput


class SourceShrunk(InvalidInput):
    """A file-backed array could not be read whole: its file has shrunk under it."""

    def __init__(self, message: str, part: int = 0) -> None:
        super().__init__(message)
        self.part = part  # which of the parts being copied (concatenate_into)


@dataclass(eq=False)
class FileRange:
    """Host memory [start, end) maps the file open as `fd` from `position` on."""

    fd: int
    position: int
    start: int
    end: int
    name: str
    readers: int = 0
    dropped: bool = False


_ranges: list[FileRange] = []
_lock = threading.Lock()


def track(address: int, nbytes: int, fd: int, position: int, name: str) -> FileRange:
    """Note that `nbytes` of host memory at `address` map `fd`'s bytes from `position` (the
    range keeps a duplicate of `fd`: the caller may close its own)."""
    entry = FileRange(os.dup(fd), position, address, address + nbytes, name)
    with _lock:
        _ranges.append(entry)
    return entry


def untrack(entry: FileRange) -> None:
    """Before the mapping goes: copies stop reading through it (one under way finishes)."""
    with _lock:
        if entry in _ranges:
            _ranges.remove(entry)
        entry.dropped = True
        close = entry.readers == 0
    if close:
        os.close(entry.fd)


def tracked() -> bool:
    """Whether any range is tracked (when none is, copies are plain numpy copies)."""
    return bool(_ranges)


def file_backed(array: np.ndarray) -> bool:
    return _find(array, hold=False) is not None


def copy_into(out: np.ndarray, part: np.ndarray, index: int = 0) -> None:
    """`out[...] = part`, reading `part`'s bytes from its file where it lies in a tracked
    range (SourceShrunk, naming `index`, if the file no longer holds them)."""
    if not part.nbytes:
        return
    fits = out.dtype == part.dtype and out.shape == part.shape and out.flags.c_contiguous
    entry = _find(part, hold=True) if _ranges and fits else None
    if entry is None:
        out[...] = part
        return
    try:
        position = entry.position + part.__array_interface__["data"][0] - entry.start
        target = out.data.cast("B")
        got = os.preadv(entry.fd, [target], position)
    finally:
        with _lock:
            entry.readers -= 1
            close = entry.dropped and entry.readers == 0
        if close:
            os.close(entry.fd)
    if got != part.nbytes:
        raise SourceShrunk(f"shared memory {entry.name!r}: only {got} of {part.nbytes} bytes "
                           "could be read; the shm object has shrunk", index)


def _find(array: np.ndarray, *, hold: bool) -> FileRange | None:
    """The tracked range `array`'s bytes lie in, when they are contiguous and in one; with
    `hold`, counted as a reader until the copy is done."""
    if not _ranges or not array.flags.c_contiguous or array.dtype.hasobject:
        return None
    start = array.__array_interface__["data"][0]
    end = start + array.nbytes
    with _lock:
        for entry in _ranges:
            if entry.start <= start and end <= entry.end:
                if hold:
                    entry.readers += 1
                return entry
    return None
