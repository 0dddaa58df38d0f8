"""`python -m tools.bench gpu`: the numbers users pick a runtime by, on this machine's GPU.

  copies           pinned vs pageable host-to-device copies, device-to-host, and mapped
                   (zero-copy) reads, in GB/s, through edged's own buffers (gpu_copies.py)
  cuda_vs_cpu      ONNX Runtime's CUDA EP against its CPU EP (all cores) on the same models,
                   p50 at batch 1 and 8, timed interleaved
  batching         dynamic batching on (the default: delay 0) vs off (`batching: off`) on the
                   GPU, 1, 8 and 16 closed-loop clients each sending single images through
                   edged's scheduler, against direct batch-16 `session.run` (the limit)
  edged_vs_direct  `edged run` over its socket (binary tensors, edged's own load generator:
                   Triton's perf_analyzer does not fit the GPU host's transfer) against direct
                   `session.run` on a CUDA EP session, 1 and 8 clients (gpu_served.py)
  pipeline         a 640x480 camera stream through the detector with the model on the GPU:
                   the daemon's CPU per frame (decode, pre/post, tracking, MQTT), against the
                   same stream with the model on the CPU EP (gpu_served.py)

Models: PP-OCR cls (the rapidocr-onnxruntime wheel, or $EDGED_PPOCR_DIR) and a YOLO-sized
detector (gpu_models.py). Without a CUDA EP and device every case that needs one is skipped
with the reason, and the rest runs on the CPU EP with a small detector as a dry run (no GPU
number is claimed from it)."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import BackendOptions
from edged.backends.onnxruntime import OrtSession
from edged.hardware import gpu
from edged.inference.cache import ModelCache
from edged.inference.loadspec import load_spec
from edged.inference.precision import time_sessions
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from tools.bench.core import batch_counts, closed_loop, ort_session_of, rotating_rates
from tools.bench.gpu_models import write_models

CUDA_EP = "CUDAExecutionProvider"
CLIENTS = (1, 8, 16)
Inputs = dict[str, tuple[str, tuple[int, ...]]]  # model -> (input name, shape without batch)
INPUTS: Inputs = {"cls": ("x", (3, 48, 192))}  # yolo: ("images", (3, imgsz, imgsz))


def cuda_missing() -> str | None:
    import onnxruntime as ort

    if CUDA_EP not in ort.get_available_providers():
        return "this onnxruntime is the CPU build (install the `gpu` extra)"
    return None if gpu.device() else f"no CUDA device: {gpu.unavailable_reason()}"


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    from tools.bench import gpu_served

    reason = cuda_missing()
    on_gpu = reason is None
    providers = ("cuda", "cpu") if on_gpu else ("cpu",)
    imgsz = 640 if on_gpu else 160  # the dry run's detector is small: this CPU is slow
    window, rounds = (1.0, 2) if on_gpu and not quick else (0.5 if on_gpu else 0.3, 1)
    gflops = write_models(workdir / "models", imgsz=imgsz)
    inputs: Inputs = {**INPUTS, "yolo": ("images", (3, imgsz, imgsz))}
    device = gpu.device()
    results: dict[str, Any] = {
        "device": device.name if device else None, "dry_run": reason, "imgsz": imgsz,
        "providers": list(providers), "yolo_gflops": round(gflops["yolo"], 2),
        "window_s": window, "rounds": rounds}
    if device is not None:
        from tools.bench.gpu_copies import bandwidths

        results["copies"] = bandwidths(16 if quick else 64)
    else:
        results["copies"] = {"skipped": f"no CUDA device: {gpu.unavailable_reason()}"}
    results["cuda_vs_cpu"] = (cuda_vs_cpu(workdir, inputs, quick) if on_gpu
                              else {"skipped": reason})
    results["batching"] = batching(workdir, providers, inputs, window, rounds)
    results["edged_vs_direct"] = gpu_served.edged_vs_direct(workdir, providers, inputs, window,
                                                            rounds)
    results["pipeline"] = gpu_served.pipeline(workdir, providers,
                                              seconds=4 if on_gpu and not quick else 1.5)
    return results


def cuda_vs_cpu(workdir: Path, inputs: Inputs,
                quick: bool) -> list[dict[str, Any]]:
    repo = ModelRepository(workdir / "models")
    rows = []
    for name in ("cls", "yolo"):
        spec = load_spec(repo.resolve(name))
        cache = workdir / "cache"
        cuda: Any = OrtSession(spec, BackendOptions(providers=("cuda", "cpu"), cache_dir=cache))
        cpu: Any = OrtSession(spec, BackendOptions(
            providers=("cpu",), intra_op_threads=os.cpu_count() or 1, cache_dir=cache))
        input_name, shape = inputs[name]
        for batch in (1, 8):
            x = {input_name: np.random.default_rng(batch).random((batch, *shape),
                                                                 dtype=np.float32)}
            cuda_ms, cpu_ms = time_sessions([cuda, cpu], x, rounds=2 if quick else 5,
                                            budget_s=2.0 if quick else 5.0)
            rows.append({"model": name, "batch": batch, "cuda_p50_ms": cuda_ms,
                         "cpu_p50_ms": cpu_ms, "speedup": cpu_ms / cuda_ms,
                         "runs_on": cuda.providers[0]})
        cuda.close()
        cpu.close()
    return rows


def batching(workdir: Path, providers: tuple[str, ...],
             inputs: Inputs, window: float,
             rounds: int) -> list[dict[str, Any]]:
    options = BackendOptions(providers=providers, cache_dir=workdir / "cache")
    cache = ModelCache(ModelRepository(workdir / "models"), budget_bytes=8 << 30,
                       options=options)
    scheduler = Scheduler(cache)
    rows: list[dict[str, Any]] = []
    try:
        for name in ("cls", "yolo"):
            cache.load(name)
            cache.load(f"{name}_nobatch")
            input_name, shape = inputs[name]
            rng = np.random.default_rng(0)
            x1 = {input_name: rng.random((1, *shape), dtype=np.float32)}
            x16 = {input_name: rng.random((16, *shape), dtype=np.float32)}
            session = ort_session_of(cache, name)
            # Every batch size the batcher can form, once, before anything is timed: the CUDA
            # EP picks cuDNN's algorithms per input shape at its first run of that shape
            # (exhaustive search by default), which must not land in a measured window.
            for size in range(1, 17):
                session.run(None, {input_name: x16[input_name][:size]})
            ort_session_of(cache, f"{name}_nobatch").run(None, x1)
            for clients in CLIENTS:
                closed_loop(partial(scheduler.infer, name, x1), clients=min(clients, 4),
                            seconds=0.2)  # warm the threads and the batcher
                before = batch_counts(scheduler, name)
                runs: dict[str, Callable[[], tuple[int, float]]] = {
                    "on": partial(_edged, scheduler, name, x1, clients, window),
                    "off": partial(_edged, scheduler, f"{name}_nobatch", x1, clients, window)}
                if clients == max(CLIENTS):
                    runs["direct_b16"] = partial(_direct, session, x16, window)
                rates = rotating_rates(runs, rounds)
                after = batch_counts(scheduler, name)
                batches = max(1, after[1] - before[1])
                rows.append({"model": name, "clients": clients, "on_per_s": rates["on"],
                             "off_per_s": rates["off"], "gain": rates["on"] / rates["off"],
                             "mean_batch_on": (after[0] - before[0]) / batches,
                             "direct_b16_per_s": rates.get("direct_b16")})
    finally:
        scheduler.close(10)
        cache.close(timeout_s=10)
    return rows


def _edged(scheduler: Scheduler, model: str, x: dict[str, np.ndarray], clients: int,
           window: float) -> tuple[int, float]:
    """Single images from `clients` threads through edged's scheduler: (images, seconds)."""
    return closed_loop(partial(scheduler.infer, model, x), clients=clients, seconds=window)


