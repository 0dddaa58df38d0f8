"""System shared memory (Triton's extension): clients register POSIX shm regions by key, offset
and size; requests then name a region instead of carrying tensor bytes.

A region is opened and mapped once at registration (only by a peer that may open the object
itself). Inputs are handed to the model as views of the mapping: a 640x640 frame is never
copied. Every use is bounds-checked against the region and against the object's current size,
so a client that has shrunk or recreated its object gets a 400, not a crash. What no check can
close is a client shrinking its object *while* a model reads a view of it: the kernel then
kills the daemon with SIGBUS. So views are lent only to peers that could kill the daemon anyway
(its own uid, or root: they may signal it); every other peer's inputs are copied in with pread
as the request is read, where a shrink is a short read and a 400 for that request only
(`api.shm_copy_inputs: auto`; `always` copies for everyone, `never` maps for everyone).
Outputs are always written with pwrite (it cannot fault).

Unregister closes the descriptor and the mapping; a mapping still viewed by an in-flight
request is unmapped when that request lets go of it."""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from edged.api.protocol import ShmRef
from edged.errors import Forbidden, InvalidInput

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
MAX_REGIONS = 128  # each holds a file descriptor
ALIGN = 64
# shm_open names: one optional leading slash, then a plain file name.
_KEY = re.compile(r"^/?(?!\.{1,2}$)[A-Za-z0-9_.-]{1,200}$")
_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")


@dataclass(frozen=True)
class Peer:
    """Who is asking: the uid and groups of the process on the other end of the connection."""

    uid: int
    gids: frozenset[int] = frozenset()


# Whose region: the registering peer's uid; None for one registered in-process (no peer).
Owner = int | None
# When inputs are copied rather than viewed: see the module's docstring.
CopyInputs = Literal["auto", "always", "never"]


@dataclass(eq=False)
class Region:
    name: str
    key: str
    offset: int  # where the region starts in the shm object
    byte_size: int
    fd: int
    mapping: mmap.mmap | None = None
    skip: int = 0  # bytes of the mapping before the region (mappings start on a page)
    users: int = 0
    closing: bool = field(default=False)
    owner: Owner = None

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}


