"""On a machine with an NVIDIA GPU and onnxruntime-gpu: the ONNX Runtime backend really runs on
CUDA and agrees with the CPU. Skipped, with the reason printed, everywhere else."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edged.backends import BackendOptions, LoadSpec
from edged.backends.onnxruntime import OrtSession
from edged.model.repository import ModelRepository


@pytest.mark.gpu
def test_ort_backend_when_gpu_present_runs_on_cuda_and_matches_cpu(
        repo: ModelRepository, tmp_path: Path) -> None:
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("onnxruntime here is the CPU build; install the `gpu` extra")
    model = repo.resolve("tiny_cnn")
    spec = LoadSpec("tiny_cnn", 1, model.onnx_path, model.inputs, model.outputs,
                    model.max_batch_size)
    gpu = OrtSession(spec, BackendOptions(providers=("cuda", "cpu"), cache_dir=tmp_path))
    cpu = OrtSession(spec, BackendOptions(providers=("cpu",), cache_dir=tmp_path))
    assert gpu.providers[0] == "CUDAExecutionProvider"
    x = {"image": np.random.default_rng(0).random((4, 3, 32, 32), dtype=np.float32)}
    np.testing.assert_allclose(gpu.infer(x)["logits"], cpu.infer(x)["logits"], rtol=1e-3,
                               atol=1e-4)
