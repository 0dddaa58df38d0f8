"""`edged bench core`: the in-process cost of edged's scheduler and cache, and what dynamic
batching buys, against direct ONNX Runtime calls measured in the same run.

(a) concurrency 1: `Scheduler.submit(...).result()` vs `session.run` on the same model with the
    same session options, interleaved in blocks so machine noise hits both alike;
(b) concurrency 16: client threads each submitting single images, batching on vs off, against
    the direct batch-16 `session.run` loop (the limit).
A second real model (PP-OCR det) is loaded and kept warm throughout: on a 2-core box several
sessions are the normal case, and thread spinning between sessions is what hurts there.
"""

from __future__ import annotations

import json
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import BackendOptions
from edged.backends.onnxruntime import session_options
from edged.bench.assets import PPOCR_CLS, PPOCR_DET, ppocr_model, tiny_model_tools
from edged.cache import ModelCache
from edged.repository import ModelRepository
from edged.scheduler import Scheduler

CLS_YAML = """max_batch_size: 16
inputs: [{name: x, dtype: float32, shape: [3, 48, 192]}]
"""
DET_YAML = "max_batch_size: 1\nwarmup: {shapes: {x: [3, 640, 640]}}\n"


@dataclass
class Latency:
    p50_ms: float
    p99_ms: float
    mean_ms: float

    @classmethod
    def of(cls, seconds: list[float]) -> Latency:
        ms = sorted(s * 1e3 for s in seconds)
        return cls(statistics.median(ms), ms[min(len(ms) - 1, int(len(ms) * 0.99))],
                   statistics.fmean(ms))


def build_repository(root: Path) -> None:
    cls_path, det_path = ppocr_model(PPOCR_CLS), ppocr_model(PPOCR_DET)
    # As a Triton user would: aim for full batches, waiting at most 2 ms for one to fill.
    batching_on = "batching: {preferred_batch_sizes: [16], max_queue_delay_us: 2000}"
    for name, batching in (("cls", ""), ("cls_delay", batching_on),
                           ("cls_nobatch", "batching: off")):
        (root / name / "1").mkdir(parents=True)
        shutil.copyfile(cls_path, root / name / "1" / "model.onnx")
        (root / name / "model.yaml").write_text(CLS_YAML + batching + "\n")
    (root / "det" / "1").mkdir(parents=True)
    shutil.copyfile(det_path, root / "det" / "1" / "model.onnx")
    (root / "det" / "model.yaml").write_text(DET_YAML)
    tiny_model_tools().write_repository(root, names=["tiny_cls"])


def interleaved(calls: list[Callable[[], object]], *, blocks: int,
                per_block: int) -> list[list[float]]:
    """Time the calls in rotating blocks (so drift hits all alike); per-call seconds each."""
    times: list[list[float]] = [[] for _ in calls]
    for block in range(blocks):
        for k in range(len(calls)):
            which = (block + k) % len(calls)
            call = calls[which]
            for _ in range(per_block):
                started = time.perf_counter()
                call()
                times[which].append(time.perf_counter() - started)
    return times


def submit_and_wait(scheduler: Scheduler, model: str, feed: dict[str, np.ndarray]) -> object:
    return scheduler.submit(model, feed).result()


def throughput(submit_one: Callable[[], object], *, clients: int, seconds: float) -> float:
    """Requests per second with `clients` threads each calling submit_one in a loop."""
    done = [0] * clients
    start = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def client(i: int) -> None:
        start.wait()
        n = 0
        while time.perf_counter() < stop_at[0]:
            submit_one()
            n += 1
        done[i] = n

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    began = time.perf_counter()
    stop_at[0] = began + seconds
    start.wait()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - began)


