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
from onnxruntime.capi.onnxruntime_pybind11_state import EPFail
from support.backends import options
from support.models import write_yaml

from edged.backends import BackendOptions, LoadSpec
from edged.backends.onnxruntime import OrtSession, device_inputs, provider_chain
from edged.hardware.memory import DeviceBufferPool
from edged.inference.loadspec import engine_hints, options_for
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


# -- the TensorRT EP failing: EPFail is no RuntimeError ---------------------------------------
class ReportedSession:
    """A real CPU session that reports the providers it was asked for as running, and whose
    run() raises EPFail while the TensorRT EP heads them (a lazy engine build failing)."""

    def __init__(self, real: Any, names: list[str]) -> None:
        self.real, self.names = real, names

    def get_providers(self) -> list[str]:
        return self.names

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run(self, *args: Any) -> Any:
        if self.names[0] == TRT:
            raise EPFail("[ONNXRuntimeError] : 11 : EP_FAIL : TensorRT EP failed to create "
                         "engine from network")
        return self.real.run(*args)



def trt_ep_failing(monkeypatch: pytest.MonkeyPatch, lazy: bool) -> list[list[str]]:
    import onnxruntime

    real, asked = onnxruntime.InferenceSession, []

    def session(path: str, so: Any, providers: list[Any], **kwargs: Any) -> Any:
        names = [p[0] for p in providers]
        asked.append(names)
        if names[0] == TRT and not lazy:
            raise EPFail("[ONNXRuntimeError] : 11 : EP_FAIL : TensorRT EP failed to create "
                         "engine from network")
        return ReportedSession(real(path, so, providers=[CPU]), names)

    monkeypatch.setattr(onnxruntime, "InferenceSession", session)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [TRT, CUDA, CPU])
    return asked


@pytest.mark.parametrize("lazy", [False, True], ids=["at-load", "at-first-run"])
def test_tensorrt_ep_failing_with_epfail_drops_to_the_cuda_ep(
        lazy: bool, monkeypatch: pytest.MonkeyPatch, repo: ModelRepository,
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spec = spec_of(repo, "tiny_cls")
    want = OrtSession(spec, options(tmp_path)).infer({"x": X})["prob"]
    asked = trt_ep_failing(monkeypatch, lazy)
    session = OrtSession(spec, BackendOptions(providers=("tensorrt", "cuda", "cpu"),
                                              cache_dir=tmp_path))
    np.testing.assert_allclose(session.infer({"x": X})["prob"], want, rtol=1e-6)
    assert session.providers[0] == CUDA
    assert asked == [[TRT, CUDA, CPU], [CUDA, CPU]]
    assert "EP_FAIL" in caplog.text
    session.infer({"x": X})  # stays on the CUDA EP: no second rebuild
    assert len(asked) == 2


def test_ort_dla_turns_fp16_on_for_an_fp32_model(repo: ModelRepository, tmp_path: Path) -> None:
    """The TensorRT EP ignores trt_dla_enable unless fp16 or int8 is on."""
    opts = BackendOptions(cache_dir=tmp_path, dla_core=1)
    (_, trt), *_ = provider_chain(spec_of(repo, "tiny_cls", "fp32"), opts, [TRT, CUDA, CPU])
    assert (trt["trt_dla_enable"], trt["trt_dla_core"], trt["trt_fp16_enable"]) == (True, 1, True)
    assert trt["trt_int8_enable"] is False
