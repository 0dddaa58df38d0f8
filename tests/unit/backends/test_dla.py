"""DLA per model: model.yaml's `tensorrt: {dla_core, gpu_fallback}` reaches the engine build
(fake TensorRT), a core the machine lacks becomes the GPU with one log line, the engine key
tells the placements apart, and the status and metrics say where a model runs."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from support.models import write_yaml

from edged.backends import BackendOptions
from edged.backends.engine_cache import EngineKey
from edged.backends.tensorrt import TensorRTBackend
from edged.core.errors import InvalidModel
from edged.core.states import ModelState
from edged.inference.loadspec import load_spec, options_for
from edged.inference.modelstatus import ModelStatus
from edged.model.repository import ModelRepository
from edged.service.metrics import Metrics
from tests.doubles import fake_cudart, fake_tensorrt
from tests.doubles.fake_cudart import FakeCudart
from tests.doubles.fake_tensorrt import Knobs
from tests.unit.backends.test_tensorrt_backend import DISCRETE, built


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch) -> Knobs:
    fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    return fake_tensorrt.install(monkeypatch)


def base(tmp_path: Path) -> BackendOptions:
    return BackendOptions(providers=("cpu",), intra_op_threads=1, cache_dir=tmp_path / "cache")


def test_model_yaml_dla_core_and_gpu_fallback_override_the_daemons(
        repo_dir: Path, tmp_path: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "tensorrt: {dla_core: 1, gpu_fallback: false}\n")
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    options = options_for(model, base(tmp_path))
    assert (options.dla_core, options.dla_gpu_fallback) == (1, False)
    plain = ModelRepository(repo_dir).resolve("tiny_cnn")
    daemon_wide = options_for(plain, BackendOptions(dla_core=0))
    assert (daemon_wide.dla_core, daemon_wide.dla_gpu_fallback) == (0, True)


@pytest.mark.parametrize("value", ["-1", "16", "dla"])
def test_model_yaml_when_dla_core_is_bad_names_the_key(repo_dir: Path, value: str) -> None:
    write_yaml(repo_dir, "tiny_cls", f"tensorrt: {{dla_core: {value}}}\n")
    with pytest.raises(InvalidModel, match=r"tensorrt\.dla_core"):
        ModelRepository(repo_dir).model_config("tiny_cls")


def test_model_on_dla_without_gpu_fallback_builds_for_the_core_alone(
        trt: Knobs, repo_dir: Path, tmp_path: Path) -> None:
    trt.dla_cores = 2
    write_yaml(repo_dir, "tiny_cls", "tensorrt: {dla_core: 0, gpu_fallback: false}\n")
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    session = built(TensorRTBackend(), load_spec(model), options_for(model, base(tmp_path)))
    try:
        (build,) = trt.builds
        assert build["dla_core"] == 0 and build["flags"] == ["FP16"]  # DLA: fp16, no fallback
        assert session.providers == ["TensorRT 10.13.0 fp16 DLA0"]
    finally:
        session.close()


def test_model_on_a_dla_this_machine_lacks_builds_for_the_gpu_and_says_so_once(
        trt: Knobs, repo_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_yaml(repo_dir, "tiny_cls", "tensorrt: {dla_core: 1}\n")  # a discrete GPU: no DLA
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    backend = TensorRTBackend()
    with caplog.at_level(logging.WARNING, logger="edged.backends.dla"):
        session = built(backend, load_spec(model), options_for(model, base(tmp_path)))
        session.close()
        backend.load(load_spec(model), options_for(model, base(tmp_path))).close()
    (build,) = trt.builds
    assert build["dla_core"] is None and build["flags"] == []  # the GPU, fp32 as asked
    assert session.providers == ["TensorRT 10.13.0 fp32"]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["tiny_cls:1: DLA core 1 was asked for but this machine has no DLA; "
                     "building its engine for the GPU"]


def test_engine_key_tells_dla_placements_apart() -> None:
    # GPU_FALLBACK is one of the builder flags the key carries (issue 21): a DLA engine built
    # without it is another engine.
    key = EngineKey("sha", "10.13.0", "Orin", "8.7", "fp16", (), None, 1024, ("FP16",))
    on_dla = EngineKey("sha", "10.13.0", "Orin", "8.7", "fp16", (), 0, 1024,
                       ("FP16", "GPU_FALLBACK"))
    alone = EngineKey("sha", "10.13.0", "Orin", "8.7", "fp16", (), 0, 1024, ("FP16",))
    assert len({key.digest, on_dla.digest, alone.digest}) == 3


@pytest.mark.parametrize(("backend", "providers", "device"), [
    ("tensorrt", ("TensorRT 10.3.0 int8 DLA1+GPU",), "dla1"),
    ("tensorrt", ("TensorRT 10.3.0 fp16",), "gpu"),
    ("onnxruntime", ("CUDAExecutionProvider", "CPUExecutionProvider"), "gpu"),
    ("onnxruntime", ("CPUExecutionProvider",), "cpu"),
])
def test_status_and_metrics_say_where_a_model_runs(backend: str, providers: tuple[str, ...],
                                                   device: str) -> None:
    row = ModelStatus("det", 3, ModelState.READY, backend, providers)
    assert row.device == device
    assert ModelStatus("det", 3, ModelState.UNAVAILABLE).device is None
    text = Metrics(lambda: [], lambda: [row], gpus=list, jetson=lambda: None).render().decode()
    assert (f'edged_model_device{{backend="{backend}",device="{device}",model="det",'
            'version="3"} 1.0') in text
