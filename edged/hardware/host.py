"""What the daemon's process and machine are using: the process's resident memory, and each
NVIDIA GPU's memory and utilisation through NVML (`nvidia-ml-py`) when there is one. Jetson
has no NVML: there the integrated GPU's figures come from sysfs (`edged.hardware.tegra`), with the
Jetson's own (temperatures, rails, clocks, power mode, throttling) from `jetson()`. Without
either there are simply no GPUs to report."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from edged.core.errors import ConfigError
from edged.hardware.tegra import Tegra, TegraStats

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuStats:
    index: int
    name: str
    memory_used_bytes: int
    memory_total_bytes: int
    utilization_percent: int | None  # None where the GPU does not report it (MIG slices)


HEAP_ARENAS = 1
# Fixed where glibc would move them (see `fix_heap_thresholds`): blocks from the first size up
# are mapped on their own and unmapped when freed; a heap keeps less than the second free at
# its top.
HEAP_MMAP_THRESHOLD_BYTES = 1 << 20
HEAP_TRIM_THRESHOLD_BYTES = 8 << 20
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's malloc.h


# The C heap's allocator (`allocator:` in the daemon config, EDGED_ALLOCATOR overrides): glibc's
# malloc tuned below, or jemalloc preloaded by re-executing the daemon (`allocator_exec`).
ALLOCATORS = ("glibc", "jemalloc", "auto")
# One arena (as HEAP_ARENAS for glibc), freed pages purged by jemalloc's own thread after ~1 s.
JEMALLOC_CONF = "narenas:1,background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0"
JEMALLOC_SONAME = "libjemalloc.so.2"
_REEXEC_MARK = "EDGED_ALLOCATOR_EXEC"  # set in the re-executed daemon: never a second time


class AllocatorMissing(ConfigError):
    """The config asks for jemalloc and it is not installed."""


def jemalloc_path() -> str | None:
    """Where jemalloc's shared library is (Debian and Ubuntu's `libjemalloc2`, JetPack's Ubuntu
    included), or None."""
    import sysconfig

    arch = sysconfig.get_config_var("MULTIARCH") or ""
    for folder in (f"/usr/lib/{arch}", f"/lib/{arch}", "/usr/lib64", "/usr/lib",
                   "/usr/local/lib"):
        candidate = Path(folder) / JEMALLOC_SONAME
        if candidate.is_file():
            return str(candidate)
    return None


def heap_allocator(maps: Path = Path("/proc/self/maps")) -> str:
    """"jemalloc" when jemalloc is mapped into this process (preloaded), else "glibc"."""
    try:
        text = maps.read_text()
    except OSError:
        return "glibc"
    return "jemalloc" if "/libjemalloc.so" in text else "glibc"


def allocator_exec(choice: str, environ: dict[str, str] | None = None,
                   library: str | None = None, current: str | None = None
                   ) -> dict[str, str] | None:
    """The environment to re-execute the daemon with so that jemalloc serves its C heap, or
    None to go on as it is: glibc asked for, jemalloc already loaded, already re-executed
    once, or (for "auto") jemalloc not installed. "jemalloc" asked for and not installed is
    an error (AllocatorMissing). MALLOC_CONF set by the operator is kept.

    Why (issue 41): every OTA swap builds a new ONNX Runtime session while requests go on and
    then frees the old one; glibc's heap keeps the holes, and RSS steps up at each swap in
    shrinking steps (the hour's soak, one heap: +1.75% after warm-up). Triton gives the same
    advice for the same cause (model load and unload under glibc's malloc: preload tcmalloc
    or jemalloc); see docs/decisions/031-the-heap-allocator.md for what each measured here."""
    env = dict(os.environ if environ is None else environ)
    if choice == "glibc" or env.get(_REEXEC_MARK):
        return None
    if (current or heap_allocator()) == "jemalloc":
        return None
    library = library or jemalloc_path()
    if library is None:
        if choice == "jemalloc":
            raise AllocatorMissing(f"allocator: jemalloc, but {JEMALLOC_SONAME} is not "
                                   "installed (Debian/Ubuntu: apt-get install libjemalloc2)")
        return None
    env["LD_PRELOAD"] = ":".join(p for p in (library, env.get("LD_PRELOAD", "")) if p)
    env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    env[_REEXEC_MARK] = "1"
    return env


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc's malloc_trim); False where the
    C library has no such call (musl, not Linux).

    Called after a model's session is closed: the memory ONNX Runtime freed sits in the
    heaps of the threads that used it, and without a trim each OTA swap under load left
    ~4-7 MB more resident (measured: 25 swaps of PP-OCR cls under 4 clients, RSS 106 -> 119
    MB untrimmed, flat at ~105 MB trimmed); a daemon meant to run for months must not
    grow with every update."""
    trim = _malloc_trim()
    return trim is not None and bool(trim(0))


def limit_heap_arenas(arenas: int = HEAP_ARENAS) -> bool:
    """Let glibc's malloc keep at most `arenas` heaps (M_ARENA_MAX) unless MALLOC_ARENA_MAX
    already says; False where there is no such call. Call it before the daemon starts threads.

    glibc gives threads that allocate at once heaps of their own, up to 8 per core, and a heap
    keeps what fragmentation strands in it. Every model load makes threads (ONNX Runtime's
    pools, the batcher's instances), so each OTA swap scattered a little more across more
    heaps: measured, 25 session swaps of PP-OCR cls under 3 callers grew RSS 3.5 MB with the
    default and 1.7 MB with 2 heaps, and the 6-minute soak (4 swaps) 2.4% against 1.0%; the
    soak's measured capacity did not drop (376 req/s default, 500 with 2 heaps: noise). The
    hot allocations are not malloc's (ONNX Runtime has its own arena, and buffers come from
    pools), so two heaps cost no measurable contention.

    One heap, not two (issue 41): a swap's new session is built on whichever thread loads it,
    and with two heaps the old session's holes were left in one heap while the new one grew
    the other. 10-minute soaks of 4 swaps, two run side by side: RSS growth after the first
    window 1.87% with two heaps, 0.74% with one, 0.86% with two and no swaps at all; the CPU
    per request the same (1.77-1.89 ms against 1.80-1.95)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False  # the operator's choice, which glibc has already applied
    libc = _libc()
    try:
        return libc is not None and bool(libc.mallopt(M_ARENA_MAX, arenas))
    except AttributeError:  # not glibc
        return False


def fix_heap_thresholds(mmap_bytes: int = HEAP_MMAP_THRESHOLD_BYTES,
                        trim_bytes: int = HEAP_TRIM_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap and trim thresholds unless the environment sets either
    (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_); False where nothing was set.

    glibc starts by mapping each block of 128 KiB or more on its own, and raises that
    threshold to the size of any mapped block freed (up to 32 MiB), with the trim threshold
    at twice it: once ONNX Runtime frees a large buffer (a session closing), heap tops may
    keep up to 64 MiB free. A heap other than the main one is trimmed only at its top, only
    past that threshold, and `malloc_trim` does not reach that top: a request body inflated
    on a worker thread (the soak's gzip bomb, 9 MiB at most under `api.max_request_mb: 8`)
    left 6 MiB resident for good.

    Blocks of 1 MiB or more are mapped: that includes ONNX Runtime's arena chunks (1 MiB,
    then doubling), which each OTA swap frees and a new session takes again; left in a heap,
    their holes fragmented it (a 7-minute soak of 4 swaps: the second heap 7.7 -> 21 MiB, 15
    MiB of it free, at 8 MiB; 2.4 -> 8.9 MiB at 1 MiB; the hour's RSS growth 4.9% -> 2.7%,
    then with the trim threshold at 1 MiB too).
    The cost: such a block is faulted in afresh each time, ~100 us a MiB here (a 720p frame
    from the decoder +0.27 ms, 1080p +0.6 ms; 640x480 frames, 0.9 MiB, stay in the heap).
    A heap's top is trimmed past 8 MiB, not 1: at 1 MiB the stream pipeline's per-frame
    buffers (OpenCV's planes, a few hundred KiB each) were given back and faulted in again
    every frame, 7 brk calls a frame, and pre-processing a 640x480 frame took 1.19 ms
    instead of 0.35."""
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") or os.environ.get("MALLOC_TRIM_THRESHOLD_"):
        return False  # the operator's choice, which glibc has already applied
    libc = _libc()
    try:
        return libc is not None and bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes)) \
            and bool(libc.mallopt(M_TRIM_THRESHOLD, trim_bytes))
    except AttributeError:  # not glibc
        return False


