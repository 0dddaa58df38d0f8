"""The device itself: cuda-python and the CUDA runtime probe, NVML's figures, TensorRT and ONNX
Runtime as installed; each pool kind's memory reaching the device; the CUDA EP against the CPU
EP; and p50 timings of what runs here."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import platform
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import BackendOptions
from edged.backends.onnxruntime import OrtSession, device_inputs
from edged.hardware import gpu, host, memory
from edged.inference.loadspec import load_spec
from edged.model.repository import ModelVersion
from tools.gpu_check.report import (
    CUDA_EP,
    TOLERANCES,
    Report,
    close_enough,
    sample,
    tensorrt_missing,
)


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
        versions = cuda_versions()
        report.add("env", "CUDA device", True, f"{device.name}, sm {device.compute_capability},"
                   f" {'integrated' if device.integrated else 'discrete'}, "
                   f"{device.total_bytes / 2**30:.1f} GiB; runtime {versions['runtime']}, "
                   f"driver API {versions['driver']}", **dataclasses.asdict(device), **versions)
    report.guard("env", "NVML", lambda: _nvml(report, device))
    missing = tensorrt_missing()
    if missing:
        report.skip("env", "tensorrt", missing)
    else:
        report.add("env", "tensorrt", True, str(importlib.import_module("tensorrt").__version__))
    import onnxruntime as ort

    report.add("env", "onnxruntime", True,
               f"{ort.__version__}: {', '.join(ort.get_available_providers())}")
    return device


def cuda_versions() -> dict[str, str]:
    """The CUDA runtime's and the driver's API versions, as 13.0 (unknown when not read)."""
    out = {}
    for key in ("runtime", "driver"):
        try:
            cudart = gpu.runtime()
            call = cudart.cudaRuntimeGetVersion if key == "runtime" else \
                cudart.cudaDriverGetVersion
            value = int(gpu.call(call))
            out[key] = f"{value // 1000}.{value % 1000 // 10}"
        except (gpu.CudaError, AttributeError, TypeError):
            out[key] = "unknown"
    return out


def _nvml(report: Report, device: gpu.Device | None) -> None:
    """What /metrics and the stats message read: NVML's memory and utilisation per GPU."""
    gpus = host.gpus()
    if not gpus:
        if device is None:
            report.skip("env", "NVML", "no GPU metrics here (no NVML, or no GPU)")
        else:
            report.add("env", "NVML", False, f"CUDA sees {device.name} but NVML reports no "
                       "GPU: /metrics and the stats message would show none")
        return
    first = gpus[0]
    ok = first.memory_total_bytes > 0 and 0 < first.memory_used_bytes <= first.memory_total_bytes
    report.add("env", "NVML", ok, f"{len(gpus)} GPU(s): {first.name}, "
               f"{first.memory_used_bytes / 2**20:.0f} of {first.memory_total_bytes / 2**20:.0f}"
               f" MiB used, utilisation {first.utilization_percent}%; driver {driver_version()}",
               gpus=[dataclasses.asdict(g) for g in gpus])


def driver_version() -> str:
    try:
        import pynvml

        value = pynvml.nvmlSystemGetDriverVersion()
        return value.decode() if isinstance(value, bytes) else str(value)
    except Exception:  # no NVML here: the version is simply not known
        return "unknown"


def machine(device: gpu.Device | None) -> dict[str, Any]:
    """What the results were measured on, for the JSON."""
    import onnxruntime as ort

    return {"python": platform.python_version(), "platform": platform.platform(),
            "device": dataclasses.asdict(device) if device else None,
            "driver": driver_version(), "cuda": cuda_versions() if device else None,
            "onnxruntime": ort.__version__, "providers": ort.get_available_providers(),
            "numpy": np.__version__}


# -- memory -----------------------------------------------------------------------------------
def section_memory(report: Report, device: gpu.Device | None) -> None:
    for kind in ("mapped", "managed", "pinned"):
        if device is None:
            report.skip("memory", kind, f"no CUDA device: {gpu.unavailable_reason()}")
        else:
            report.guard("memory", kind, partial(_roundtrip, report, kind))


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


# -- ONNX Runtime's CUDA EP -------------------------------------------------------------------
def cuda_ep_missing(device: gpu.Device | None) -> str | None:
    """None when ONNX Runtime's CUDA EP can run here, else why not."""
    import onnxruntime as ort

    if CUDA_EP not in ort.get_available_providers():
        return "this onnxruntime is the CPU build (install the `gpu` extra)"
    return None if device else f"no CUDA device: {gpu.unavailable_reason()}"


def section_ort_cuda(report: Report, models: list[ModelVersion], device: gpu.Device | None,
                     work: Path) -> None:
    reason = cuda_ep_missing(device)
    for model in models:
        if reason:
            report.skip("ort-cuda", model.name, reason)
            continue
        report.guard("ort-cuda", model.name, partial(_ort_cuda, report, model, work))


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
    bound = device_inputs(pooled) is not None  # the IOBinding path, not ORT's own copy
    bound_ok, bound_detail, _ = close_enough(want, cuda.infer(pooled), TOLERANCES["ort-cuda"])
    pool.close()
    report.add("ort-cuda", model.name, ok and bound_ok and bound,
               f"{detail}; IOBinding {'ran' if bound else 'did NOT run'} from a "
               f"{memory.resolve('auto')} pool: {bound_detail}", max_abs=worst)


# -- timing -----------------------------------------------------------------------------------
def section_timing(report: Report, models: list[ModelVersion], trt: dict[str, Any],
                   args: argparse.Namespace) -> None:
    from edged.inference.precision import time_sessions

    for model in models:
        candidates: dict[str, Any] = {}
        if model.name in trt:
            candidates["TensorRT fp16"] = trt[model.name]
        spec = load_spec(model)
        if cuda_ep_missing(gpu.device()) is None:
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
                            (tensorrt_missing() or "no TensorRT engine (see above)")
                            if name.startswith("TensorRT")
                            else "no ORT-CUDA session (see ort-cuda)")
