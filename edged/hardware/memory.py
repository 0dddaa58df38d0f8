"""Buffer pools that batches are assembled in, and the memory a GPU reads them from.

`HostBufferPool` is plain numpy (CPU boxes, `backends.memory: host`). `DeviceBufferPool` hands
out the same numpy views, backed by CUDA memory that a backend finds again with `locate()`:
mapped (pinned host memory the GPU reads in place: zero-copy on Jetson), managed (unified
memory, attached to the stream that reads it), or pinned host memory with a device mirror
filled by async copies (discrete GPUs). `new_pool()` picks one from the config and the device.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from edged.hardware import gpu
from edged.hardware.gpu import CudaError

logger = logging.getLogger(__name__)

STRATEGIES = ("auto", "mapped", "managed", "pinned", "host")


class BufferPool(Protocol):
    max_rows: int

    def take(self, name: str, rows: int, tail: tuple[int, ...],
             dtype: np.dtype) -> np.ndarray: ...

    def concatenate(self, name: str, parts: Sequence[np.ndarray],
                    rows: int | None = None) -> np.ndarray: ...

    def close(self) -> None: ...


def concatenate_into(pool: BufferPool, name: str, parts: Sequence[np.ndarray],
                     rows: int | None = None) -> np.ndarray:
    """Stack request arrays along axis 0 into `pool`'s buffer for `name` (one copy). With
    `rows` beyond theirs, zero rows follow them up to `rows` (a graph whose batch dim is
    fixed takes no fewer)."""
    first = parts[0]
    real = sum(p.shape[0] for p in parts)
    if first.dtype == np.object_:  # strings (BYTES) are Python objects: host memory only
        out = np.empty((max(real, rows or 0), *first.shape[1:]), dtype=np.object_)
        np.concatenate(parts, axis=0, out=out[:real])
        out[real:] = b""
        return out
    out = pool.take(name, max(real, rows or 0), first.shape[1:], first.dtype)
    np.concatenate(parts, axis=0, out=out[:real])
    out[real:] = 0  # the buffer is reused: the padding must not hold an earlier batch's rows
    return out


class HostBufferPool:
    """One reusable buffer per input name, sized for the largest batch; not thread-safe, so
    each worker thread owns one. The batch is written into it once (the one copy a request
    makes on its way to the backend)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._buffers: dict[str, np.ndarray] = {}

    def take(self, name: str, rows: int, tail: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous view of shape (rows, *tail), valid until the next take() of `name`."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[1:] != tail or buf.dtype != dtype or buf.shape[0] < rows:
            buf = np.empty((max(rows, self.max_rows), *tail), dtype=dtype)
            self._buffers[name] = buf
        return buf[:rows]

    def concatenate(self, name: str, parts: Sequence[np.ndarray],
                    rows: int | None = None) -> np.ndarray:
        return concatenate_into(self, name, parts, rows)

    def close(self) -> None:
        self._buffers.clear()


# -- CUDA buffers -----------------------------------------------------------------------------
class DeviceBuffer:
    """`nbytes` that the CPU writes through `host` (uint8) and the GPU reads at `device_ptr`.
    `to_device`/`to_host` make a byte range coherent for the GPU / the CPU on a stream; the
    caller synchronizes the stream before the CPU reads."""

    kind = "mapped"

    def __init__(self, nbytes: int, host_ptr: int, device_ptr: int) -> None:
        self.nbytes = nbytes
        self.host_ptr = host_ptr
        self.device_ptr = device_ptr
        self.host = np.ctypeslib.as_array((ctypes.c_uint8 * max(nbytes, 1)).from_address(
            host_ptr))[:nbytes]
        self.freed = False

    def address(self) -> int:
        """Where the GPU reads and writes this buffer."""
        return self.device_ptr

    def view(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        count = math.prod(shape)
        return self.host[:count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

    def attach(self, stream: int) -> None:
        """Let kernels on `stream` use the buffer (managed memory needs it; others do not)."""

    def detach(self, stream: int) -> None:
        """After the work queued on `stream`, give the buffer back to the CPU (managed memory
        needs it; the caller synchronizes `stream` before the CPU touches the buffer)."""

    def host_access(self) -> None:
        """Before the CPU writes: make sure no stream holds the buffer (managed memory)."""

    def to_device(self, stream: int, offset: int = 0, nbytes: int | None = None) -> None:
        """Mapped memory: the GPU reads the host pages themselves."""

    def to_host(self, stream: int, offset: int = 0, nbytes: int | None = None) -> None:
        """Mapped memory: the GPU wrote the host pages themselves."""

    def free(self) -> None:
        """Give the memory back to CUDA (once; later calls do nothing)."""
        if not self.freed:
            self.freed = True
            _forget(self)
            self._release(gpu.runtime())

    def _release(self, cudart: Any) -> None:
        gpu.call(cudart.cudaFreeHost, self.host_ptr)


class ManagedBuffer(DeviceBuffer):
    """Unified memory, allocated attached to the host: on devices without concurrent managed
    access (Jetson) the CPU may write it while other streams run. Before a launch it is
    attached to the launching stream (or prefetched to the GPU where access is concurrent),
    and after it attached back to the host: left attached to a stream, the next CPU write
    would fault whenever another worker's batch is running on that stream."""

    kind = "managed"

    def __init__(self, nbytes: int, ptr: int, dev: gpu.Device) -> None:
        super().__init__(nbytes, ptr, ptr)
        self._device = dev
        self._attached: int | None = None

    def attach(self, stream: int) -> None:
        if not self._device.concurrent_managed_access and self._attached != stream:
            cudart = gpu.runtime()
            # Length 0: the whole allocation (the only length allowed for this memory).
            gpu.call(cudart.cudaStreamAttachMemAsync, stream, self.device_ptr, 0,
                     cudart.cudaMemAttachSingle)
            self._attached = stream

    def detach(self, stream: int) -> None:
        if not self._device.concurrent_managed_access and self._attached is not None:
            cudart = gpu.runtime()
            gpu.call(cudart.cudaStreamAttachMemAsync, stream, self.device_ptr, 0,
                     cudart.cudaMemAttachHost)
            self._attached = None

    def host_access(self) -> None:
        if self._attached is not None:  # a backend left it on a stream: wait for that one
            stream = self._attached
            self.detach(stream)
            gpu.synchronize(stream)

    def to_device(self, stream: int, offset: int = 0, nbytes: int | None = None) -> None:
        if self._device.concurrent_managed_access:
            _prefetch(gpu.runtime(), self.device_ptr + offset,
                      self.nbytes - offset if nbytes is None else nbytes, self._device, stream)
        else:
            self.attach(stream)

    def _release(self, cudart: Any) -> None:
        gpu.call(cudart.cudaFree, self.device_ptr)


class PinnedBuffer(DeviceBuffer):
    """Page-locked host memory plus a device mirror (allocated on first use, so a model that
    runs on the CPU never costs GPU memory); the copies are async on the caller's stream."""

    kind = "pinned"

    def __init__(self, nbytes: int, host_ptr: int) -> None:
        super().__init__(nbytes, host_ptr, 0)

    def address(self) -> int:
        if not self.device_ptr:
            self.device_ptr = gpu.call(gpu.runtime().cudaMalloc, max(self.nbytes, 1))
        return self.device_ptr

    def to_device(self, stream: int, offset: int = 0, nbytes: int | None = None) -> None:
        cudart = gpu.runtime()
        count = self.nbytes - offset if nbytes is None else nbytes
        gpu.call(cudart.cudaMemcpyAsync, self.address() + offset, self.host_ptr + offset, count,
                 cudart.cudaMemcpyKind.cudaMemcpyHostToDevice, stream)

    def to_host(self, stream: int, offset: int = 0, nbytes: int | None = None) -> None:
        cudart = gpu.runtime()
        count = self.nbytes - offset if nbytes is None else nbytes
        gpu.call(cudart.cudaMemcpyAsync, self.host_ptr + offset, self.address() + offset, count,
                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream)

    def _release(self, cudart: Any) -> None:
        if self.device_ptr:
            gpu.call(cudart.cudaFree, self.device_ptr)
        gpu.call(cudart.cudaFreeHost, self.host_ptr)


def _prefetch(cudart: Any, ptr: int, nbytes: int, dev: gpu.Device, stream: int) -> None:
    try:  # CUDA 13: a cudaMemLocation and flags
        location = cudart.cudaMemLocation()
        location.type = cudart.cudaMemLocationType.cudaMemLocationTypeDevice
        location.id = dev.index
        gpu.call(cudart.cudaMemPrefetchAsync, ptr, nbytes, location, 0, stream)
    except TypeError:  # cuda-python 12 (JetPack 6): a device ordinal
        gpu.call(cudart.cudaMemPrefetchAsync, ptr, nbytes, dev.index, stream)


def allocate(kind: str, nbytes: int) -> DeviceBuffer:
    """A new buffer of `kind` (mapped | managed | pinned); CudaError when CUDA refuses."""
    cudart = gpu.runtime()
    dev = gpu.device()
    if dev is None:
        raise CudaError(f"no CUDA device: {gpu.unavailable_reason()}")
    size = max(nbytes, 1)
    buffer: DeviceBuffer
    if kind == "mapped":
        host = gpu.call(cudart.cudaHostAlloc, size, cudart.cudaHostAllocMapped)
        try:
            buffer = DeviceBuffer(nbytes, host, gpu.call(cudart.cudaHostGetDevicePointer,
                                                         host, 0))
        except CudaError:
            gpu.call(cudart.cudaFreeHost, host)
            raise
    elif kind == "managed":
        buffer = ManagedBuffer(nbytes, gpu.call(cudart.cudaMallocManaged, size,
                                                cudart.cudaMemAttachHost), dev)
    elif kind == "pinned":
        buffer = PinnedBuffer(nbytes, gpu.call(cudart.cudaHostAlloc, size,
                                               cudart.cudaHostAllocDefault))
    else:
        raise ValueError(f"unknown buffer kind {kind!r}")
    with _live_lock:
        _live[id(buffer)] = buffer
    return buffer


# Live buffers by id: a backend given an array finds the device address behind it.
_live: dict[int, DeviceBuffer] = {}
_live_lock = threading.Lock()


def _forget(buffer: DeviceBuffer) -> None:
    with _live_lock:
        _live.pop(id(buffer), None)


def locate(array: np.ndarray) -> tuple[DeviceBuffer, int] | None:
    """The CUDA buffer `array` lies in and its byte offset there, or None (plain memory)."""
    if not _live or not array.flags.c_contiguous:
        return None
    start = array.__array_interface__["data"][0]
    end = start + array.nbytes
    with _live_lock:
        for buffer in _live.values():
            if buffer.host_ptr <= start and end <= buffer.host_ptr + buffer.nbytes:
                return buffer, start - buffer.host_ptr
    return None


class DeviceBufferPool:
    """HostBufferPool's contract over CUDA buffers of one kind; owned by one worker thread,
    which closes it (freeing its buffers) when it stops. When CUDA refuses memory, batches
    go on in host memory (the backend then copies them) rather than fail."""

    def __init__(self, max_rows: int, kind: str) -> None:
        self.max_rows = max_rows
        self.kind = kind
        self._buffers: dict[str, tuple[DeviceBuffer, tuple[int, ...], np.dtype, int]] = {}
        self._host: HostBufferPool | None = None  # after CUDA refused an allocation

    def take(self, name: str, rows: int, tail: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous view of shape (rows, *tail), valid until the next take() of `name`."""
        if self._host is not None:
            return self._host.take(name, rows, tail, dtype)
        dtype = np.dtype(dtype)
        held = self._buffers.get(name)
        if held is None or held[1] != tail or held[2] != dtype or held[3] < rows:
            if held is not None:
                del self._buffers[name]
                held[0].free()
            capacity = max(rows, self.max_rows)
            try:
                buffer = allocate(self.kind, capacity * math.prod(tail) * dtype.itemsize)
            except CudaError as exc:
                _warn_once(f"{self.kind} memory refused ({exc}); batches use host memory")
                self._host = HostBufferPool(self.max_rows)
                return self._host.take(name, rows, tail, dtype)
            held = (buffer, tail, dtype, capacity)
            self._buffers[name] = held
        held[0].host_access()  # the caller writes the batch next
        return held[0].view((held[3], *tail), dtype)[:rows]

    def concatenate(self, name: str, parts: Sequence[np.ndarray],
                    rows: int | None = None) -> np.ndarray:
        return concatenate_into(self, name, parts, rows)

    def close(self) -> None:
        for buffer, *_ in self._buffers.values():
            try:
                buffer.free()
            except CudaError as exc:  # a dying context: nothing left to free
                logger.warning("freeing a %s buffer failed: %s", buffer.kind, exc)
        self._buffers.clear()


# -- choosing ---------------------------------------------------------------------------------
def resolve(strategy: str) -> str:
    """The buffer kind `strategy` means on this machine: mapped | managed | pinned | host."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown memory strategy {strategy!r} (one of {', '.join(STRATEGIES)})")
    if strategy == "host":
        return "host"
    dev = gpu.device()  # logs once why not, when there is no CUDA
    if dev is None:
        if strategy != "auto":
            _warn_once(f"memory: {strategy} asked for, but there is no CUDA here; host memory")
        return "host"
    if strategy == "auto":
        return "mapped" if dev.integrated and dev.can_map_host_memory else "pinned"
    if strategy == "mapped" and not dev.can_map_host_memory:
        _warn_once(f"memory: mapped asked for, but {dev.name} cannot map host memory; pinned")
        return "pinned"
    if strategy == "managed" and not dev.managed_memory:
        _warn_once(f"memory: managed asked for, but {dev.name} has no managed memory; pinned")
        return "pinned"
    return strategy


def new_pool(max_rows: int, strategy: str = "auto") -> HostBufferPool | DeviceBufferPool:
    """The pool a worker thread assembles batches in, as `strategy` resolves here."""
    kind = resolve(strategy)
    return HostBufferPool(max_rows) if kind == "host" else DeviceBufferPool(max_rows, kind)


def device_kind(strategy: str) -> str:
    """The buffer kind a GPU backend stages through: what `strategy` resolves to, but never
    host (the GPU needs device-visible memory); CudaError when there is no CUDA."""
    kind = resolve(strategy)
    if kind != "host":
        return kind
    dev = gpu.device()
    if dev is None:
        raise CudaError(f"no CUDA device: {gpu.unavailable_reason()}")
    return "mapped" if dev.integrated and dev.can_map_host_memory else "pinned"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        logger.warning("%s", message)
