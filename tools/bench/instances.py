"""`python -m tools.bench instances`: how edged should use the cores at concurrency, measured.
PP-OCR cls (1x3x48x192) under perf_analyzer at concurrency 1 and 8, served four ways by one
daemon, with direct `session.run` (8 threads on one session) in the same run:

- batch-then-run: one instance, dynamic batching (edged before `instances: auto`): requests
  that pile up run as one batch, one batch at a time;
- auto: `instances: auto` (one per core) with batching: each free instance takes what is queued;
- run-concurrently: batching off, 8 instances: every request its own `session.run`, as many at
  once as there are clients (what the direct callers do);
- 2 instances, batching off;
- batch-then-run and auto again with a queue delay (preferred batch 16, 2 ms), as a Triton
  user would set it: the delay must not make two instances lose to one (both waiting out the
  delay on one queue did; now one instance at a time fills a batch, `Batcher._forming`).

The default (`edged.inference.instances`) was chosen by these numbers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tools.bench import perfanalyzer, yardstick
from tools.bench.api import direct_session, edged_config, run_edged
from tools.bench.assets import PPOCR_CLS, ppocr_model
from tools.bench.broker import free_port
from tools.bench.core import CLS_YAML

DELAY = "batching: {preferred_batch_sizes: [16], max_queue_delay_us: 2000}"
WAYS = {
    "cls_batch_then_run": ("batch-then-run (1 instance, batching)", "instances: 1"),
    "cls_auto": ("auto (1 instance per core, batching)", "instances: auto"),
    "cls_concurrent": ("run-concurrently (8 instances, no batching)",
                       "instances: 8\nbatching: off"),
    "cls_two": ("2 instances, no batching", "instances: 2\nbatching: off"),
    "cls_one_delay": ("batch-then-run, 2 ms queue delay", f"instances: 1\n{DELAY}"),
    "cls_auto_delay": ("auto, 2 ms queue delay", f"instances: auto\n{DELAY}"),
}


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    root = workdir / "models"
    for name, (_, extra) in WAYS.items():
        (root / name / "1").mkdir(parents=True)
        shutil.copyfile(ppocr_model(PPOCR_CLS), root / name / "1" / "model.onnx")
        (root / name / "model.yaml").write_text(CLS_YAML + extra + "\n")
    pa = perfanalyzer.find()
    if isinstance(pa, str):
        return {"skipped": pa}
    seconds = 1.0 if quick else 3.0
    port = free_port()
    x = np.random.default_rng(0).random(yardstick.SHAPES["cls"], dtype=np.float32)
    results: dict[str, Any] = {"ways": {}, "direct": {}}
    session = direct_session(root / "cls_auto" / "1" / "model.onnx")
    feed = {session.get_inputs()[0].name: x}
    config = edged_config(workdir, preload=list(WAYS), http=f"127.0.0.1:{port}")
    with run_edged(workdir, config) as (sock, proc):
        edged = yardstick.Edged(proc.pid, port, sock)
        for concurrency in yardstick.CONCURRENCY:
            results["direct"][f"c{concurrency}"] = yardstick.direct_rate(
                session, feed, concurrency, seconds)
            for name in WAYS:
                with edged.meter(name) as meter:
                    got = perfanalyzer.run(pa, name, edged.url, concurrency,
                                           window_ms=int(seconds * 1000), workdir=workdir)
                results["ways"].setdefault(name, {})[f"c{concurrency}"] = {
                    **got.__dict__, "cpu_us": meter.us_per_request}
    return results


def format_table(r: dict[str, Any]) -> str:
    if "skipped" in r:
        return f"skipped: {r['skipped']}"
    lines = ["| PP-OCR cls, perf_analyzer | c=1 infer/s | c=1 p50 µs | c=8 infer/s | "
             "c=8 vs direct | c=8 p50 µs | c=8 p99 µs | c=8 CPU µs/request |",
             "|---|---|---|---|---|---|---|---|"]
    direct = r["direct"]
    lines.append(f"| direct ORT (1 / 8 threads, one session) | {direct['c1']['infer_per_s']:.0f} | "
                 f"{direct['c1']['p50_us']:.0f} | {direct['c8']['infer_per_s']:.0f} | 1.00 | "
                 f"{direct['c8']['p50_us']:.0f} | {direct['c8']['p99_us']:.0f} | |")
    for name, (label, _) in WAYS.items():
        one, eight = r["ways"][name]["c1"], r["ways"][name]["c8"]
        lines.append(f"| {label} | {one['infer_per_s']:.0f} | {one['p50_us']:.0f} | "
                     f"{eight['infer_per_s']:.0f} | "
                     f"{eight['infer_per_s'] / direct['c8']['infer_per_s']:.2f} | "
                     f"{eight['p50_us']:.0f} | {eight['p99_us']:.0f} | "
                     f"{eight['cpu_us']:.0f} |")
    return "\n".join(lines)
