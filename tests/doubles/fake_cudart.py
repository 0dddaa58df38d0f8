"""A double of `cuda.bindings.runtime` (cuda-python 13): every call returns a tuple whose first
item is a `cudaError_t`, as the real one does. Memory is real process memory (ctypes buffers),
so host and "device" addresses both work with memmove and the data really flows through the
copies; the double records what was called so tests can check the strategy, not just the
result. `driver=False` answers every call with cudaErrorInsufficientDriver, as on a machine
without an NVIDIA driver."""

from __future__ import annotations

import ctypes
import enum
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import pytest


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3


class cudaMemLocationType(enum.IntEnum):
    cudaMemLocationTypeInvalid = 0
    cudaMemLocationTypeDevice = 1
    cudaMemLocationTypeHost = 2


class cudaMemLocation:
    def __init__(self) -> None:
        self.type = cudaMemLocationType.cudaMemLocationTypeInvalid
        self.id = 0


@dataclass
class Props:
    """cudaDeviceProp's fields that edged reads."""

    name: bytes = b"Fake GPU"
    major: int = 8
    minor: int = 6
    integrated: int = 0
    canMapHostMemory: int = 1
    managedMemory: int = 1
    concurrentManagedAccess: int = 1
    totalGlobalMem: int = 8 << 30


DISCRETE = Props(b"NVIDIA Fake RTX", 8, 6, 0, 1, 1, 1)
JETSON = Props(b"Orin", 8, 7, 1, 1, 1, 0)


@dataclass
class FakeCudart:
    props: Props | None = field(default_factory=lambda: DISCRETE)
    driver: bool = True
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    allocations: dict[int, tuple[str, Any]] = field(default_factory=dict)  # ptr -> (kind, buf)
    streams: set[int] = field(default_factory=set)
    fail: set[str] = field(default_factory=set)  # names of calls to fail with MemoryAllocation
    lock: threading.Lock = field(default_factory=threading.Lock)
    _next_stream: int = 0x1000

    # -- plumbing ---------------------------------------------------------------------------
    def _enter(self, name: str, args: tuple[Any, ...]) -> cudaError_t:
        with self.lock:
            self.calls.append((name, args))
        if not self.driver:
            return cudaError_t.cudaErrorInsufficientDriver
        if name in self.fail:
            return cudaError_t.cudaErrorMemoryAllocation
        return cudaError_t.cudaSuccess

    def _alloc(self, kind: str, size: int) -> int:
        buf = ctypes.create_string_buffer(size)
        ptr = ctypes.addressof(buf)
        with self.lock:
            self.allocations[ptr] = (kind, buf)
        return ptr

    def called(self, name: str) -> list[tuple[Any, ...]]:
        with self.lock:
            return [args for n, args in self.calls if n == name]

    def live(self, kind: str | None = None) -> int:
        with self.lock:
            return sum(1 for k, _ in self.allocations.values() if kind in (None, k))

    # -- the API -----------------------------------------------------------------------------
    def cudaGetDeviceCount(self) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaGetDeviceCount", ())
        if err:
            return err, None
        return cudaError_t.cudaSuccess, 0 if self.props is None else 1

    def cudaGetDeviceProperties(self, index: int) -> tuple[cudaError_t, Any]:
        err = self._enter("cudaGetDeviceProperties", (index,))
        if err or self.props is None or index != 0:
            return err or cudaError_t.cudaErrorInvalidValue, None
        return err, self.props

    def cudaHostAlloc(self, size: int, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaHostAlloc", (size, flags))
        kind = "mapped" if flags & 2 else "pinned-host"
        return (err, None) if err else (err, self._alloc(kind, size))

    def cudaHostGetDevicePointer(self, host: int, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaHostGetDevicePointer", (host, flags))
        return (err, None) if err else (err, host)  # unified addressing: the same address

    def cudaMallocManaged(self, size: int, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaMallocManaged", (size, flags))
        return (err, None) if err else (err, self._alloc("managed", size))

    def cudaMalloc(self, size: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaMalloc", (size,))
        return (err, None) if err else (err, self._alloc("device", size))

    def _free(self, name: str, ptr: int) -> tuple[cudaError_t]:
        err = self._enter(name, (ptr,))
        with self.lock:
            if not err and self.allocations.pop(ptr, None) is None:
                err = cudaError_t.cudaErrorInvalidValue
        return (err,)

    def cudaFree(self, ptr: int) -> tuple[cudaError_t]:
        return self._free("cudaFree", ptr)

    def cudaFreeHost(self, ptr: int) -> tuple[cudaError_t]:
        return self._free("cudaFreeHost", ptr)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: cudaMemcpyKind,
                        stream: int) -> tuple[cudaError_t]:
        err = self._enter("cudaMemcpyAsync", (dst, src, count, kind, stream))
        if not err and count:
            ctypes.memmove(dst, src, count)
        return (err,)

    def cudaMemPrefetchAsync(self, ptr: int, count: int, location: cudaMemLocation,
                             flags: int, stream: int) -> tuple[cudaError_t]:
        return (self._enter("cudaMemPrefetchAsync", (ptr, count, location.type, stream)),)

    def cudaStreamAttachMemAsync(self, stream: int, ptr: int, length: int,
                                 flags: int) -> tuple[cudaError_t]:
        return (self._enter("cudaStreamAttachMemAsync", (stream, ptr, length, flags)),)

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaStreamCreateWithFlags", (flags,))
        if err:
            return err, None
        with self.lock:
            self._next_stream += 1
            self.streams.add(self._next_stream)
            return err, self._next_stream

    def cudaStreamSynchronize(self, stream: int) -> tuple[cudaError_t]:
        return (self._enter("cudaStreamSynchronize", (stream,)),)

    def cudaStreamDestroy(self, stream: int) -> tuple[cudaError_t]:
        err = self._enter("cudaStreamDestroy", (stream,))
        with self.lock:
            self.streams.discard(stream)
        return (err,)

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("cuda.bindings.runtime")
        for name in dir(self):
            if name.startswith("cuda") and callable(getattr(self, name)):
                setattr(mod, name, getattr(self, name))
        mod.cudaError_t = cudaError_t
        mod.cudaMemcpyKind = cudaMemcpyKind
        mod.cudaMemLocation = cudaMemLocation
        mod.cudaMemLocationType = cudaMemLocationType
        for flag, value in (("cudaHostAllocDefault", 0), ("cudaHostAllocMapped", 2),
                            ("cudaMemAttachGlobal", 1), ("cudaMemAttachHost", 2),
                            ("cudaMemAttachSingle", 4), ("cudaStreamNonBlocking", 1)):
            setattr(mod, flag, value)
        return mod


def install(monkeypatch: pytest.MonkeyPatch, fake: FakeCudart) -> FakeCudart:
    """Make `from cuda.bindings import runtime` give `fake`, and forget edged's GPU probe."""
    runtime = fake.module()
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = runtime
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    monkeypatch.setitem(sys.modules, "cuda", cuda)
    monkeypatch.setitem(sys.modules, "cuda.bindings", bindings)
    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", runtime)
    forget_probe(monkeypatch)
    return fake


def forget_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe the GPU afresh in this test; the real probe comes back after it."""
    from edged import gpu, memory

    monkeypatch.setattr(gpu, "_probed", None)
    monkeypatch.setattr(memory, "_warned", set())


def uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    """No cuda-python at all: `import cuda.bindings` fails."""
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime"):
        monkeypatch.setitem(sys.modules, name, None)
    forget_probe(monkeypatch)
