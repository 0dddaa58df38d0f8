"""The one place that talks to the CUDA runtime through cuda-python (`cuda.bindings.runtime`):
which GPU is here and what it can do, streams, and failed calls as `CudaError`. Without the
module, a driver or a device, `device()` is None and the log says why, once."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class CudaError(RuntimeError):
    """A CUDA runtime call failed (or cuda-python is missing)."""


@dataclass(frozen=True)
class Device:
    """The properties of one CUDA device that decide how memory and engines are handled."""

    index: int
    name: str
    major: int
    minor: int
    integrated: bool  # shares DRAM with the CPU (Jetson): mapped host memory is zero-copy
    can_map_host_memory: bool
    managed_memory: bool
    concurrent_managed_access: bool  # CPU and GPU may touch managed memory at once
    total_bytes: int

    @property
    def compute_capability(self) -> str:
        return f"{self.major}.{self.minor}"


_lock = threading.Lock()
_probed: tuple[Device | None, str | None] | None = None


def runtime() -> Any:
    """The `cuda.bindings.runtime` module; CudaError when cuda-python is not installed."""
    try:
        from cuda.bindings import runtime as cudart
    except ImportError as exc:
        try:  # cuda-python 12 before 12.6.1 (older JetPack pins) had it as cuda.cudart
            from cuda import cudart
        except ImportError:
            raise CudaError(f"cuda-python is not installed ({exc})") from exc
    return cudart


def call(fn: Callable[..., Any], *args: Any) -> Any:
    """Run one runtime call: cuda-python returns (error, values...); give back the value (a
    tuple when several, None when none) or raise CudaError naming the call and the error."""
    result = fn(*args)
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise CudaError(f"{getattr(fn, '__name__', 'cuda call')}: {error_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def error_name(err: Any) -> str:
    name = getattr(err, "name", None) or str(err)
    if name == "cudaErrorInsufficientDriver":
        return f"{name} (no NVIDIA driver, or one older than this CUDA runtime)"
    return name


def device(index: int = 0) -> Device | None:
    """Device `index` when CUDA works here, else None; probed once per process."""
    return _probe(index)[0]


def unavailable_reason(index: int = 0) -> str | None:
    """None when a CUDA device is usable, else why not (one line)."""
    return _probe(index)[1]


def reset() -> None:
    """Forget the probe (tests swap the runtime module)."""
    global _probed
    with _lock:
        _probed = None


def _probe(index: int) -> tuple[Device | None, str | None]:
    global _probed
    with _lock:
        if _probed is None:
            try:
                found = _read_device(index)
            except CudaError as exc:
                logger.info("no CUDA here (%s): host memory and CPU backends only", exc)
                _probed = (None, str(exc))
            else:
                logger.info("CUDA device %d: %s, compute capability %s, %s, %.1f GiB",
                            index, found.name, found.compute_capability,
                            "integrated" if found.integrated else "discrete",
                            found.total_bytes / 2**30)
                _probed = (found, None)
        return _probed


def _read_device(index: int) -> Device:
    cudart = runtime()
    count = call(cudart.cudaGetDeviceCount)
    if count <= index:
        raise CudaError(f"no CUDA device {index} ({count} present)")
    prop = call(cudart.cudaGetDeviceProperties, index)
    name = prop.name
    if isinstance(name, bytes):
        name = name.split(b"\0", 1)[0].decode(errors="replace")
    return Device(index, str(name), int(prop.major), int(prop.minor), bool(prop.integrated),
                  bool(prop.canMapHostMemory), bool(prop.managedMemory),
                  bool(prop.concurrentManagedAccess), int(prop.totalGlobalMem))


# -- streams ----------------------------------------------------------------------------------
def create_stream() -> int:
    """A new non-blocking stream's handle (it does not wait on the legacy default stream)."""
    cudart = runtime()
    stream = call(cudart.cudaStreamCreateWithFlags, cudart.cudaStreamNonBlocking)
    return int(stream)


def synchronize(stream: int) -> None:
    call(runtime().cudaStreamSynchronize, stream)


def destroy_stream(stream: int) -> None:
    call(runtime().cudaStreamDestroy, stream)
