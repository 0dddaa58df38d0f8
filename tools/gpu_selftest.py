#!/usr/bin/env python3
"""edged's GPU self-test: what its GPU code paths really do on this machine.

Sections, each skipped with the reason when its library or device is missing (the rest runs):

  env       cuda-python, the CUDA device, TensorRT, ONNX Runtime's providers
  memory    mapped, managed and pinned pool buffers written by the CPU, read on the device
  ort-cuda  ONNX Runtime's CUDA EP against its CPU EP, plain and through IOBinding
  tensorrt  FP16 and INT8 engines (built by edged's TensorRT backend, served from its engine
            cache) against ONNX Runtime on the CPU; INT8 needs a Q/DQ variant that passed
            `edged quantize`'s gate (made here from random samples with --quantize)
  pool      the daemon's own path: batches of several sizes written in place into mapped,
            managed and pinned pool buffers, read by a two-instance TensorRT session from two
            threads at once, every output checked against ONNX Runtime on the CPU
  timing    p50 of TensorRT, ORT-CUDA and ORT-CPU at batch 1 and at the tuned batch size

Models: the tiny test models (tools/make_test_models.py) and PP-OCR cls/det from the
rapidocr-onnxruntime wheel. Prints a table, writes JSON to --out, exits 1 on any mismatch or
failure (0 when everything ran or was skipped; --require-gpu makes a missing GPU a failure).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

import make_test_models  # noqa: E402

from edged.backends import BackendOptions, EngineBuilding, FallBack  # noqa: E402
from edged.backends.onnxruntime import OrtSession  # noqa: E402
from edged.hardware import gpu, memory  # noqa: E402
from edged.inference.loadspec import load_spec, warmup_inputs  # noqa: E402
from edged.model.repository import ModelRepository, ModelVersion  # noqa: E402

CUDA_EP = "CUDAExecutionProvider"
# Closeness to ONNX Runtime on the CPU: max|got - want| <= atol + rtol * max|want|; INT8 by
# cosine similarity of the flattened outputs (the same Q/DQ file runs on both sides).
TOLERANCES: dict[str, dict[str, float]] = {
    "ort-cuda": {"rtol": 1e-2, "atol": 1e-3},  # cuDNN may use TF32 on Ampere and newer
    "fp32": {"rtol": 1e-3, "atol": 1e-4},
    "fp16": {"rtol": 2e-2, "atol": 2e-3},
    "int8": {"cosine": 0.99},
}
TINY = ["tiny_cls", "tiny_cnn", "tiny_two_input", "colors"]
TINY_YAML = {"tiny_cnn": make_test_models.MODEL_YAML["tiny_cnn"] + (
    "warmup: {shapes: {image: [3, 32, 32]}}\n"
    "tensorrt: {shapes: {image: {min: [3, 16, 16], opt: [3, 32, 32], max: [3, 64, 64]}}}\n")}
PPOCR_YAML = {
    "ppocr_cls": "max_batch_size: 8\ninputs: [{name: x, shape: [3, 48, 192]}]\n"
                 "batching: {preferred_batch_sizes: [8]}\n",
    "ppocr_det": "max_batch_size: 1\ninputs: [{name: x, shape: [3, -1, -1]}]\n"
                 "warmup: {shapes: {x: [3, 640, 640]}}\n"
                 "tensorrt: {shapes: {x: {min: [3, 32, 32], opt: [3, 640, 640], "
                 "max: [3, 960, 960]}}}\n",
}
QUANTIZE_YAML = "quantization: {activation_type: int8}\n"  # TensorRT takes signed INT8 only


@dataclasses.dataclass
class Row:
    section: str
    check: str
    status: str  # pass | FAIL | skip
    detail: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)


class Report:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, section: str, check: str, ok: bool, detail: str = "", **data: Any) -> None:
        self.rows.append(Row(section, check, "pass" if ok else "FAIL", detail, data))

    def skip(self, section: str, check: str, reason: str) -> None:
        self.rows.append(Row(section, check, "skip", reason))

    def guard(self, section: str, check: str, run: Callable[[], None]) -> None:
        """Run one check; an exception is that check's failure, not the self-test's end."""
        try:
            run()
        except Exception as exc:  # report it in the table and go on
            self.add(section, check, False, f"{type(exc).__name__}: {exc}"[:300])

    @property
    def failed(self) -> bool:
        return any(r.status == "FAIL" for r in self.rows)

    def table(self) -> str:
        width = max([len(r.check) for r in self.rows] + [5])
        lines = [f"{'section':<9} {'check':<{width}} result  detail",
                 f"{'-' * 9} {'-' * width} ------  {'-' * 40}"]
        lines += [f"{r.section:<9} {r.check:<{width}} {r.status:<6}  {r.detail}"
                  for r in self.rows]
        return "\n".join(lines)


# -- checks -----------------------------------------------------------------------------------
def close_enough(want: dict[str, np.ndarray], got: dict[str, np.ndarray],
                 tol: dict[str, float]) -> tuple[bool, str, dict[str, float]]:
    worst: dict[str, float] = {}
    ok = True
    for name, ref in want.items():
        ref64, out64 = ref.astype(np.float64), got[name].astype(np.float64)
        if "cosine" in tol:
            a, b = ref64.ravel(), out64.ravel()
            value = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))
            ok = ok and value >= tol["cosine"]
        else:
            value = float(np.max(np.abs(out64 - ref64))) if ref.size else 0.0
            ok = ok and value <= tol["atol"] + tol["rtol"] * float(np.max(np.abs(ref64),
                                                                          initial=0.0))
        worst[name] = value
    what = "cosine" if "cosine" in tol else "max|d|"
    return ok, ", ".join(f"{n} {what} {v:.2e}" for n, v in worst.items()), worst


def sample(model: ModelVersion, rows: int | None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the warm-up shapes with `rows` rows (batched models)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, zeros in warmup_inputs(model).items():
        shape = ((rows, *zeros.shape[1:]) if model.max_batch_size and rows else zeros.shape)
        out[name] = (rng.random(shape).astype(zeros.dtype)
                     if np.issubdtype(zeros.dtype, np.floating) else np.zeros(shape, zeros.dtype))
    return out


def section_env(report: Report) -> gpu.Device | None:
    try:
        cuda = importlib.import_module("cuda.bindings")
        report.add("env", "cuda-python", True, getattr(cuda, "__version__", "installed"))
    except ImportError as exc:
        report.skip("env", "cuda-python", f"not installed ({exc})")
    device = gpu.device()
    if device is None:
        report.skip("env", "CUDA device", gpu.unavailable_reason() or "none")
    else:
        report.add("env", "CUDA device", True, f"{device.name}, sm {device.compute_capability},"
                   f" {'integrated' if device.integrated else 'discrete'}",
                   **dataclasses.asdict(device))
    try:
        trt = importlib.import_module("tensorrt")
        report.add("env", "tensorrt", True, str(trt.__version__))
    except ImportError as exc:
        report.skip("env", "tensorrt", f"not installed ({exc})")
    import onnxruntime as ort

    report.add("env", "onnxruntime", True,
               f"{ort.__version__}: {', '.join(ort.get_available_providers())}")
    return device


def section_memory(report: Report, device: gpu.Device | None) -> None:
    for kind in ("mapped", "managed", "pinned"):
        if device is None:
            report.skip("memory", kind, f"no CUDA device: {gpu.unavailable_reason()}")
        else:
            report.guard("memory", kind, lambda kind=kind: _roundtrip(report, kind))


def _roundtrip(report: Report, kind: str) -> None:
    """16 MiB written through a pool's numpy view, made coherent on a stream, copied on the
    device and back: the bytes must survive, and the time to the device is reported."""
    cudart = gpu.runtime()
    pool = memory.DeviceBufferPool(16, kind)
    batch = pool.take("x", 16, (256, 1024), np.dtype(np.float32))
    batch[...] = np.arange(batch.size, dtype=np.float32).reshape(batch.shape) % 977
    buffer, offset = memory.locate(batch) or (None, 0)
    assert buffer is not None, "the pool's buffer is not registered"
    stream, scratch = gpu.create_stream(), gpu.call(cudart.cudaMalloc, batch.nbytes)
    back = np.zeros_like(batch)
    try:
        started = time.perf_counter()
        buffer.to_device(stream, offset, batch.nbytes)
        gpu.call(cudart.cudaMemcpyAsync, scratch, buffer.address() + offset, batch.nbytes,
                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToDevice, stream)
        gpu.synchronize(stream)
        seconds = time.perf_counter() - started
        gpu.call(cudart.cudaMemcpyAsync, back.ctypes.data, scratch, batch.nbytes,
                 cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream)
        gpu.synchronize(stream)
    finally:
        gpu.call(cudart.cudaFree, scratch)
        gpu.destroy_stream(stream)
    same = bool(np.array_equal(back, batch))
    pool.close()
    report.add("memory", kind, same, f"16 MiB to the device and back; reached it in "
               f"{seconds * 1e3:.2f} ms", gb_per_s=batch.nbytes / seconds / 1e9)


def section_ort_cuda(report: Report, models: list[ModelVersion], device: gpu.Device | None,
                     work: Path) -> None:
    import onnxruntime as ort

    reason = None if CUDA_EP in ort.get_available_providers() else \
        "this onnxruntime is the CPU build (install the `gpu` extra)"
    reason = reason or (None if device else f"no CUDA device: {gpu.unavailable_reason()}")
    for model in models:
        if reason:
            report.skip("ort-cuda", model.name, reason)
            continue
        report.guard("ort-cuda", model.name, lambda m=model: _ort_cuda(report, m, work))


def _ort_cuda(report: Report, model: ModelVersion, work: Path) -> None:
    spec = load_spec(model)
    cuda = OrtSession(spec, BackendOptions(providers=("cuda", "cpu"), cache_dir=work))
    cpu = OrtSession(spec, BackendOptions(providers=("cpu",), cache_dir=work))
    if cuda.providers[0] != CUDA_EP:
        report.add("ort-cuda", model.name, False, f"runs on {cuda.providers[0]}")
        return
    inputs = sample(model, spec.opt_batch_size or None)
    want = cpu.infer(inputs)
    ok, detail, worst = close_enough(want, cuda.infer(inputs), TOLERANCES["ort-cuda"])
    pool = memory.new_pool(max(model.max_batch_size, 1))
    pooled = {k: pool.concatenate(k, [v]) if model.max_batch_size else v
              for k, v in inputs.items()}
    from edged.backends.onnxruntime import device_inputs

    bound = device_inputs(pooled) is not None  # the IOBinding path, not ORT's own copy
    bound_ok, bound_detail, _ = close_enough(want, cuda.infer(pooled), TOLERANCES["ort-cuda"])
    pool.close()
    report.add("ort-cuda", model.name, ok and bound_ok and bound,
               f"{detail}; IOBinding {'ran' if bound else 'did NOT run'} from a "
               f"{memory.resolve('auto')} pool: {bound_detail}", max_abs=worst)


def int8_file(model: ModelVersion, make: bool, samples: int) -> tuple[Path | None, str]:
    """The model's gated Q/DQ variant (made first with --quantize), or None and why."""
    try:
        from edged.inference.precision import int8_status
    except ImportError as exc:
        return None, f"the INT8 variants are not in this edged yet ({exc})"
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
    try:
        importlib.import_module("tensorrt")
        reason = None if device else f"no CUDA device: {gpu.unavailable_reason()}"
    except ImportError as exc:
        reason = f"TensorRT is not installed ({exc})"
    from edged.backends.tensorrt import TensorRTBackend

    backend = TensorRTBackend()
    for model in models:
        for precision in ("fp16", "int8"):
            check = f"{model.name} {precision}"
            if reason:
                report.skip("tensorrt", check, reason)
                continue
            path: Path | None = model.onnx_path
            if precision == "int8":
                path, why = int8_file(model, args.quantize, args.samples)
                if path is None:
                    report.skip("tensorrt", check, why)
                    continue
            report.guard("tensorrt", check, lambda m=model, p=path, q=precision: _tensorrt(
                report, backend, m, p, q, args, sessions))


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
    for model in models:
        for kind in ("mapped", "managed", "pinned"):
            check = f"{model.name} {kind}"
            reason = gpu.unavailable_reason() if device is None else _no_tensorrt()
            if reason:
                report.skip("pool", check, reason)
            elif not model.max_batch_size:
                report.skip("pool", check, "not a batched model")
            else:
                report.guard("pool", check, lambda m=model, k=kind: _pool(report, m, k, args))


