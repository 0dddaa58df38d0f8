"""System shared memory (Triton's extension): clients register POSIX shm regions by key, offset
and size; requests then name a region instead of carrying tensor bytes. Each region is mapped
once at registration, every use is bounds-checked, and it is unmapped on unregister or close
(later, when a request still holds a view of it)."""

from __future__ import annotations

import logging
import mmap
import os
import re
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edged.api.protocol import ShmRef
from edged.errors import InvalidInput

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
# shm_open names: one optional leading slash, then a plain file name.
_KEY = re.compile(r"^/?(?!\.{1,2}$)[A-Za-z0-9_.-]{1,200}$")


@dataclass
class Region:
    name: str
    key: str
    offset: int  # where the region starts in the shm object
    byte_size: int
    mapping: mmap.mmap

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}


class ShmRegistry:
    def __init__(self, shm_dir: Path = SHM_DIR) -> None:
        self.shm_dir = shm_dir
        self._lock = threading.Lock()
        self._regions: dict[str, Region] = {}
        self._closing: list[Region] = []  # unregistered, still viewed by a request

    def register(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        if not name:
            raise InvalidInput("a shared memory region needs a name")
        if not _KEY.match(key):
            raise InvalidInput(f"shared memory key {key!r} is not a plain shm name")
        if offset < 0 or byte_size <= 0:
            raise InvalidInput("shared memory offset must be >= 0 and byte_size > 0")
        with self._lock:
            if name in self._regions:
                raise InvalidInput(f"shared memory region {name!r} is already registered")
        path = self.shm_dir / key.lstrip("/")
        try:
            # O_NOFOLLOW: a symlink planted in /dev/shm must not map some other file.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidInput(f"shared memory key {key!r} cannot be opened: "
                               f"{exc.strerror}") from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidInput(f"shared memory key {key!r} is not a shared memory object")
            if offset + byte_size > info.st_size:
                raise InvalidInput(f"region {name!r} ({offset}+{byte_size} bytes) exceeds the "
                                   f"{info.st_size} bytes of {key!r}")
            mapping = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        region = Region(name, key, offset, byte_size, mapping)
        with self._lock:
            if name in self._regions:  # registered meanwhile by another request
                mapping.close()
                raise InvalidInput(f"shared memory region {name!r} is already registered")
            self._regions[name] = region
        logger.info("registered shared memory %s (%s, %d bytes at %d)", name, key, byte_size,
                    offset)
        return region

    def unregister(self, name: str | None = None) -> None:
        """Unregister one region, or all of them when name is None."""
        with self._lock:
            if name is None:
                doomed = list(self._regions.values())
                self._regions.clear()
            elif name in self._regions:
                doomed = [self._regions.pop(name)]
            else:
                raise InvalidInput(f"shared memory region {name!r} is not registered")
            self._closing.extend(doomed)
        self.collect()

    def status(self, name: str | None = None) -> list[dict[str, object]]:
        with self._lock:
            if name is None:
                return [r.describe() for r in self._regions.values()]
            if name not in self._regions:
                raise InvalidInput(f"shared memory region {name!r} is not registered")
            return [self._regions[name].describe()]

    def _checked(self, ref: ShmRef) -> tuple[Region, int]:
        with self._lock:
            region = self._regions.get(ref.region)
        if region is None:
            raise InvalidInput(f"shared memory region {ref.region!r} is not registered")
        if ref.offset + ref.byte_size > region.byte_size:
            raise InvalidInput(f"{ref.offset}+{ref.byte_size} bytes is outside region "
                               f"{ref.region!r} ({region.byte_size} bytes)")
        return region, region.offset + ref.offset

    def read(self, ref: ShmRef) -> memoryview:
        """A view of the referenced bytes (no copy); valid while the region is registered."""
        region, start = self._checked(ref)
        return memoryview(region.mapping)[start:start + ref.byte_size]

    def write(self, ref: ShmRef, array: np.ndarray) -> None:
        """Copy an output tensor into the referenced bytes."""
        region, start = self._checked(ref)
        data = np.ascontiguousarray(array)
        if data.dtype == np.object_:
            raise InvalidInput("BYTES outputs cannot be written to shared memory")
        if data.nbytes > ref.byte_size:
            raise InvalidInput(f"output of {data.nbytes} bytes does not fit the "
                               f"{ref.byte_size} bytes given in region {ref.region!r}")
        target = np.frombuffer(region.mapping, np.uint8, data.nbytes, start)
        target[:] = data.reshape(-1).view(np.uint8)

    def collect(self) -> None:
        """Unmap unregistered regions that no request views any more."""
        with self._lock:
            pending, self._closing = self._closing, []
        still = []
        for region in pending:
            try:
                region.mapping.close()
            except BufferError:  # a request still holds a view: close it later
                still.append(region)
        with self._lock:
            self._closing.extend(still)

    def close(self) -> None:
        """Unmap everything (at shutdown, after the scheduler has drained)."""
        self.unregister(None)
        with self._lock:
            left = len(self._closing)
        if left:
            logger.warning("%d shared memory mapping(s) still in use at close", left)