def _malloc_trim() -> Any:
    global _TRIM
    if _TRIM is None:
        import ctypes

        libc = _libc()
        try:
            _TRIM = libc.malloc_trim if libc is not None else False
            if _TRIM:
                _TRIM.argtypes, _TRIM.restype = [ctypes.c_size_t], ctypes.c_int
        except AttributeError:
            _TRIM = False
    return _TRIM or None


PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    """Give the calling thread its name in the kernel too (`top -H`, /proc/<pid>/task/*/comm;
    the first 15 bytes): Python names its threads for itself only. Nothing where it cannot."""
    libc = _libc()
    try:
        if libc is not None:
            libc.prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (AttributeError, OSError):  # not Linux's libc
        pass


def _libc() -> Any:
    """The C library through ctypes; None where it cannot be opened."""
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


_TRIM: Any = None


def rss_bytes() -> int | None:
    """The process's resident set size now; None where /proc is not there (not Linux)."""
    try:
        resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class Nvml:
    """NVML, initialised on first use and once only. Any failure to start it (no package, no
    driver, no library) means no GPUs, logged once; a GPU that fails a query later is left
    out of that reading."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: ModuleType | None = None
        self._tried = False

    def _started(self) -> ModuleType | None:
        with self._lock:
            if not self._tried:
                self._tried = True
                self._nvml = _start_nvml()
            return self._nvml

    def gpus(self) -> list[GpuStats]:
        nvml = self._started()
        if nvml is None:
            return []
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            logger.debug("NVML: counting GPUs failed: %s", exc)
            return []
        found = []
        for index in range(count):
            try:
                found.append(_read_gpu(nvml, index))
            except nvml.NVMLError as exc:  # e.g. a GPU that fell off the bus
                logger.debug("NVML: reading GPU %d failed: %s", index, exc)
        return found


def _start_nvml() -> ModuleType | None:
    try:
        import pynvml
    except ImportError:
        logger.info("no GPU metrics: nvidia-ml-py is not installed")
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError mostly; a driver in some other state: still no GPUs
        logger.info("no GPU metrics: NVML is not available (%s)", exc)
        return None
    return pynvml


def _read_gpu(nvml: ModuleType, index: int) -> GpuStats:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = nvml.nvmlDeviceGetName(handle)
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    try:
        utilization: int | None = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:  # not supported on this GPU or slice
        utilization = None
    return GpuStats(index, name.decode() if isinstance(name, bytes) else str(name),
                    int(memory.used), int(memory.total), utilization)


_NVML = Nvml()
TEGRA = Tegra("/")  # the one reader (and throttle counter) for the whole process


def gpus() -> list[GpuStats]:
    """Every GPU NVML sees, read now; on a Jetson (no NVML) its integrated GPU from sysfs,
    whose memory is the DRAM it shares with the CPU; [] with neither."""
    found = _NVML.gpus()
    if found:
        return found
    return jetson_gpus(TEGRA.read())


def jetson() -> TegraStats | None:
    """The Jetson's telemetry now (one sysfs pass a second at most); None off a Jetson."""
    return TEGRA.read()


def jetson_gpus(stats: TegraStats | None) -> list[GpuStats]:
    if stats is None or stats.memory_total_bytes is None:
        return []
    name = "Jetson integrated GPU" + (f" (L4T {stats.l4t})" if stats.l4t else "")
    return [GpuStats(0, name, stats.memory_used_bytes or 0, stats.memory_total_bytes,
                     None if stats.gpu_load is None else round(stats.gpu_load * 100))]
