"""Process memory from /proc, and GPUs through a stand-in for NVML's `pynvml` module (this
machine has no GPU): what it reports, and that a missing package or driver means no GPUs,
said once, never an error."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from edged.hardware import host
from edged.hardware.host import GpuStats, Nvml, rss_bytes


class FakeNvml(types.ModuleType):
    """The few pynvml calls edged makes, over a list of GPUs; `None` for a field the GPU does
    not support, an exception instance to raise it."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[dict[str, Any]], init_error: str | None = None) -> None:
        super().__init__("pynvml")
        self.gpus = gpus
        self.init_error = init_error
        self.inits = 0

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error is not None:
            raise self.NVMLError(self.init_error)

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> dict[str, Any]:
        return self.gpus[index]

    def nvmlDeviceGetName(self, handle: dict[str, Any]) -> str | bytes:
        return self._field(handle, "name")

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, Any]) -> types.SimpleNamespace:
        used, total = self._field(handle, "memory")
        return types.SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, Any]) -> types.SimpleNamespace:
        return types.SimpleNamespace(gpu=self._field(handle, "gpu"), memory=0)

    def _field(self, handle: dict[str, Any], key: str) -> Any:
        value = handle[key]
        if value is None:
            raise self.NVMLError("Not Supported")
        return value


def test_gpus_when_nvml_sees_gpus_reports_memory_and_utilisation_each(
        monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml([
        {"name": "NVIDIA H100 80GB HBM3", "memory": (3 << 30, 80 << 30), "gpu": 42},
        {"name": b"NVIDIA A100-SXM4-40GB MIG 1g.5gb", "memory": (1 << 20, 5 << 30),
         "gpu": None},  # a MIG slice: no utilisation, and an older pynvml's bytes name
        {"name": None, "memory": (0, 0), "gpu": 0},  # a GPU that fails its queries
    ])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    reader = Nvml()
    assert reader.gpus() == [
        GpuStats(0, "NVIDIA H100 80GB HBM3", 3 << 30, 80 << 30, 42),
        GpuStats(1, "NVIDIA A100-SXM4-40GB MIG 1g.5gb", 1 << 20, 5 << 30, None)]
    reader.gpus()
    assert nvml.inits == 1  # NVML is started once, not per reading


def test_gpus_when_the_driver_has_no_nvml_reports_none_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    nvml = FakeNvml([], init_error="NVML Shared Library Not Found")
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    reader = Nvml()
    with caplog.at_level(logging.INFO, logger="edged.hardware.host"):
        assert reader.gpus() == [] and reader.gpus() == []
    assert nvml.inits == 1
    assert [r.getMessage() for r in caplog.records] == [
        "no GPU metrics: NVML is not available (NVML Shared Library Not Found)"]


def test_gpus_when_nvidia_ml_py_is_not_installed_reports_none(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with caplog.at_level(logging.INFO, logger="edged.hardware.host"):
        assert Nvml().gpus() == []
    assert "nvidia-ml-py is not installed" in caplog.text


def test_rss_bytes_when_on_linux_is_the_resident_size_now() -> None:
    rss = rss_bytes()
    status = dict(line.split(":", 1) for line in
                  Path("/proc/self/status").read_text().splitlines() if ":" in line)
    peak = int(status["VmHWM"].split()[0]) * 1024  # the most it has ever been resident
    assert rss is not None and 0 < rss <= peak


def test_trim_heap_when_glibc_gives_free_pages_back() -> None:
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_trim is glibc's")
    blocks = [ctypes.create_string_buffer(1 << 16) for _ in range(2000)]  # ~128 MB of heap
    del blocks
    assert host.trim_heap() is True  # something was released


ARENA_PROBE = """
import ctypes, sys, threading
from edged.hardware import host
if sys.argv[1] == "limit":
    assert host.limit_heap_arenas(2) is True
elif sys.argv[1] == "edged":
    assert host.limit_heap_arenas() is True  # `edged run`'s own limit
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
together = threading.Barrier(7)

def allocate():
    libc.malloc(4096)  # a thread's first malloc picks (or makes) its heap
    together.wait()    # all alive at once: no heap is handed on by a thread that ended

threads = [threading.Thread(target=allocate) for _ in range(6)]
for t in threads:
    t.start()
together.wait()
libc.malloc_stats()  # one "Arena N:" block per heap, on stderr
for t in threads:
    t.join()
"""


@pytest.mark.parametrize("mode, env, most", [("limit", {}, 2), ("default", {}, None),
                                             ("limit", {"MALLOC_ARENA_MAX": "3"}, 3),
                                             ("edged", {}, 1)])
def test_heap_arenas_are_limited_before_threads_start(mode: str, env: dict[str, str],
                                                      most: int | None) -> None:
    """Six threads allocating at once get heaps of their own by default; after
    limit_heap_arenas(2) they share two, and all share one at `edged run`'s default; an
    operator's MALLOC_ARENA_MAX is left as it is."""
    import os
    import platform
    import subprocess

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("M_ARENA_MAX is glibc's")
    # The operator's setting wins: limit_heap_arenas says it changed nothing.
    probe = ARENA_PROBE.replace("is True", "is False") if env else ARENA_PROBE
    done = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=True)
    arenas = done.stderr.count("Arena ")
    if most is None:
        assert arenas >= 5  # glibc's default allows 8 per core
    else:
        assert 1 <= arenas <= most


HEAP_TOP_PROBE = """
import ctypes, sys, threading
from edged.hardware import host
host.limit_heap_arenas(2)  # two heaps, as `edged run` kept before 67cd41a: a non-main heap in play
if sys.argv[1] == "fixed":
    assert host.fix_heap_thresholds() is True
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes, libc.memset.argtypes = [ctypes.c_void_p], [ctypes.c_void_p, ctypes.c_int,
                                                                 ctypes.c_size_t]
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096
big = libc.malloc(24 << 20)  # a large block mapped and freed (a session closing) ...
libc.memset(big, 1, 24 << 20)
libc.free(big)  # ... raises glibc's thresholds, unless they are fixed
together = threading.Barrier(4)
def body():  # a worker inflating a body: 9 MiB in 1 MiB parts, then all freed
    together.wait()  # allocating at once: threads land on the second heap too
    parts = [libc.malloc(1 << 20) for _ in range(9)]
    for part in parts:
        libc.memset(part, 1, 1 << 20)
    together.wait()
    for part in parts:
        libc.free(part)
before = rss()
threads = [threading.Thread(target=body) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
libc.malloc_trim(0)
print((rss() - before) / (1 << 20))
"""


@pytest.mark.parametrize("mode", ["default", "fixed"])
def test_freed_blocks_at_a_second_heaps_top_go_back_once_thresholds_are_fixed(
        mode: str) -> None:
    """After a large mapped block is freed, glibc's default lets the top of a second heap keep
    what worker threads freed there (malloc_trim does not reach it): 4 threads freeing 9 MiB
    each left >8 MiB resident. With fix_heap_thresholds, as `edged run` calls it, it goes back
    (the soak's gzip bomb left 6 MiB for good)."""
    import platform
    import subprocess

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("the thresholds are glibc's")
    done = subprocess.run([sys.executable, "-c", HEAP_TOP_PROBE, mode], capture_output=True,
                          text=True, timeout=60, check=True)
    kept_mb = float(done.stdout)
    if mode == "default":
        assert kept_mb > 8
    else:
        assert kept_mb < 2


def test_heap_thresholds_set_by_the_operator_are_left_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, param: int, value: int) -> int:
            calls.append((param, value))
            return 1

    monkeypatch.setattr(host, "_libc", Libc)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert host.fix_heap_thresholds(1 << 20, 8 << 20) is True
    assert calls == [(host.M_MMAP_THRESHOLD, 1 << 20), (host.M_TRIM_THRESHOLD, 8 << 20)]
    calls.clear()
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert host.fix_heap_thresholds() is False
    assert calls == []