class ShmRegistry:
    def __init__(self, shm_dir: Path = SHM_DIR, max_regions: int = MAX_REGIONS, *,
                 copy_inputs: CopyInputs = "auto") -> None:
        self.shm_dir = shm_dir
        self.max_regions = max_regions
        self.copy_inputs = copy_inputs
        self._lock = threading.Lock()
        # Regions by (owner, name): each user has its own names, and nobody else's region can
        # be listed, used as an input or output, or unregistered by another user.
        self._regions: dict[tuple[Owner, str], Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int,
                 peer: Peer | None = None) -> Region:
        """Open `key` for the region `name`, owned by `peer`. With `peer` given, the peer must
        itself be allowed to read and write the object: the daemon's rights are not lent to
        its clients."""
        if not _NAME.match(name):
            raise InvalidInput(f"shared memory region name {name[:64]!r} is not valid")
        if not _KEY.match(key):
            raise InvalidInput(f"shared memory key {key[:64]!r} is not a plain shm name")
        if offset < 0 or byte_size <= 0:
            raise InvalidInput("shared memory offset must be >= 0 and byte_size > 0")
        owner = _owner(peer)
        with self._lock:
            if (owner, name) in self._regions:
                raise InvalidInput(f"shared memory region {name!r} is already registered")
            if len(self._regions) >= self.max_regions:
                raise InvalidInput(f"{self.max_regions} shared memory regions are registered "
                                   "already; unregister some first")
        path = self.shm_dir / key.lstrip("/")
        try:
            # O_NOFOLLOW: a symlink planted in /dev/shm must not open some other file.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidInput(f"shared memory key {key!r} cannot be opened: "
                               f"{exc.strerror}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"shared memory key {key!r} is not a shared memory object")
            if peer is not None and not _may_use(peer, info):
                raise Forbidden(f"shared memory key {key!r} belongs to uid {info.st_uid} "
                                f"(mode {stat.S_IMODE(info.st_mode):o}); uid {peer.uid} "
                                "may not use it")
            if offset + byte_size > info.st_size:
                raise InvalidInput(f"region {name!r} ({offset}+{byte_size} bytes) exceeds the "
                                   f"{info.st_size} bytes of {key!r}")
            region = Region(name, key, offset, byte_size, fd, owner=owner)
            if self._may_view(peer):
                region.skip = offset % mmap.ALLOCATIONGRANULARITY
                region.mapping = mmap.mmap(fd, byte_size + region.skip, mmap.MAP_SHARED,
                                           mmap.PROT_READ, offset=offset - region.skip)
        except OSError as exc:
            os.close(fd)
            raise InvalidInput(f"shared memory key {key!r} cannot be mapped: "
                               f"{exc.strerror}") from exc
        except BaseException:  # close, then re-raise whatever it was: no leaked fd
            os.close(fd)
            raise
        with self._lock:  # checked again: other registrations may have raced this one
            refusal = f"shared memory region {name!r} is already registered" \
                if (owner, name) in self._regions else \
                f"{self.max_regions} shared memory regions are registered already; " \
                "unregister some first" if len(self._regions) >= self.max_regions else None
            if refusal is None:
                self._regions[(owner, name)] = region
        if refusal is not None:
            _close(region)
            raise InvalidInput(refusal)
        logger.info("registered shared memory %s (%s, %d bytes at %d)", name, key, byte_size,
                    offset)
        return region

    def _may_view(self, peer: Peer | None) -> bool:
        """Whether `peer`'s inputs may be handed to models as views of its mapping: only if a
        SIGBUS it provokes (by shrinking the object under a queued request) gives it nothing
        it did not have, i.e. it may signal the daemon already."""
        if self.copy_inputs != "auto":
            return self.copy_inputs == "never"
        return peer is None or peer.uid in (0, os.geteuid())

    def unregister(self, name: str | None = None, peer: Peer | None = None) -> None:
        """Unregister one of `peer`'s regions, or all of them when name is None. Unknown
        names are not an error (as in Triton): the outcome the client asked for holds."""
        owner = _owner(peer)
        self._discard(lambda key: key[0] == owner and name in (None, key[1]))

    def _discard(self, chosen: Callable[[tuple[Owner, str]], bool]) -> None:
        """Forget the chosen regions; each closes now, or after the request using it."""
        with self._lock:
            doomed = [self._regions.pop(key) for key in [k for k in self._regions if chosen(k)]]
            for region in doomed:
                region.closing = True
            idle = [r for r in doomed if r.users == 0]
        for region in idle:
            _close(region)

    def status(self, name: str | None = None,
               peer: Peer | None = None) -> list[dict[str, object]]:
        """`peer`'s regions (all, or the one named)."""
        owner = _owner(peer)
        with self._lock:
            if name is None:
                return [r.describe() for (o, _), r in self._regions.items() if o == owner]
            region = self._regions.get((owner, name))
            if region is None:
                raise InvalidInput(f"shared memory region {name!r} is not registered")
            return [region.describe()]

    @contextlib.contextmanager
    def _use(self, ref: ShmRef, peer: Peer | None = None) -> Iterator[tuple[Region, int]]:
        """`peer`'s region, held open, and the absolute file position of the reference."""
        with self._lock:
            region = self._regions.get((_owner(peer), ref.region))
            if region is None:
                raise InvalidInput(f"shared memory region {ref.region!r} is not registered")
            if ref.offset + ref.byte_size > region.byte_size:
                raise InvalidInput(f"{ref.offset}+{ref.byte_size} bytes is outside region "
                                   f"{ref.region!r} ({region.byte_size} bytes)")
            region.users += 1
        try:
            yield region, region.offset + ref.offset
        finally:
            with self._lock:
                region.users -= 1
                close = region.closing and region.users == 0
            if close:
                _close(region)

    def read(self, ref: ShmRef, peer: Peer | None = None) -> memoryview:
        """The referenced bytes: a view of the mapping (the owner may be lent one), or a copy
        in a 64-byte aligned buffer the caller owns (any other owner, or bytes that do not
        start aligned)."""
        with self._use(ref, peer) as (region, position):
            _check_size(region, position + ref.byte_size)
            if region.mapping is not None and position % ALIGN == 0:
                start = position - region.offset + region.skip
                return memoryview(region.mapping)[start:start + ref.byte_size]
            raw = np.empty(ref.byte_size + ALIGN, np.uint8)
            start = -raw.ctypes.data % ALIGN
            view = raw.data[start:start + ref.byte_size]
            got = os.preadv(region.fd, [view], position)
        if got != ref.byte_size:
            raise InvalidInput(f"region {ref.region!r}: only {got} of {ref.byte_size} bytes "
                               "could be read; the shm object has shrunk")
        return view

    def write(self, ref: ShmRef, array: np.ndarray, peer: Peer | None = None) -> None:
        """Copy an output tensor into the referenced bytes."""
        data = np.ascontiguousarray(array)
        if data.dtype == np.object_:
            raise InvalidInput("BYTES outputs cannot be written to shared memory")
        if data.nbytes > ref.byte_size:
            raise InvalidInput(f"output of {data.nbytes} bytes does not fit the "
                               f"{ref.byte_size} bytes given in region {ref.region!r}")
        with self._use(ref, peer) as (region, position):
            _check_size(region, position + data.nbytes)  # never grow a client's object
            written = os.pwrite(region.fd, data.reshape(-1).view(np.uint8).data, position)
        if written != data.nbytes:
            raise InvalidInput(f"region {ref.region!r}: only {written} of {data.nbytes} bytes "
                               "could be written")

    def close(self) -> None:
        """Close every region of every owner (at shutdown, after the scheduler drained)."""
        self._discard(lambda key: True)


def _owner(peer: Peer | None) -> Owner:
    return None if peer is None else peer.uid


def _check_size(region: Region, end: int) -> None:
    size = os.fstat(region.fd).st_size
    if end > size:
        raise InvalidInput(f"region {region.name!r}: the shm object has shrunk to {size} "
                           "bytes")


def _close(region: Region) -> None:
    os.close(region.fd)
    if region.mapping is not None:
        try:
            region.mapping.close()
        except BufferError:
            pass  # an in-flight request still views it: unmapped when that view goes


def _may_use(peer: Peer, info: os.stat_result) -> bool:
    """Whether `peer` could open the object read-write itself (the kernel's own check)."""
    if peer.uid == 0:
        return True
    mode = stat.S_IMODE(info.st_mode)
    if peer.uid == info.st_uid:
        return mode & 0o600 == 0o600
    if info.st_gid in peer.gids:
        return mode & 0o060 == 0o060
    return mode & 0o006 == 0o006
