"""System shared memory (Triton's extension): clients register POSIX shm regions by key, offset
and size; requests then name a region instead of carrying tensor bytes.

A region is opened and mapped once at registration (only by a peer that may open the object
itself). Inputs are handed to the model as views of the mapping: a 640x640 frame is never
copied. Every use is bounds-checked against the region and against the object's current size,
so a client that has shrunk or recreated its object gets a 400, not a crash. What no check can
close is a client shrinking its object *while* a model reads a view of it: the kernel then
kills the daemon with SIGBUS. So views are lent only to peers that could kill the daemon anyway
(its own uid, or root: they may signal it), and only of objects no one else can shrink (owned
by those uids, not world-writable); every other peer's inputs are copied in with pread
as the request is read, where a shrink is a short read and a 400 for that request only
(`api.shm_copy_inputs: auto`; `always` copies for everyone, `never` maps for everyone). A
copy is request memory: it is charged to the body budget before it is made.
Outputs are always written with pwrite (it cannot fault).

A request holds the regions it names (a `Lease`) from its first use until it has answered.
Unregistering a region that requests hold only marks it: it stays listed and usable, by those
requests and by any that come while one still holds it, until the last of them ends; then the
descriptor and the mapping close (a mapping still viewed by an input array is unmapped when
that array goes). That is Triton's `awaiting_unregister`: its client tests send requests on a
region after unregistering it while others are in flight, and count every result. The name
cannot be registered again until the region has gone."""

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

