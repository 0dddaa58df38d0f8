"""Triton's `perf_analyzer`, the field's yardstick, run against edged, and the server CPU each
request cost.

The last `tritonclient` wheel that ships the binary is 2.41.0 (`bin/perf_analyzer`); it needs
libb64 (Debian's `libb64-0d`) and `libcudart.so.12` (the `nvidia-cuda-runtime-cu12` wheel; no
GPU is used for HTTP) on the library path. `make bench-setup` installs both wheels into
`.cache/pa/` (a folder of its own: the 2.41.0 client would otherwise replace a newer
`tritonclient` the tests use) and libb64 with apt; `find()` looks there, then at
$EDGED_PERF_ANALYZER and on PATH."""

from __future__ import annotations

import csv
import json
import os
import resource
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERSION = "2.41.0"
REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_DIR = REPO_ROOT / ".cache" / "pa"
SETUP_HINT = ("perf_analyzer is not installed: `make bench-setup` (tritonclient[all]==2.41.0 "
              "and nvidia-cuda-runtime-cu12 into .cache/pa, libb64-0d with apt)")


@dataclass(frozen=True)
class PerfAnalyzer:
    binary: Path
    env: dict[str, str]


@dataclass(frozen=True)
class PaResult:
    infer_per_s: float
    p50_us: float
    p99_us: float
    client_cpu_s: float = 0.0  # perf_analyzer's own CPU over the whole run (it shares the box)


def find() -> PerfAnalyzer | str:
    """The binary with the environment it runs in, or why there is none."""
    candidates = [os.environ.get("EDGED_PERF_ANALYZER"), str(SETUP_DIR / "bin" / "perf_analyzer"),
                  shutil.which("perf_analyzer")]
    binary = next((Path(c) for c in candidates if c and Path(c).is_file()), None)
    if binary is None:
        return SETUP_HINT
    libs = [p for p in (binary.parent.parent / "nvidia" / "cuda_runtime" / "lib",
                        SETUP_DIR / "nvidia" / "cuda_runtime" / "lib") if p.is_dir()]
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        [str(p) for p in libs] + [v for v in [env.get("LD_LIBRARY_PATH")] if v])
    probe = subprocess.run([str(binary)], env=env, capture_output=True, text=True, timeout=30)
    if "error while loading shared libraries" in probe.stderr:
        return f"{binary} cannot start: {probe.stderr.strip()[:300]} ({SETUP_HINT})"
    return PerfAnalyzer(binary, env)


def run(pa: PerfAnalyzer, model: str, url: str, concurrency: int, *, window_ms: int,
        workdir: Path) -> PaResult:
    """One concurrency level, as a user would run it: HTTP, synchronous clients, random
    inputs, three measurement windows (averaged; no stability gate on a shared 2-core box)."""
    out = workdir / f"pa-{model}-c{concurrency}.csv"
    cmd = [str(pa.binary), "-m", model, "-u", url, "-i", "http",
           "--concurrency-range", str(concurrency), "--measurement-interval", str(window_ms),
           "--max-trials", "3", "--stability-percentage", "999", "-f", str(out)]
    before = _children_cpu_s()
    done = subprocess.run(cmd, env=pa.env, capture_output=True, text=True,
                          timeout=120 + 10 * window_ms / 1000)
    client_cpu_s = _children_cpu_s() - before
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"perf_analyzer failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr)[-1500:]}")
    with out.open() as f:
        row = next(csv.DictReader(f))
    return PaResult(float(row["Inferences/Second"]), float(row["p50 latency"]),
                    float(row["p99 latency"]), client_cpu_s)


def _children_cpu_s() -> float:
    """CPU seconds of this process's finished, waited-for children (perf_analyzer's, once its
    run returns): on a 2-core box the client's share is CPU neither edged nor ONNX Runtime
    gets, which direct `session.run` callers never pay."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds the process (all its threads) has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def served(url: str, model: str) -> int:
    """Requests edged counted for `model` (its statistics: successes and failures)."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as resp:
        stats: dict[str, Any] = json.load(resp)
    return sum(s["inference_stats"]["success"]["count"] + s["inference_stats"]["fail"]["count"]
               for s in stats["model_stats"])


class CpuMeter:
    """Server CPU per request over a span: process CPU divided by the requests edged counted
    (warm-up requests included on both sides, so the ratio stays honest)."""

    def __init__(self, pid: int, url: str, model: str) -> None:
        self.pid, self.url, self.model = pid, url, model

    def __enter__(self) -> CpuMeter:
        self.cpu0, self.count0 = process_cpu_s(self.pid), served(self.url, self.model)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu_s = process_cpu_s(self.pid) - self.cpu0
        self.requests = served(self.url, self.model) - self.count0

    @property
    def us_per_request(self) -> float:
        return self.cpu_s / max(self.requests, 1) * 1e6
