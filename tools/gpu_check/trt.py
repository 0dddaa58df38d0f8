"""edged's own TensorRT backend: FP16 and INT8 engines built in the background and served from
the engine cache, and the daemon's pools read in place by a two-instance TensorRT session. On a
host that installs from PyPI alone every row says it cannot run here, and why."""

from __future__ import annotations

import argparse
import dataclasses
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

from edged.backends import BackendOptions, EngineBuilding, FallBack
from edged.backends.onnxruntime import OrtSession
from edged.hardware import gpu, memory
from edged.inference.loadspec import load_spec
from edged.model.repository import ModelVersion
from tools.gpu_check.report import TOLERANCES, Report, close_enough, sample, tensorrt_missing


def int8_file(model: ModelVersion, make: bool, samples: int) -> tuple[Path | None, str]:
    """The model's gated Q/DQ variant (made first with `make`), or None and why."""
    from edged.inference.precision import int8_status

    path, why = int8_status(model)
    if path is None and make:
        try:
            from edged.ops.quantize.calibration import Sample
            from edged.ops.quantize.quantize import quantize
        except ImportError as exc:
            return None, f"cannot quantize here ({exc})"
        draws = [Sample({k: v[0] if model.max_batch_size else v
                         for k, v in sample(model, 1, seed).items()}) for seed in range(samples)]
        quantize(model, draws[: samples * 3 // 4], draws[samples * 3 // 4:], latency_rounds=1)
        path, why = int8_status(model)
    return path, why


def section_tensorrt(report: Report, models: list[ModelVersion], device: gpu.Device | None,
                     args: argparse.Namespace, sessions: dict[str, Any]) -> None:
    reason = tensorrt_missing() or (None if device else
                                    f"no CUDA device: {gpu.unavailable_reason()}")
    from edged.backends.tensorrt import TensorRTBackend

    backend = TensorRTBackend()
    for model in models:
        for precision in ("fp16", "int8"):
            check = f"{model.name} {precision}"
            if reason:
                report.skip("tensorrt", check, reason)
                continue
            path, why = (model.onnx_path, "") if precision == "fp16" else \
                int8_file(model, args.quantize, args.samples)
            if path is None:
                report.skip("tensorrt", check, why)
                continue
            report.guard("tensorrt", check, partial(_tensorrt, report, backend, model, path,
                                                    precision, args, sessions))


def _tensorrt(report: Report, backend: Any, model: ModelVersion, path: Path, precision: str,
              args: argparse.Namespace, sessions: dict[str, Any]) -> None:
    spec = load_spec(model, path, precision)
    options = BackendOptions(providers=("cpu",), cache_dir=args.cache_dir)
    started = time.perf_counter()
    try:
        session = backend.load(spec, options)
        built_s = 0.0
    except EngineBuilding as building:
        building.upgrade.result(timeout=args.build_timeout)  # type: ignore[union-attr]
        built_s = time.perf_counter() - started
        session = backend.load(spec, options)
    except FallBack as refused:
        report.add("tensorrt", f"{model.name} {precision}", False, f"not for TensorRT: {refused}")
        return
    inputs = sample(model, spec.opt_batch_size or None)
    want = OrtSession(dataclasses.replace(spec, precision="fp32"),
                      BackendOptions(providers=("cpu",), cache_dir=args.cache_dir)).infer(inputs)
    ok, detail, worst = close_enough(want, session.infer(inputs), TOLERANCES[precision])
    report.add("tensorrt", f"{model.name} {precision}", ok,
               f"{session.providers[0]}; {detail}; engine " +
               (f"built in {built_s:.1f}s" if built_s else "from the cache"),
               build_seconds=built_s, worst=worst)
    if precision == "fp16":
        sessions[model.name] = session
    else:
        session.close()


def section_pool(report: Report, models: list[ModelVersion], device: gpu.Device | None,
                 args: argparse.Namespace) -> None:
    """The pools read in place by TensorRT (ONNX Runtime's side: tools/gpu_check/ort_paths)."""
    for model in models:
        for kind in ("mapped", "managed", "pinned"):
            check = f"{model.name} {kind} tensorrt"
            reason = gpu.unavailable_reason() if device is None else tensorrt_missing()
            if reason:
                report.skip("pool", check, reason)
            elif not model.max_batch_size:
                report.skip("pool", check, "not a batched model")
            else:
                report.guard("pool", check, partial(_pool, report, model, kind, args))


def _pool(report: Report, model: ModelVersion, kind: str, args: argparse.Namespace) -> None:
    """Two instances, two threads, each writing batches of 1, opt and max rows into its own
    pool of `kind` and running them in place; every output against ORT on the CPU (fp16)."""
    from edged.backends.tensorrt import TensorRTBackend

    spec = dataclasses.replace(load_spec(model, precision="fp16"), instances=2)
    options = BackendOptions(providers=("cpu",), cache_dir=args.cache_dir, memory=kind)
    try:
        session = TensorRTBackend().load(spec, options)
    except EngineBuilding as building:
        building.upgrade.result(timeout=args.build_timeout)  # type: ignore[union-attr]
        session = TensorRTBackend().load(spec, options)
    cpu = OrtSession(dataclasses.replace(spec, precision="fp32"),
                     BackendOptions(providers=("cpu",), cache_dir=args.cache_dir))
    sizes = sorted({1, spec.opt_batch_size or 1, model.max_batch_size})
    worst: list[str] = []
    failures: list[str] = []

    def worker(seed: int) -> None:
        pool = memory.new_pool(model.max_batch_size, kind)
        try:
            for round_ in range(3):
                for rows in sizes:
                    inputs = sample(model, rows, seed * 100 + round_ * 10 + rows)
                    placed = {k: pool.concatenate(k, [v]) for k, v in inputs.items()}
                    ok, detail, _ = close_enough(cpu.infer(inputs), session.infer(placed),
                                                 TOLERANCES["fp16"])
                    worst.append(detail)
                    if not ok:
                        failures.append(f"b{rows}: {detail}")
        except Exception as exc:  # reported as this check's failure
            failures.append(f"{type(exc).__name__}: {exc}")
        finally:
            pool.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    session.close()
    report.add("pool", f"{model.name} {kind} tensorrt", not failures,
               "; ".join(failures[:3]) or f"{len(worst)} batches of {sizes} rows, 2 threads, "
               f"2 instances, in place from {memory.resolve(kind)} buffers: all within fp16",
               batches=len(worst))