from edged.api import tensorbytes
from edged.api.protocol import ShmRef
from edged.core.errors import EdgedError, Forbidden, InvalidInput
from edged.hardware import filemaps

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
    tracked: filemaps.FileRange | None = None  # where the mapping lies, for copies out of it

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
                raise InvalidInput(_taken(self._regions[(owner, name)]))
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
            if self._may_view(peer, info):
                region.skip = offset % mmap.ALLOCATIONGRANULARITY
                region.mapping = mmap.mmap(fd, byte_size + region.skip, mmap.MAP_SHARED,
                                           mmap.PROT_READ, offset=offset - region.skip)
                address = np.frombuffer(region.mapping, np.uint8).ctypes.data
                region.tracked = filemaps.track(address, byte_size + region.skip, fd,
                                                offset - region.skip, name)
        except OSError as exc:
            os.close(fd)
            raise InvalidInput(f"shared memory key {key!r} cannot be mapped: "
                               f"{exc.strerror}") from exc
        except BaseException:  # close, then re-raise whatever it was: no leaked fd
            os.close(fd)
            raise
        with self._lock:  # checked again: other registrations may have raced this one
            refusal = _taken(self._regions[(owner, name)]) \
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

    def _may_view(self, peer: Peer | None, info: os.stat_result | None = None) -> bool:
        """Whether `peer`'s inputs may be handed to models as views of its mapping: only if a
        SIGBUS it provokes (by shrinking the object under a queued request) gives it nothing
        it did not have, i.e. it may signal the daemon already, and (`info`: the object's
        stat) no other user can shrink the object either."""
        if self.copy_inputs != "auto":
            return self.copy_inputs == "never"
        return (peer is None or peer.uid in (0, os.geteuid())) and \
            (info is None or _only_trusted_write(info))

    def _copies_for(self, owner: Owner) -> bool:
        """Whether any of `owner`'s regions has its inputs copied in rather than viewed."""
        if self.copy_inputs == "always":
            return True
        with self._lock:
            return any(r.mapping is None for (o, _), r in self._regions.items() if o == owner)

    def unregister(self, name: str | None = None, peer: Peer | None = None) -> None:
        """Unregister one of `peer`'s regions, or all of them when name is None. Unknown
        names are not an error (as in Triton): the outcome the client asked for holds."""
        owner = _owner(peer)
        self._discard(lambda key: key[0] == owner and name in (None, key[1]))

    def _discard(self, chosen: Callable[[tuple[Owner, str]], bool]) -> None:
        """Unregister the chosen regions: each closes now, or (still listed until then) when
        the last request holding it ends."""
        with self._lock:
            idle = []
            for key in [k for k in self._regions if chosen(k)]:
                region = self._regions[key]
                region.closing = True
                if region.users == 0:
                    idle.append(self._regions.pop(key))
        for region in idle:
            _close(region)

    def status(self, name: str | None = None,
               peer: Peer | None = None) -> list[dict[str, object]]:
        """`peer`'s regions (all, or the one named), unregistered ones that requests still
        hold included."""
        owner = _owner(peer)
        with self._lock:
            if name is None:
                return [r.describe() for (o, _), r in self._regions.items() if o == owner]
            region = self._regions.get((owner, name))
            if region is None:
                raise InvalidInput(f"shared memory region {name!r} is not registered")
            return [region.describe()]

    def lease(self, peer: Callable[[], Peer | None] = lambda: None,
              charge: Callable[[int], None] | None = None) -> Lease:
        """A request's hold on the regions it uses; `peer` is asked (once) at the first.
        `charge` is told the size of each input copied in, before the copy is made."""
        return Lease(self, peer, charge)

    def _acquire(self, name: str, owner: Owner) -> Region:
        with self._lock:
            region = self._regions.get((owner, name))
            if region is None:
                raise InvalidInput(f"shared memory region {name!r} is not registered")
            region.users += 1  # closing or not: it goes once nothing holds it
            return region

    def _let_go(self, region: Region) -> None:
        with self._lock:
            region.users -= 1
            last = region.closing and region.users == 0
            if last and self._regions.get((region.owner, region.name)) is region:
                del self._regions[(region.owner, region.name)]
        if last:
            _close(region)

    @contextlib.contextmanager
    def _use(self, ref: ShmRef, peer: Peer | None = None) -> Iterator[tuple[Region, int]]:
        """`peer`'s region, held open for the block, and the absolute file position of the
        reference."""
        region = self._acquire(ref.region, _owner(peer))
        try:
            yield region, _position(region, ref)
        finally:
            self._let_go(region)

    def read(self, ref: ShmRef, peer: Peer | None = None) -> memoryview:
        """The referenced bytes: a view of the mapping (the owner may be lent one), or a copy
        in a 64-byte aligned buffer the caller owns (any other owner, or bytes that do not
        start aligned)."""
        with self._use(ref, peer) as (region, position):
            return _read(region, ref, position)

    def write(self, ref: ShmRef, array: np.ndarray, peer: Peer | None = None) -> int:
        """Copy an output tensor into the referenced bytes (BYTES length-prefixed, as in
        Triton's binary format); the number of bytes written."""
        with self._use(ref, peer) as (region, position):
            return _write(region, ref, position, array)

    def close(self) -> None:
        """Close every region of every owner (at shutdown, after the scheduler drained)."""
        self._discard(lambda key: True)


class Lease:
    """The regions one request uses, each held from its first use until `release` (when the
    request has answered): unregistering one meanwhile does not take it from the request."""

    def __init__(self, registry: ShmRegistry, peer: Callable[[], Peer | None],
                 charge: Callable[[int], None] | None = None) -> None:
        self._registry = registry
        self._peer = peer
        self._charge = charge
        self._owner: Owner = None
        self._asked = False
        self._held: dict[str, Region] = {}
        self._lock = threading.Lock()  # a large body is decoded on a thread
        # Whether an input was lent as a view of a region's mapping (not copied in): its owner
        # may write other bytes before the model reads them.
        self.viewed = False

    def hold(self, ref: ShmRef) -> tuple[Region, int]:
        """The referenced region, held for the rest of the request, and the reference's
        absolute file position (InvalidInput when it is unknown or out of bounds)."""
        with self._lock:
            if not self._asked:
                self._owner = _owner(self._peer())
                self._asked = True
            region = self._held.get(ref.region)
            if region is None:
                region = self._held[ref.region] = \
                    self._registry._acquire(ref.region, self._owner)
        return region, _position(region, ref)

    def read(self, ref: ShmRef) -> memoryview:
        region, position = self.hold(ref)
        data = _read(region, ref, position, self._charge)
        if region.mapping is not None and data.obj is region.mapping:
            self.viewed = True
        return data

    def copies(self) -> bool:
        """Whether this request's shm inputs may be copied in (pread) rather than viewed;
        True too when the peer cannot be told (the decode says so if it uses shm)."""
        try:
            with self._lock:
                if not self._asked:
                    self._owner = _owner(self._peer())
                    self._asked = True
                owner = self._owner
        except EdgedError:
            return True
        return self._registry._copies_for(owner)

    def write(self, ref: ShmRef, array: np.ndarray) -> int:
        region, position = self.hold(ref)
        return _write(region, ref, position, array)

    def release(self) -> None:
        with self._lock:
            held, self._held = list(self._held.values()), {}
        for region in held:
            self._registry._let_go(region)


