"""`python -m tools.bench instructions`: what one request costs edged in CPU instructions, counted
by valgrind's callgrind instead of timed. Instructions do not move with a shared VM's load or
with the day (the same build and requests count the same within a few percent, where CPU time
on this project's 2-core VMs has moved 2x between days), so this is the figure to compare two
commits by when a change to the request path is a few percent.

edged runs as a real daemon (`edged run`) under callgrind with counting off; after warm-up,
counting is switched on (`callgrind_control -i on`) for N requests sent back to back by one
client (concurrency 1: every request takes the same path, so the count repeats), then off and
dumped; then an idle span as long is counted and taken off (the daemon's own timers and
threads, which under valgrind's ~50x slowdown would otherwise be billed to the requests).
The count is every thread of the daemon in user space (the kernel's share, the send and
receive system calls, is not in it), split by where the instructions ran: the interpreter,
ONNX Runtime, the JSON codec, the HTTP parser, uvloop, numpy, libc, the rest. Then the floor
(`tools.bench.floor`, the least a Python server on edged's stack does per request) is counted
the same way over TCP: edged's count less the floor's is edged's own work. Needs valgrind
(Debian's `valgrind`); skipped without it."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench import api, floor, yardstick
from tools.bench.broker import free_port, stop_process
from tools.bench.load import Target, exchange

# (label, model, transport): perf_analyzer's request (binary tensors) over TCP, and over the
# Unix socket edged's own clients use.
CASES = (("tiny_cls 1x3x8x8", "tiny_cls", "tcp"), ("tiny_cls 1x3x8x8", "tiny_cls", "unix"),
         ("tiny_cls 1x3x8x8, a response cache hit", yardstick.cached("tiny_cls"), "tcp"),
         ("PP-OCR cls 1x3x48x192", "cls", "tcp"))
# Under valgrind a run takes tens of times as long, which flips edged's timing rules (which
# models run on the event loop, batch there, split a queue between instances): they are
# scaled by as much, so that each request takes the path it takes outside valgrind.
VALGRIND_SLOWDOWN = 50
_EDGED = ("import sys; from edged.inference import batcher as b; "
          + "; ".join(f"b.{name} *= {VALGRIND_SLOWDOWN}"
                      for name in ("INLINE_MAX_NS", "TOGETHER_MAX_NS", "SPREAD_MIN_NS"))
          + "; from edged.cli import main; sys.exit(main(sys.argv[1:]))")
# Where a function's instructions count, by its source file and shared object (first match).
_PARTS = (("ONNX Runtime", re.compile(r"onnxruntime")),
          ("json", re.compile(r"_json\.c")),
          ("httptools", re.compile(r"httptools|llhttp")),
          ("uvloop", re.compile(r"uvloop")),
          ("numpy", re.compile(r"numpy")),
          ("libc", re.compile(r"libc\.so|libm\.so")),
          ("interpreter", re.compile(r"libpython|Python-3\.")))
_VALGRIND = ("valgrind", "--tool=callgrind", "--instr-atstart=no")
_LINE = re.compile(r"\s*([\d,]+) \([^)]*\)\s+(.*)$")


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        return {"skipped": "valgrind is not installed (apt-get install valgrind)"}
    api.build_repository(workdir / "models")
    port = free_port()
    models = sorted({c[1] for c in CASES})
    config = api.edged_config(workdir, preload=models, http=f"127.0.0.1:{port}", threads=1,
                              mqtt="enabled: false, stats_interval_s: 86400")
    (workdir / "edged.yaml").write_text(config)
    requests = 200 if quick else 2000
    log = (workdir / "edged.log").open("w")
    out = workdir / "callgrind.out"
    proc = subprocess.Popen(
        [*_VALGRIND, f"--callgrind-out-file={out}",
         sys.executable, "-c", _EDGED, "run", "--config", str(workdir / "edged.yaml")],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        rows = [_count(proc, out, workdir, label, model, target, requests, "edged")
                for label, model, target in _targets(workdir, port)]
        replies = floor.capture_replies(f"127.0.0.1:{port}", models)
    finally:
        stop_process(proc, 60)
        log.close()
    # The floor (tools.bench.floor: the least a Python server on this stack does) counted the
    # same way: what is left of edged's count is edged's own work.
    floor_port, floor_out = free_port(), workdir / "floor-callgrind.out"
    served = {model: workdir / "models" / model / "1" / "model.onnx" for model in models
              if model in yardstick.SHAPES}
    with floor.run_floor(workdir, floor_port, served, replies, dict.fromkeys(served, 1),
                         prefix=[*_VALGRIND, f"--callgrind-out-file={floor_out}"],
                         ready_s=600) as floor_proc:
        rows += [_count(floor_proc, floor_out, workdir, label, model, target, requests, "floor")
                 for label, model, target in _targets(workdir, floor_port)
                 if target.unix is None and model in served]
    return {"rows": rows}


def _targets(workdir: Path, port: int) -> list[tuple[str, str, Target]]:
    return [(label, model, Target(unix=str(workdir / "s.sock")) if transport == "unix"
             else Target(port=port)) for label, model, transport in CASES]


def _count(proc: subprocess.Popen[bytes], out: Path, workdir: Path, label: str, model: str,
           target: Target, requests: int, server: str) -> dict[str, Any]:
    """One case's instructions per request, by part, on the server under callgrind."""
    x = np.random.default_rng(0).random(yardstick.SHAPES[model.removesuffix("_cached")],
                                        dtype=np.float32)
    request = yardstick.binary_request(model, x)
    with _Client(target, proc, workdir) as client:
        client.send(request, 50 if model == "cls" else 200)  # warm
        count = requests // 10 if model == "cls" else requests  # cls: ~25x dearer
        began = time.monotonic()
        total = _counted(proc.pid, out, partial(client.send, request, count))
        span = time.monotonic() - began
        # The daemon's own timers run on meanwhile, over ~50x as many ticks as the
        # requests would take outside valgrind: an idle span as long is counted and
        # taken off (its periodic stats and heap trim are put off, above: a burst of
        # ~40M instructions, in or out of a span, would swamp the difference).
        idle = _counted(proc.pid, out, partial(time.sleep, span))
    parts = {name: (total[name] - idle[name]) / count for name in total}
    transport = "unix" if target.unix is not None else "tcp"
    return {"case": label, "transport": transport, "server": server, "requests": count,
            "instructions_per_request": sum(parts.values()), "by_part": parts,
            "idle_per_request": sum(idle.values()) / count}