def direct_loop(run: Callable[[], object], rows: int, seconds: float) -> float:
    """Rows per second of a direct call repeated for `seconds`."""
    n = 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        run()
        n += 1
    return n * rows / (time.perf_counter() - began)


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    import onnxruntime as ort

    build_repository(workdir / "models")
    options = BackendOptions(providers=("cpu",), intra_op_threads=2, allow_spinning=False,
                             cache_dir=workdir / "cache")
    cache = ModelCache(ModelRepository(workdir / "models"), budget_bytes=1 << 30, options=options)
    scheduler = Scheduler(cache)
    for name in ("det", "cls", "cls_delay", "cls_nobatch", "tiny_cls"):
        cache.load(name)
    rng = np.random.default_rng(0)
    results: dict[str, Any] = {"latency": {}, "throughput": {}}
    blocks, per_block, seconds = (4, 50, 1.0) if quick else (10, 100, 3.0)

    for name, path, shape in (("cls", ppocr_model(PPOCR_CLS), (1, 3, 48, 192)),
                              ("tiny_cls", cache.describe("tiny_cls").onnx_path, (1, 3, 8, 8))):
        x = rng.random(shape, dtype=np.float32)
        session = ort.InferenceSession(str(path), session_options(options),
                                       providers=["CPUExecutionProvider"])
        input_name = session.get_inputs()[0].name
        for _ in range(20):
            session.run(None, {input_name: x})
            scheduler.infer(name, {input_name: x})
        feed = {input_name: x}
        d, e, f = (Latency.of(t) for t in interleaved(
            [partial(session.run, None, feed), partial(scheduler.infer, name, feed),
             partial(submit_and_wait, scheduler, name, feed)], blocks=blocks, per_block=per_block))
        results["latency"][name] = {
            "direct": d.__dict__, "infer": e.__dict__, "submit": f.__dict__,
            "infer_ratio_p50": e.p50_ms / d.p50_ms, "submit_ratio_p50": f.p50_ms / d.p50_ms}

    x1 = rng.random((1, 3, 48, 192), dtype=np.float32)
    x16 = rng.random((16, 3, 48, 192), dtype=np.float32)
    session = ort.InferenceSession(str(ppocr_model(PPOCR_CLS)), session_options(options),
                                   providers=["CPUExecutionProvider"])
    session.run(None, {"x": x16})
    limit = direct_loop(lambda: session.run(None, {"x": x16}), 16, seconds)
    tput = {}
    for name in ("cls", "cls_delay", "cls_nobatch"):
        one = partial(scheduler.infer, name, {"x": x1})
        throughput(one, clients=16, seconds=0.3)  # warm the threads and the batcher
        before = _stats(scheduler, name)
        tput[name] = throughput(one, clients=16, seconds=seconds)
        after = _stats(scheduler, name)
        rows, execs = after[0] - before[0], after[1] - before[1]
        results["throughput"][name] = {"images_per_s": tput[name],
                                       "mean_batch": rows / max(1, execs)}
    results["throughput"]["direct_batch16"] = {"images_per_s": limit}
    best = max(tput["cls"], tput["cls_delay"])
    results["throughput"]["batching_speedup"] = best / tput["cls_nobatch"]
    results["throughput"]["fraction_of_limit"] = best / limit
    scheduler.close(5)
    cache.close()
    return results


def _stats(scheduler: Scheduler, name: str) -> tuple[int, int]:
    for b in scheduler.batchers():
        if b.name == name and b.version is None:
            return b.stats.inference_count, b.stats.exec_count
    return 0, 0


def format_table(r: dict[str, Any]) -> str:
    lines = ["| measurement | direct ORT | edged | ratio |", "|---|---|---|---|"]
    for name, row in r["latency"].items():
        d = row["direct"]
        for path, label in (("infer", "infer()"), ("submit", "submit().result()")):
            e = row[path]
            lines.append(f"| {name} c=1 {label} p50 / p99 (ms) | {d['p50_ms']:.3f} / "
                         f"{d['p99_ms']:.3f} | {e['p50_ms']:.3f} / {e['p99_ms']:.3f} | "
                         f"{row[path + '_ratio_p50']:.3f} |")
    t = r["throughput"]
    limit = t["direct_batch16"]["images_per_s"]
    lines.append(f"| cls c=16 direct batch-16 session.run (img/s) | {limit:.0f} | | |")
    for name, label in (("cls", "batching on, delay 0"), ("cls_delay", "batching on, 2 ms delay")):
        row = t[name]
        lines.append(f"| cls c=16 {label} (img/s, mean batch {row['mean_batch']:.1f}) | | "
                     f"{row['images_per_s']:.0f} | {row['images_per_s'] / limit:.2f} of limit |")
    lines.append(f"| cls c=16 batching off (img/s) | | {t['cls_nobatch']['images_per_s']:.0f} | "
                 f"on/off {t['batching_speedup']:.2f}x |")
    return "\n".join(lines)


def main(*, out_dir: Path, quick: bool = False) -> int:
    with tempfile.TemporaryDirectory(prefix="edged-bench-") as tmp:
        results = run_bench(Path(tmp), quick=quick)
    results["machine"] = {"python": platform.python_version(), "cpu": platform.processor()
                          or platform.machine(), "quick": quick}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "core.json").write_text(json.dumps(results, indent=2))
    print(format_table(results))
    print(f"\nwritten to {out_dir / 'core.json'}")
    return 0