def _position(region: Region, ref: ShmRef) -> int:
    if ref.offset + ref.byte_size > region.byte_size:
        raise InvalidInput(f"{ref.offset}+{ref.byte_size} bytes is outside region "
                           f"{ref.region!r} ({region.byte_size} bytes)")
    return region.offset + ref.offset


def _read(region: Region, ref: ShmRef, position: int,
          charge: Callable[[int], None] | None = None) -> memoryview:
    _check_size(region, position + ref.byte_size)
    if region.mapping is not None and position % ALIGN == 0:
        start = position - region.offset + region.skip
        return memoryview(region.mapping)[start:start + ref.byte_size]
    if charge is not None:  # the copy is request memory, as a body's bytes are
        charge(ref.byte_size)
    raw = np.empty(ref.byte_size + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    view = raw.data[start:start + ref.byte_size]
    got = os.preadv(region.fd, [view], position)
    if got != ref.byte_size:
        raise InvalidInput(f"region {ref.region!r}: only {got} of {ref.byte_size} bytes "
                           "could be read; the shm object has shrunk")
    return view


def _write(region: Region, ref: ShmRef, position: int, array: np.ndarray) -> int:
    if tensorbytes.is_bytes(array.dtype):
        data: bytes | memoryview = tensorbytes.pack(array, f"output in region {ref.region!r}")
    else:
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    if len(data) > ref.byte_size:
        raise InvalidInput(f"output of {len(data)} bytes does not fit the "
                           f"{ref.byte_size} bytes given in region {ref.region!r}")
    if not data:
        return 0
    _check_size(region, position + len(data))  # never grow a client's object
    written = os.pwrite(region.fd, data, position)
    if written != len(data):
        raise InvalidInput(f"region {ref.region!r}: only {written} of {len(data)} bytes "
                           "could be written")
    return written


def _taken(region: Region) -> str:
    if region.closing:
        return (f"shared memory region {region.name!r} is being unregistered (requests still "
                "use it); register it again when they are done")
    return f"shared memory region {region.name!r} is already registered"


def _owner(peer: Peer | None) -> Owner:
    return None if peer is None else peer.uid


def _check_size(region: Region, end: int) -> None:
    size = os.fstat(region.fd).st_size
    if end > size:
        raise InvalidInput(f"region {region.name!r}: the shm object has shrunk to {size} "
                           "bytes")


def _close(region: Region) -> None:
    if region.tracked is not None:  # before the mapping goes (its address may be reused)
        filemaps.untrack(region.tracked)
    os.close(region.fd)
    if region.mapping is not None:
        try:
            region.mapping.close()
        except BufferError:
            pass  # an in-flight request still views it: unmapped when that view goes


def _only_trusted_write(info: os.stat_result) -> bool:
    """Whether the object is safe to lend views of: owned by edged's uid or root (a peer of
    those uids may still register one that another user made first, a squatted name) and
    not writable by every user. Its group's write is its owner's choice to trust."""
    return info.st_uid in (0, os.geteuid()) and not stat.S_IMODE(info.st_mode) & 0o002


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