def _no_tensorrt() -> str | None:
    try:
        importlib.import_module("tensorrt")
    except ImportError as exc:
        return f"TensorRT is not installed ({exc})"
    return None


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
    report.add("pool", f"{model.name} {kind}", not failures,
               "; ".join(failures[:3]) or f"{len(worst)} batches of {sizes} rows, 2 threads, "
               f"2 instances, in place from {memory.resolve(kind)} buffers: all within fp16",
               batches=len(worst))


def section_timing(report: Report, models: list[ModelVersion], trt: dict[str, Any],
                   args: argparse.Namespace) -> None:
    import onnxruntime as ort

    from edged.inference.precision import time_sessions

    for model in models:
        candidates: dict[str, Any] = {}
        if model.name in trt:
            candidates["TensorRT fp16"] = trt[model.name]
        spec = load_spec(model)
        if CUDA_EP in ort.get_available_providers() and gpu.device() is not None:
            cuda = OrtSession(spec, BackendOptions(providers=("cuda", "cpu"),
                                                   cache_dir=args.cache_dir))
            if cuda.providers[0] == CUDA_EP:
                candidates["ORT-CUDA"] = cuda
        candidates["ORT-CPU"] = OrtSession(spec, BackendOptions(providers=("cpu",),
                                                                cache_dir=args.cache_dir))
        batches = sorted({1, spec.opt_batch_size} - {0}) if model.max_batch_size else [0]
        for rows in batches:
            inputs = sample(model, rows or None)
            p50 = time_sessions(list(candidates.values()), inputs, rounds=args.rounds,
                                budget_s=args.budget_s)
            times = dict(zip(candidates, p50, strict=True))
            check = f"{model.name} b{rows or '-'}"
            report.add("timing", check, True,
                       "  ".join(f"{k} {v:.3f} ms" for k, v in times.items()), p50_ms=times)
        for name in ("TensorRT fp16", "ORT-CUDA"):
            if name not in candidates:
                report.skip("timing", f"{model.name} {name}",
                            "no TensorRT engine (see above)" if name.startswith("TensorRT")
                            else "no ORT-CUDA session (see ort-cuda)")


