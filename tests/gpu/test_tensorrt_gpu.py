"""On a machine with an NVIDIA GPU, cuda-python and TensorRT: an engine really builds in the
background, serves from the engine cache, and agrees with ONNX Runtime on the CPU. Skipped,
with the reason printed, everywhere else (the lent GPU hosts install from PyPI alone, and
TensorRT's libraries are not there: the skip says so)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from edged.backends import BackendOptions, EngineBuilding, LoadSpec
from edged.backends.onnxruntime import OrtSession
from edged.backends.tensorrt import TensorRTBackend
from edged.hardware import gpu
from edged.inference.loadspec import engine_hints
from edged.model.repository import ModelRepository
from tools.gpu_check.report import tensorrt_missing

TOLERANCE = {"fp32": (1e-3, 1e-4), "fp16": (2e-2, 2e-3)}  # (rtol, atol)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_when_gpu_present_builds_and_matches_cpu(
        precision: str, repo: ModelRepository, tmp_path: Path) -> None:
    missing = tensorrt_missing()
    if missing:
        pytest.skip(missing)
    pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")
    if gpu.device() is None:
        pytest.skip(f"no usable CUDA device: {gpu.unavailable_reason()}")
    model = repo.resolve("tiny_cls")
    spec = LoadSpec("tiny_cls", 1, model.onnx_path, model.inputs, model.outputs,
                    model.max_batch_size, precision, **engine_hints(model))
    options = BackendOptions(providers=("cpu",), cache_dir=tmp_path / "cache")
    backend = TensorRTBackend()
    with pytest.raises(EngineBuilding) as building:
        backend.load(spec, options)
    building.value.upgrade.result(timeout=300)  # type: ignore[union-attr]
    session = backend.load(spec, options)
    x = {"x": np.random.default_rng(0).random((5, 3, 8, 8), dtype=np.float32)}
    cpu = OrtSession(dataclasses.replace(spec, precision="fp32"), options).infer(x)
    rtol, atol = TOLERANCE[precision]
    np.testing.assert_allclose(session.infer(x)["prob"], cpu["prob"], rtol=rtol, atol=atol)
    session.close()