def _direct(session: Any, x: dict[str, np.ndarray], window: float) -> tuple[int, float]:
    """Back-to-back batches on the very session edged runs: (images, seconds)."""
    calls, elapsed = closed_loop(partial(session.run, None, x), clients=1, seconds=window)
    return calls * len(next(iter(x.values()))), elapsed


def format_table(r: dict[str, Any]) -> str:
    from tools.bench.gpu_served import format_served

    head = (f"device: {r['device'] or 'none'}; providers {r['providers']}; detector "
            f"{r['imgsz']}x{r['imgsz']}, {r['yolo_gflops']} GFLOPs/frame")
    if r["dry_run"]:
        head = f"DRY RUN on the CPU EP (no GPU numbers): {r['dry_run']}\n" + head
    lines = [head, "", "| copy (edged.hardware.memory buffers) | GB/s |", "|---|---|"]
    copies = r["copies"]
    if "skipped" in copies:
        lines.append(f"| skipped: {copies['skipped']} | |")
    else:
        for key, label in (("pinned_h2d", "pinned → device (async)"),
                           ("pageable_h2d", "pageable → device"),
                           ("pinned_d2h", "device → pinned"),
                           ("mapped_read", "GPU reads mapped host memory")):
            lines.append(f"| {label}, {copies['size_mb']} MiB | {copies['gb_per_s'][key]:.1f} |")
        lines.append(f"| pinned / pageable | {copies['pinned_over_pageable']:.2f}x |")
        reads = copies["cuda_ep_reads"]
        lines += ["", f"| CUDA EP reads a {copies['size_mb']} MiB input (IOBinding) | ms | GB/s "
                  "| sum right |", "|---|---|---|---|"]
        if "skipped" in reads:
            lines.append(f"| skipped: {reads['skipped']} | | | |")
        for key, label in (("device", "in device memory (the floor)"),
                           ("mapped", "in mapped host memory, in place (zero-copy)"),
                           ("pinned_copy", "in a pinned pool buffer, copied to its mirror"),
                           ("numpy", "as plain numpy (ORT's own copy)")):
            if key in reads:
                x = reads[key]
                lines.append(f"| {label} | {x['ms']:.3f} | {x['gb_per_s']:.1f} | "
                             f"{'yes' if x['sum_ok'] else 'NO'} |")
    lines += ["", "| model | batch | ORT-CUDA p50 ms | ORT-CPU p50 ms | CUDA speedup |",
              "|---|---|---|---|---|"]
    if isinstance(r["cuda_vs_cpu"], dict):
        lines.append(f"| skipped: {r['cuda_vs_cpu']['skipped']} | | | | |")
    else:
        lines += [f"| {x['model']} | {x['batch']} | {x['cuda_p50_ms']:.3f} | "
                  f"{x['cpu_p50_ms']:.2f} | {x['speedup']:.1f}x |" for x in r["cuda_vs_cpu"]]
    lines += ["", "| model | clients | batching on (items/s, mean batch) | off (items/s) | "
              "on/off | direct b16 |", "|---|---|---|---|---|---|"]
    for x in r["batching"]:
        limit = f"{x['direct_b16_per_s']:.0f}" if x["direct_b16_per_s"] else ""
        lines.append(f"| {x['model']} | {x['clients']} | {x['on_per_s']:.0f} "
                     f"({x['mean_batch_on']:.1f}) | {x['off_per_s']:.0f} | {x['gain']:.2f}x | "
                     f"{limit} |")
    return "\n".join([*lines, "", format_served(r)])