# -- the run ----------------------------------------------------------------------------------
def make_repository(root: Path, which: list[str], report: Report) -> list[ModelVersion]:
    names = []
    if "tiny" in which:
        make_test_models.write_repository(root, names=TINY)
        for name in TINY:
            (root / name / "model.yaml").write_text(TINY_YAML.get(
                name, make_test_models.MODEL_YAML[name]) + QUANTIZE_YAML)
        names += TINY
    if "ppocr" in which:
        from tools.bench.assets import PPOCR_CLS, PPOCR_DET, AssetMissing, ppocr_model

        for name, file in (("ppocr_cls", PPOCR_CLS), ("ppocr_det", PPOCR_DET)):
            try:
                source = ppocr_model(file)
            except AssetMissing as exc:
                report.skip("models", name, str(exc))
                continue
            (root / name / "1").mkdir(parents=True)
            shutil.copyfile(source, root / name / "1" / "model.onnx")
            (root / name / "model.yaml").write_text(PPOCR_YAML[name] + QUANTIZE_YAML)
            names.append(name)
    repo = ModelRepository(root)
    return [repo.resolve(name) for name in names]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-selftest.json"),
                        help="JSON results (default: gpu-selftest.json)")
    parser.add_argument("--models", default="tiny,ppocr", help="tiny, ppocr or both")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="engine cache to build into and reuse (default: a temporary one)")
    parser.add_argument("--quantize", action="store_true",
                        help="make INT8 Q/DQ variants from random samples where none exists")
    parser.add_argument("--samples", type=int, default=16, help="samples for --quantize")
    parser.add_argument("--build-timeout", type=float, default=1800.0, help="seconds per build")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds")
    parser.add_argument("--budget-s", type=float, default=10.0, help="timing budget per case")
    parser.add_argument("--quick", action="store_true", help="one timing round, 1s budget")
    parser.add_argument("--require-gpu", action="store_true",
                        help="a machine without a usable CUDA device fails the self-test")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.budget_s = 1, 1.0
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report()
    with tempfile.TemporaryDirectory(prefix="edged-gpu-selftest-") as tmp:
        args.cache_dir = args.cache_dir or Path(tmp) / "cache"
        device = section_env(report)
        section_memory(report, device)
        models = make_repository(Path(tmp) / "models", args.models.split(","), report)
        section_ort_cuda(report, models, device, Path(tmp))
        engines: dict[str, Any] = {}
        section_tensorrt(report, models, device, args, engines)
        section_pool(report, models, device, args)
        section_timing(report, models, engines, args)
        for session in engines.values():
            session.close()
    if args.require_gpu and device is None:
        report.add("env", "--require-gpu", False, "no usable CUDA device")
    print(report.table())
    result = {"ok": not report.failed, "tolerances": TOLERANCES,
              "machine": {"python": platform.python_version(), "platform": platform.platform(),
                          "device": dataclasses.asdict(device) if device else None},
              "rows": [dataclasses.asdict(r) for r in report.rows]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"\n{'FAILED' if report.failed else 'ok'}; written to {args.out}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
