"""The backend registry and the ONNX Runtime backend's provider chain and fallback reporting."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from edged import backends
from edged.backends import BackendOptions, LoadSpec, choose_backend, get_backend, register_backend
from edged.backends.onnxruntime import OrtSession, provider_chain, session_options
from edged.core.errors import BackendUnavailable, ModelLoadError
from edged.model.repository import ModelRepository

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"


class Unusable:
    name = "tensorrt"

    def unavailable_reason(self) -> str | None:
        return "no NVIDIA GPU"

    def load(self, spec: LoadSpec, options: BackendOptions) -> Any:
        raise AssertionError("never chosen")


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Registrations made by a test vanish with it."""
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    monkeypatch.setattr(backends, "_instances", {})
    yield


def spec_for(repo: ModelRepository, name: str, tmp_path: Path) -> LoadSpec:
    model = repo.resolve(name)
    return LoadSpec(name, model.version, model.onnx_path, model.inputs, model.outputs,
                    model.max_batch_size)


def test_choose_backend_when_auto_skips_unusable_and_logs_why(
        registry: None, caplog: pytest.LogCaptureFixture) -> None:
    register_backend("tensorrt", Unusable)
    with caplog.at_level(logging.INFO, logger="edged.backends"):
        assert choose_backend("auto").name == "onnxruntime"
    assert "backend onnxruntime chosen (tensorrt: no NVIDIA GPU)" in caplog.text


def test_choose_backend_when_named_backend_unusable_raises(registry: None) -> None:
    register_backend("tensorrt", Unusable)
    with pytest.raises(BackendUnavailable, match="tensorrt: no NVIDIA GPU"):
        choose_backend("tensorrt")


def test_get_backend_when_module_missing_or_unknown_raises_unavailable(registry: None) -> None:
    register_backend("broken", "edged.backends.nosuchmodule:Nothing")
    with pytest.raises(BackendUnavailable, match="cannot be imported"):
        get_backend("broken")
    with pytest.raises(BackendUnavailable, match="no backend named 'nope'"):
        get_backend("nope")


def test_provider_chain_when_gpu_providers_available_sets_trt_caches(tmp_path: Path,
                                                                     repo: ModelRepository) -> None:
    spec = spec_for(repo, "tiny_cls", tmp_path)
    options = BackendOptions(cache_dir=tmp_path / "cache")
    chain = provider_chain(spec, options, [TRT, CUDA, CPU])
    assert [name for name, _ in chain] == [TRT, CUDA, CPU]
    trt = chain[0][1]
    assert trt["trt_engine_cache_enable"] is True
    assert trt["trt_engine_cache_path"] == str(tmp_path / "cache" / "ort-trt" / "tiny_cls" / "1")
    assert trt["trt_timing_cache_path"] == str(tmp_path / "cache" / "ort-trt")


def test_provider_chain_when_only_cpu_installed_or_cpu_not_listed_ends_on_cpu(
        tmp_path: Path, repo: ModelRepository) -> None:
    spec = spec_for(repo, "tiny_cls", tmp_path)
    assert provider_chain(spec, BackendOptions(), [CPU]) == [(CPU, {})]
    assert [n for n, _ in provider_chain(spec, BackendOptions(providers=("cuda",)),
                                         [CUDA, CPU])] == [CUDA, CPU]


def test_session_options_when_built_set_threads_and_spinning_deliberately() -> None:
    so = session_options(BackendOptions(intra_op_threads=3, inter_op_threads=1))
    assert (so.intra_op_num_threads, so.inter_op_num_threads) == (3, 1)
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    spinning = session_options(BackendOptions(allow_spinning=True))
    assert spinning.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_ort_session_when_gpu_providers_fail_to_load_logs_one_clear_line(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repo: ModelRepository,
        caplog: pytest.LogCaptureFixture) -> None:
    """onnxruntime-gpu without CUDA: TensorRT's plugin registration raises RuntimeError (with
    enable_fallback=0), and a CUDA request silently yields a CPU session."""
    real = ort.InferenceSession
    asked: list[list[str]] = []

    def gpu_build_without_cuda(path: str, so: Any, providers: list[Any],
                               enable_fallback: int = 1) -> Any:
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        asked.append(names)
        assert enable_fallback == 0  # no stdout banner, no silent retry
        if names[0] == TRT:
            raise RuntimeError("RegisterTensorRTPluginsAsCustomOps: Please install TensorRT "
                               "libraries as mentioned in the GPU requirements page")
        return real(path, so, providers=[CPU])

    monkeypatch.setattr(ort, "get_available_providers", lambda: [TRT, CUDA, CPU])
    monkeypatch.setattr(ort, "InferenceSession", gpu_build_without_cuda)
    spec = spec_for(repo, "tiny_cls", tmp_path)
    with caplog.at_level(logging.INFO, logger="edged.backends.onnxruntime"):
        session = OrtSession(spec, BackendOptions(cache_dir=tmp_path / "cache"))
    assert asked == [[TRT, CUDA, CPU], [CUDA, CPU]]
    assert session.providers == [CPU]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1
    assert lines[0].startswith(f"tiny_cls:1: asked for {TRT}, {CUDA}, {CPU} but runs on {CPU}")
    assert "TensorrtExecutionProvider failed: RegisterTensorRTPluginsAsCustomOps" in lines[0]
    out = session.infer({"x": np.zeros((2, 3, 8, 8), np.float32)})
    assert out["prob"].shape == (2, 4)


def test_ort_session_when_file_is_corrupt_raises_model_load_error(tmp_path: Path) -> None:
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\x0a\x02xx")
    spec = LoadSpec("bad", 1, path, (), (), 0)
    with pytest.raises(ModelLoadError, match=r"bad.onnx: ONNX Runtime cannot load it"):
        OrtSession(spec, BackendOptions(providers=("cpu",), cache_dir=tmp_path))