# The C heap's allocator: when the daemon re-executes itself with jemalloc preloaded.
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


def test_allocator_exec_when_auto_and_installed_preloads_jemalloc_before_the_rest() -> None:
    env = host.allocator_exec("auto", {"LD_PRELOAD": "/opt/x.so", "PATH": "/bin"},
                              library=JEMALLOC, current="glibc")
    assert env == {"LD_PRELOAD": f"{JEMALLOC}:/opt/x.so", "PATH": "/bin",
                   "MALLOC_CONF": host.JEMALLOC_CONF, "EDGED_ALLOCATOR_EXEC": "1"}


def test_allocator_exec_keeps_the_operators_malloc_conf() -> None:
    env = host.allocator_exec("jemalloc", {"MALLOC_CONF": "narenas:4"}, library=JEMALLOC,
                              current="glibc")
    assert env is not None and env["MALLOC_CONF"] == "narenas:4"
    assert env["LD_PRELOAD"] == JEMALLOC


@pytest.mark.parametrize(("choice", "environ", "current"), [
    ("glibc", {}, "glibc"),                             # asked for glibc
    ("auto", {}, "jemalloc"),                           # already preloaded (by the unit, say)
    ("jemalloc", {"EDGED_ALLOCATOR_EXEC": "1"}, "glibc"),  # re-executed once: never twice
])
def test_allocator_exec_when_nothing_to_do_goes_on_as_it_is(
        choice: str, environ: dict[str, str], current: str) -> None:
    assert host.allocator_exec(choice, environ, library=JEMALLOC, current=current) is None


def test_allocator_exec_when_jemalloc_is_missing_auto_stays_on_glibc_and_jemalloc_is_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "jemalloc_path", lambda: None)
    assert host.allocator_exec("auto", {}, current="glibc") is None
    with pytest.raises(host.AllocatorMissing, match="apt-get install libjemalloc2"):
        host.allocator_exec("jemalloc", {}, current="glibc")


def test_heap_allocator_reads_the_process_maps(tmp_path: Path) -> None:
    maps = tmp_path / "maps"
    maps.write_text(f"7f00-7f10 r-xp 00000000 08:01 42 {JEMALLOC}\n")
    assert host.heap_allocator(maps) == "jemalloc"
    maps.write_text("7f00-7f10 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert host.heap_allocator(maps) == "glibc"
    assert host.heap_allocator(tmp_path / "absent") == "glibc"
    assert host.heap_allocator() == ("jemalloc" if "libjemalloc" in
                                     Path("/proc/self/maps").read_text() else "glibc")