class _Client:
    """One keep-alive connection (the load generator's exchange), made once the daemon under
    valgrind answers (bounded)."""

    def __init__(self, target: Target, proc: subprocess.Popen[bytes], workdir: Path) -> None:
        self.target, self.proc, self.workdir = target, proc, workdir
        self.loop = asyncio.new_event_loop()

    def __enter__(self) -> _Client:
        deadline = time.monotonic() + 600  # an interpreter and ONNX Runtime under valgrind
        while True:
            try:
                self.reader, self.writer = self.loop.run_until_complete(self.target.connect())
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.loop.close()
                    raise RuntimeError("edged under callgrind did not come up: "
                                       f"{(self.workdir / 'edged.log').read_text()[-2000:]}"
                                       ) from None
                time.sleep(2)

    def __exit__(self, *exc: object) -> None:
        self.writer.close()
        self.loop.close()

    def send(self, request: bytes, count: int) -> None:
        """`count` requests back to back, each answered 200 before the next."""
        async def run() -> None:
            for _ in range(count):
                await exchange(self.reader, self.writer, request)

        self.loop.run_until_complete(run())


def _counted(pid: int, out: Path, work: Callable[[], object]) -> Counter[str]:
    """Instructions the daemon ran while `work()` ran, by part."""
    control = ["callgrind_control"]
    subprocess.run([*control, "-z", str(pid)], check=True, capture_output=True, timeout=120)
    subprocess.run([*control, "-i", "on", str(pid)], check=True, capture_output=True, timeout=120)
    work()
    subprocess.run([*control, "-i", "off", str(pid)], check=True, capture_output=True,
                   timeout=120)
    before = set(out.parent.glob(out.name + "*"))
    subprocess.run([*control, "-d", str(pid)], check=True, capture_output=True, timeout=120)
    deadline = time.monotonic() + 60
    while not (dumped := set(out.parent.glob(out.name + "*")) - before):
        if time.monotonic() > deadline:
            raise RuntimeError("callgrind wrote no dump")
        time.sleep(0.2)
    path = max(dumped, key=os.path.getmtime)
    time.sleep(0.5)  # written whole
    report = subprocess.run(["callgrind_annotate", "--threshold=100", str(path)],
                            capture_output=True, text=True, timeout=300, check=True).stdout
    return _by_part(report)


def _by_part(report: str) -> Counter[str]:
    parts: Counter[str] = Counter()
    for line in report.splitlines():
        match = _LINE.match(line)
        if match is None or "PROGRAM TOTALS" in line:
            continue
        where = match.group(2)
        part = next((name for name, pattern in _PARTS if pattern.search(where)), "the rest")
        parts[part] += int(match.group(1).replace(",", ""))
    return parts


def format_table(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"instructions: skipped: {r['skipped']}"
    names = [name for name, _ in _PARTS] + ["the rest"]
    lines = ["| case | transport | server | requests | k instructions/request | "
             + " | ".join(names) + " | idle, taken off |",
             "|---|---|---|---|---|" + "---|" * (len(names) + 1)]
    for row in r["rows"]:
        split = " | ".join(f"{row['by_part'].get(n, 0) / 1e3:.0f}" for n in names)
        lines.append(f"| {row['case']} | {row['transport']} | {row.get('server', 'edged')} | "
                     f"{row['requests']} | "
                     f"{row['instructions_per_request'] / 1e3:.0f} | {split} | "
                     f"{row['idle_per_request'] / 1e3:.0f} |")
    return "\n".join(lines)
