"""ONNX Runtime on a GPU: TensorRT EP options (precision, caches, workspace, the TensorRT
backend's profiles, DLA) and CUDA EP options from the config and model.yaml; IOBinding of
inputs already in CUDA memory, used only when a GPU provider really runs."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from doubles import fake_cudart
from doubles.fake_cudart import DISCRETE, JETSON, FakeCudart
from support.backends import options
from support.models import write_yaml

from edged.backends import BackendOptions, LoadSpec
from edged.backends.onnxruntime import OrtSession, device_inputs, provider_chain
from edged.memory import DeviceBufferPool
from edged.model.loadspec import engine_hints, options_for
from edged.model.repository import ModelRepository

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"
X = np.linspace(0, 1, 2 * 3 * 8 * 8, dtype=np.float32).reshape(2, 3, 8, 8)


def spec_of(repo: ModelRepository, name: str, precision: str = "fp32") -> LoadSpec:
    model = repo.resolve(name)
    return LoadSpec(name, model.version, model.onnx_path, model.inputs, model.outputs,
                    model.max_batch_size, precision, **engine_hints(model))


def test_trt_ep_options_carry_precision_workspace_and_the_backend_profile(
        repo: ModelRepository, tmp_path: Path) -> None:
    opts = BackendOptions(cache_dir=tmp_path, workspace_mb=256, dla_core=0)
    (_, trt), *_ = provider_chain(spec_of(repo, "tiny_cls", "int8"), opts, [TRT, CUDA, CPU])
    assert trt["trt_int8_enable"] is True and trt["trt_fp16_enable"] is True
    assert trt["trt_max_workspace_size"] == 256 << 20
    assert (trt["trt_dla_enable"], trt["trt_dla_core"]) == (True, 0)
    assert trt["trt_profile_min_shapes"] == "x:1x3x8x8"
    assert trt["trt_profile_max_shapes"] == trt["trt_profile_opt_shapes"] == "x:16x3x8x8"


def test_trt_ep_options_without_a_range_for_dynamic_dims_leave_profiles_to_the_ep(
        repo: ModelRepository, tmp_path: Path) -> None:
    (_, trt), *_ = provider_chain(spec_of(repo, "tiny_cnn"), BackendOptions(cache_dir=tmp_path),
                                  [TRT, CPU])
    assert not any(k.startswith("trt_profile") for k in trt)
    assert "trt_dla_enable" not in trt


def test_cuda_ep_options_come_from_model_yaml_overrides(repo_dir: Path, tmp_path: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 16\nonnxruntime: {gpu_mem_limit_mb: 512, "
               "cudnn_conv_algo_search: heuristic, workspace_mb: 128}\n")
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    opts = options_for(model, BackendOptions(cache_dir=tmp_path))
    chain = dict(provider_chain(spec_of(ModelRepository(repo_dir), "tiny_cls"), opts,
                                [TRT, CUDA, CPU]))
    assert chain[CUDA] == {"gpu_mem_limit": 512 << 20, "cudnn_conv_algo_search": "HEURISTIC"}
    assert chain[TRT]["trt_max_workspace_size"] == 128 << 20
    assert chain[CPU] == {}
    assert dict(provider_chain(spec_of(ModelRepository(repo_dir), "tiny_cls"),
                               BackendOptions(cache_dir=tmp_path), [CUDA, CPU]))[CUDA] == {}


def test_device_inputs_bind_only_mapped_or_pinned_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    assert device_inputs({"x": X}) is None  # plain memory: ONNX Runtime copies it itself
    pinned, managed = DeviceBufferPool(4, "pinned"), DeviceBufferPool(4, "managed")
    batch = pinned.concatenate("x", [X])
    ((array, address),) = (device_inputs({"x": batch}) or {}).values()
    assert array is batch and address != batch.ctypes.data  # the device mirror
    assert cuda.called("cudaStreamSynchronize") == [(0,)]
    assert device_inputs({"x": managed.concatenate("x", [X])}) is None
    pinned.close()
    managed.close()


def test_ort_session_on_cpu_never_binds_even_pool_buffers(
        monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(JETSON))
    session = OrtSession(spec_of(repo, "tiny_cls"), options(tmp_path))
    monkeypatch.setattr(OrtSession, "_run_bound", _never)
    pool = DeviceBufferPool(4, "mapped")
    out = session.infer({"x": pool.concatenate("x", [X])})
    assert out["prob"].shape == (2, 4)
    pool.close()


def test_ort_session_on_a_gpu_provider_binds_pool_buffers_by_address(
        monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(JETSON))
    session = OrtSession(spec_of(repo, "tiny_cls"), options(tmp_path))
    expected = session.infer({"x": X})["prob"]
    binding = RecordingBinding(session.ort_session)
    monkeypatch.setattr(session, "_session", FakeGpuSession(session.ort_session, binding))
    monkeypatch.setattr(session, "_on_gpu", True)  # as if CUDAExecutionProvider ran
    pool = DeviceBufferPool(4, "mapped")
    batch = pool.concatenate("x", [X])
    np.testing.assert_allclose(session.infer({"x": batch})["prob"], expected, rtol=1e-6)
    assert binding.inputs == [("x", "cuda", 0, np.float32, [2, 3, 8, 8], batch.ctypes.data)]
    assert binding.outputs == [("prob", "cpu")]
    pool.close()


def _never(*args: Any) -> Any:
    raise AssertionError("IOBinding used on the CPU path")


@dataclasses.dataclass
class RecordingBinding:
    """IOBinding's calls, recorded; the run reads the bound host-visible (mapped) memory."""

    real: Any
    inputs: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    outputs: list[tuple[Any, ...]] = dataclasses.field(default_factory=list)
    results: list[np.ndarray] = dataclasses.field(default_factory=list)

    def bind_input(self, name: str, device: str, device_id: int, dtype: Any,
                   shape: list[int], address: int) -> None:
        self.inputs.append((name, device, device_id, dtype, shape, address))

    def bind_output(self, name: str, device: str) -> None:
        self.outputs.append((name, device))

    def run(self) -> None:
        feeds: Mapping[str, np.ndarray] = {}
        for name, _dev, _id, dtype, shape, address in self.inputs:
            count = int(np.prod(shape))
            raw = (ctypes.c_uint8 * (count * np.dtype(dtype).itemsize)).from_address(address)
            feeds = {**feeds, name: np.frombuffer(raw, dtype=dtype).reshape(shape)}
        self.results = self.real.run([n for n, _ in self.outputs], feeds)

    def copy_outputs_to_cpu(self) -> list[np.ndarray]:
        return self.results


class FakeGpuSession:
    def __init__(self, real: Any, binding: RecordingBinding) -> None:
        self.real, self.binding = real, binding

    def io_binding(self) -> RecordingBinding:
        return self.binding

    def run_with_iobinding(self, binding: RecordingBinding) -> None:
        binding.run()

    def run(self, *args: Any) -> Any:
        raise AssertionError("a bound batch must not take the plain path")
