"""A double of `cuda.bindings.runtime` (cuda-python 13): every call returns a tuple whose first
item is a `cudaError_t`, as the real one does. Memory is real process memory (ctypes buffers),
so host and "device" addresses both work with memmove and the data really flows through the
copies; the double records what was called so tests can check the strategy, not just the
result. `driver=False` answers every call with cudaErrorInsufficientDriver, as on a machine
without an NVIDIA driver.

It enforces what the real runtime enforces (tests/gpu_api checks its names, arguments and
return tuples against the real cuda-python): allocations are 256-byte aligned; async copies
and kernels (fake_tensorrt's) run in stream order only when the stream is synchronized;
managed memory follows the attach rules of a device without concurrent managed access (the
GPU may not touch memory attached to the host or to another stream, the CPU may not touch
memory attached to a stream with work in flight: `cpu_access` is that rule's oracle); and
`api=12` gives cuda-python 12's cudaMemPrefetchAsync (a device ordinal)."""

from __future__ import annotations

import ctypes
import enum
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import pytest

ALIGNMENT = 256  # cudaMalloc and friends return 256-byte aligned memory


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInsufficientDriver = 35
    cudaErrorNoDevice = 100
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalAddress = 700


class Fault(AssertionError):
    """What the real device would do to the process: a bus error or a sticky illegal address."""


current: FakeCudart | None = None  # the installed double, for fake_tensorrt's checks
ATTACH = {1: "global", 2: "host", 4: "single"}


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
    api: int = 13  # cuda-python's major version: 12 has the older cudaMemPrefetchAsync
    returns: list[tuple[str, tuple[Any, ...], int]] = field(default_factory=list)
    attached: dict[int, Any] = field(default_factory=dict)  # managed ptr -> host|global|stream
    pending: dict[int, list[Any]] = field(default_factory=dict)  # stream -> queued work
    faults: list[str] = field(default_factory=list)
    lock: threading.RLock = field(default_factory=threading.RLock)
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
        buf = ctypes.create_string_buffer(size + ALIGNMENT)
        ptr = -(-ctypes.addressof(buf) // ALIGNMENT) * ALIGNMENT
        with self.lock:
            self.allocations[ptr] = (kind, (buf, size))
        return ptr

    # -- the rules ---------------------------------------------------------------------------
    def kind_of(self, address: int) -> tuple[str, int] | None:
        """The allocation kind `address` lies in and that allocation's start, or None."""
        with self.lock:
            for ptr, (kind, (_buf, size)) in self.allocations.items():
                if ptr <= address < ptr + max(size, 1):
                    return kind, ptr
        return None

    def _concurrent(self) -> bool:
        return bool(self.props and self.props.concurrentManagedAccess)

    def gpu_access(self, address: int, stream: int) -> str | None:
        """Why a kernel on `stream` may not read or write `address` (None: it may)."""
        found = self.kind_of(address)
        if found is None:
            return f"{address:#x} is not device-accessible memory (a plain host pointer)"
        kind, ptr = found
        if kind == "managed" and not self._concurrent():
            where = self.attached.get(ptr)
            if where == "host" or (where not in ("global", None) and where != stream):
                return (f"managed {ptr:#x} is attached to {where} but stream {stream:#x} "
                        "touched it (no concurrent managed access)")
        return None

    def cpu_access(self, address: int) -> None:
        """Raise Fault when the CPU may not touch `address` now: managed memory attached to a
        stream with work in flight (or globally while any stream has), on a device without
        concurrent managed access."""
        found = self.kind_of(address)
        if found is None or found[0] != "managed" or self._concurrent():
            return
        with self.lock:
            where = self.attached.get(found[1])
            busy = [s for s, work in self.pending.items() if work]
        if (where == "global" and busy) or (where in busy):
            message = f"CPU touched managed {found[1]:#x} attached to {where} while it ran"
            self.faults.append(message)
            raise Fault(message)

    def enqueue(self, stream: int, work: Any) -> None:
        """Queue `work` (a callable) on `stream`: it runs when the stream is synchronized."""
        with self.lock:
            self.pending.setdefault(stream, []).append(work)

    def launch(self, stream: int) -> None:
        """Another worker's kernel in flight on `stream` (until it is synchronized)."""
        self.enqueue(stream, lambda: None)

    def _drain(self, stream: int) -> None:
        with self.lock:
            work, self.pending[stream] = self.pending.get(stream, []), []
        for item in work:
            item()

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

    def cudaRuntimeGetVersion(self) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaRuntimeGetVersion", ())
        return (err, None) if err else (err, 13000)

    def cudaDriverGetVersion(self) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaDriverGetVersion", ())
        return (err, None) if err else (err, 13000 if self.props is not None else 0)

    def cudaHostAlloc(self, size: int, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaHostAlloc", (size, flags))
        kind = "mapped" if flags & 2 else "pinned-host"
        return (err, None) if err else (err, self._alloc(kind, size))

    def cudaHostGetDevicePointer(self, host: int, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaHostGetDevicePointer", (host, flags))
        return (err, None) if err else (err, host)  # unified addressing: the same address

    def cudaMallocManaged(self, size: int, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaMallocManaged", (size, flags))
        if not err and int(flags) not in (1, 2):
            err = cudaError_t.cudaErrorInvalidValue
        if err:
            return err, None
        ptr = self._alloc("managed", size)
        self.attached[ptr] = ATTACH[int(flags)]
        return err, ptr

    def cudaMalloc(self, size: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaMalloc", (size,))
        return (err, None) if err else (err, self._alloc("device", size))

    def _free(self, name: str, ptr: int) -> tuple[cudaError_t]:
        err = self._enter(name, (ptr,))
        with self.lock:
            if not err and self.allocations.pop(ptr, None) is None:
                err = cudaError_t.cudaErrorInvalidValue
            self.attached.pop(ptr, None)
        return (err,)

    def cudaFree(self, ptr: int) -> tuple[cudaError_t]:
        return self._free("cudaFree", ptr)

    def cudaFreeHost(self, ptr: int) -> tuple[cudaError_t]:
        return self._free("cudaFreeHost", ptr)

    def cudaMemcpyAsync(self, dst: int, src: int, count: int, kind: cudaMemcpyKind,
                        stream: int) -> tuple[cudaError_t]:
        err = self._enter("cudaMemcpyAsync", (dst, src, count, kind, stream))
        if not err and count:  # asynchronous: the bytes move when the stream gets there
            self.enqueue(stream, lambda: ctypes.memmove(dst, src, count))
        return (err,)

    def cudaMemPrefetchAsync(self, ptr: int, count: int, *rest: Any) -> tuple[cudaError_t]:
        if self.api == 12:  # (devPtr, count, dstDevice: int, stream)
            if len(rest) != 2 or not isinstance(rest[0], int):
                raise TypeError("cudaMemPrefetchAsync(devPtr, count, dstDevice, stream)")
            return (self._enter("cudaMemPrefetchAsync", (ptr, count, rest[0], rest[1])),)
        if len(rest) != 3 or not isinstance(rest[0], cudaMemLocation):
            raise TypeError("cudaMemPrefetchAsync(devPtr, count, location, flags, stream)")
        return (self._enter("cudaMemPrefetchAsync", (ptr, count, rest[0], rest[1], rest[2])),)

    def cudaStreamAttachMemAsync(self, stream: int, ptr: int, length: int,
                                 flags: int) -> tuple[cudaError_t]:
        err = self._enter("cudaStreamAttachMemAsync", (stream, ptr, length, flags))
        if err:
            return (err,)
        found = self.kind_of(ptr)
        where = ATTACH.get(int(flags))
        if (found is None or found[0] != "managed" or found[1] != ptr or where is None
                or (where == "single" and (not stream or stream not in self.streams))):
            return (cudaError_t.cudaErrorInvalidValue,)
        size = self.allocations[ptr][1][1]
        if length not in (0, size):  # memory from cudaMallocManaged: the whole of it
            return (cudaError_t.cudaErrorInvalidValue,)
        self.attached[ptr] = stream if where == "single" else where
        return (err,)

    def cudaStreamCreateWithFlags(self, flags: int) -> tuple[cudaError_t, int | None]:
        err = self._enter("cudaStreamCreateWithFlags", (flags,))
        if err:
            return err, None
        with self.lock:
            self._next_stream += 1
            self.streams.add(self._next_stream)
            return err, self._next_stream

    def cudaStreamSynchronize(self, stream: int) -> tuple[cudaError_t]:
        err = self._enter("cudaStreamSynchronize", (stream,))
        if not err and stream and stream not in self.streams:
            return (cudaError_t.cudaErrorInvalidResourceHandle,)
        if not err:
            self._drain(stream)
        return (err,)

    def cudaStreamDestroy(self, stream: int) -> tuple[cudaError_t]:
        err = self._enter("cudaStreamDestroy", (stream,))
        self._drain(stream)  # the real one lets queued work finish first
        with self.lock:
            self.streams.discard(stream)
        return (err,)

    def _recorded(self, name: str) -> Any:
        fn = getattr(self, name)

        def call(*args: Any) -> Any:
            result = fn(*args)
            with self.lock:
                self.returns.append((name, args, len(result)))
            return result

        call.__name__ = name
        return call

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("cuda.bindings.runtime")
        for name in dir(self):
            if name.startswith("cuda") and callable(getattr(self, name)):
                setattr(mod, name, self._recorded(name))
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
    monkeypatch.setattr(sys.modules[__name__], "current", fake)
    forget_probe(monkeypatch)
    return fake


def forget_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Probe the GPU afresh in this test; the real probe comes back after it."""
    from edged.hardware import gpu, memory

    monkeypatch.setattr(gpu, "_probed", None)
    monkeypatch.setattr(memory, "_warned", set())


def uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    """No cuda-python at all: `import cuda.bindings` fails."""
    for name in ("cuda", "cuda.bindings", "cuda.bindings.runtime"):
        monkeypatch.setitem(sys.modules, name, None)
    forget_probe(monkeypatch)
