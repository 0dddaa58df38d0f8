"""The TensorRT backend against doubles of `tensorrt` and cuda-python: when it is usable, the
background build and the engine cache behind `load()`, the fall-backs (no module, no GPU, a
failed build, a damaged engine, a model it cannot profile), and sessions that run one context
and stream per instance, reading the batcher's CUDA buffers in place."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from doubles import fake_cudart, fake_tensorrt
from doubles.fake_cudart import DISCRETE, FakeCudart
from doubles.fake_tensorrt import Knobs
from support.models import qdq_model

from edged import backends
from edged.backends import BackendOptions, EngineBuilding, FallBack, LoadSpec, choose_backend
from edged.backends.onnxruntime import OrtSession
from edged.backends.tensorrt import TensorRTBackend, TrtSession
from edged.backends.trt_build import BuildError
from edged.core.errors import InvalidInput
from edged.hardware.memory import DeviceBufferPool
from edged.inference.loadspec import engine_hints
from edged.model.repository import ModelRepository

X = np.linspace(-1, 1, 5 * 3 * 8 * 8, dtype=np.float32).reshape(5, 3, 8, 8)


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCudart:
    return fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch, cuda: FakeCudart) -> Knobs:
    return fake_tensorrt.install(monkeypatch)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    monkeypatch.setattr(backends, "_instances", {})
    yield


def opts(tmp_path: Path, **changes: object) -> BackendOptions:
    return dataclasses.replace(BackendOptions(providers=("cpu",), intra_op_threads=1,
                                              cache_dir=tmp_path / "cache"), **changes)


def spec_of(repo: ModelRepository, name: str, **changes: object) -> LoadSpec:
    model = repo.resolve(name)
    spec = LoadSpec(name, model.version, model.onnx_path, model.inputs, model.outputs,
                    model.max_batch_size, "fp32", **engine_hints(model))
    return dataclasses.replace(spec, **changes)


def built(backend: TensorRTBackend, spec: LoadSpec, options: BackendOptions) -> TrtSession:
    """Load, wait for the background build, load again: the session from the cached engine."""
    with pytest.raises(EngineBuilding) as building:
        backend.load(spec, options)
    assert building.value.upgrade is not None
    building.value.upgrade.result(timeout=10)
    return backend.load(spec, options)


def reference(spec: LoadSpec, tmp_path: Path, inputs: dict[str, np.ndarray]
              ) -> dict[str, np.ndarray]:
    return OrtSession(spec, opts(tmp_path)).infer(inputs)


# -- usable or not ----------------------------------------------------------------------------
def test_unavailable_when_tensorrt_module_missing(monkeypatch: pytest.MonkeyPatch,
                                                  cuda: FakeCudart) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert "the tensorrt module is not installed" in (TensorRTBackend().unavailable_reason()
                                                      or "")


def test_unavailable_when_no_gpu_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    fake_tensorrt.install(monkeypatch)
    assert "cudaErrorInsufficientDriver" in (TensorRTBackend().unavailable_reason() or "")


def test_choose_backend_auto_when_tensorrt_unusable_takes_onnxruntime(
        registry: None, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    fake_tensorrt.install(monkeypatch)
    with caplog.at_level(logging.INFO, logger="edged.backends"):
        assert choose_backend("auto").name == "onnxruntime"
    assert "tensorrt: cudaGetDeviceCount: cudaErrorInsufficientDriver" in caplog.text


def test_choose_backend_auto_when_tensorrt_and_gpu_present_takes_tensorrt(
        registry: None, trt: Knobs) -> None:
    assert choose_backend("auto").name == "tensorrt"


# -- building and the engine cache ------------------------------------------------------------
def test_load_when_no_engine_builds_it_in_the_background_then_serves_it(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    spec, options = spec_of(repo, "tiny_cls", instances=2), opts(tmp_path)
    session = built(TensorRTBackend(), spec, options)
    np.testing.assert_allclose(session.infer({"x": X})["prob"],
                               reference(spec, tmp_path, {"x": X})["prob"], rtol=1e-6)
    (build,) = trt.builds
    assert build["workspace"] == 1024 << 20
    assert len(build["profiles"]) == 2  # one per instance: contexts never share a profile
    assert build["profiles"][0]["x"] == [[1, 3, 8, 8], [16, 3, 8, 8], [16, 3, 8, 8]]
    assert session.providers == ["TensorRT 10.13.0 fp32"]
    (sidecar,) = (tmp_path / "cache" / "tensorrt" / "tiny_cls" / "1").glob("*.json")
    assert json.loads(sidecar.read_text())["fields"]["gpu"] == "NVIDIA Fake RTX"
    session.close()
    TensorRTBackend().load(spec, options).close()  # as a new process would: from disk
    assert len(trt.builds) == 1


def test_load_when_asked_twice_while_building_shares_one_build(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    trt.build_gate = threading.Event()
    backend, spec, options = TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)
    futures = []
    for _ in range(2):
        with pytest.raises(EngineBuilding) as building:
            backend.load(spec, options)
        futures.append(building.value.upgrade)
    assert futures[0] is futures[1]
    trt.build_gate.set()
    futures[0].result(timeout=10)
    assert len(trt.builds) == 1


def test_build_uses_the_timing_cache_and_logs_progress(
        trt: Knobs, repo: ModelRepository, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    backend, options = TensorRTBackend(), opts(tmp_path, workspace_mb=64)
    with caplog.at_level(logging.INFO, logger="edged.backends"):
        built(backend, spec_of(repo, "tiny_cls"), options).close()
        built(backend, spec_of(repo, "colors"), options).close()
    assert trt.timing_caches_loaded == [b"", b"TC1"]  # the second build starts from the first's
    assert list((tmp_path / "cache" / "tensorrt").glob("timing-10.13.0-*.cache"))
    assert "tiny_cls:1: TensorRT build: Building engine (2 steps)" in caplog.text
    assert trt.builds[0]["workspace"] == 64 << 20


def test_build_when_timing_cache_is_garbage_starts_a_new_one(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "tensorrt"
    folder.mkdir(parents=True)
    (folder / "timing-10.13.0-nvidia-fake-rtx-sm86.cache").write_bytes(b"garbage")
    built(TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)).close()
    assert trt.timing_caches_loaded == [b"garbage", b""]


def test_load_when_build_fails_falls_back_and_does_not_build_again(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    trt.fail_build = True
    backend, spec, options = TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)
    with pytest.raises(EngineBuilding) as building:
        backend.load(spec, options)
    with pytest.raises(BuildError, match="built no engine"):
        building.value.upgrade.result(timeout=10)  # type: ignore[union-attr]
    with pytest.raises(FallBack, match="engine build failed") as later:
        backend.load(spec, options)
    assert not isinstance(later.value, EngineBuilding) and later.value.upgrade is None
    assert len(trt.builds) == 1


def test_load_when_engine_will_not_deserialize_rebuilds_it(
        trt: Knobs, repo: ModelRepository, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    backend, spec, options = TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)
    built(backend, spec, options).close()
    (engine,) = (tmp_path / "cache" / "tensorrt" / "tiny_cls" / "1").glob("*.engine")
    garbage = b"not an engine at all"  # consistent with its sidecar: only TensorRT can tell
    sidecar = engine.with_suffix(".json")
    doc = json.loads(sidecar.read_text())
    doc.update(engine_bytes=len(garbage), engine_sha256=hashlib.sha256(garbage).hexdigest())
    engine.write_bytes(garbage)
    sidecar.write_text(json.dumps(doc))
    session = built(backend, spec, options)
    assert "could not deserialize its engine" in caplog.text
    assert len(trt.builds) == 2
    np.testing.assert_allclose(session.infer({"x": X[:1]})["prob"],
                               reference(spec, tmp_path, {"x": X[:1]})["prob"], rtol=1e-6)


def test_load_when_engine_file_cut_short_rebuilds_it(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    backend, spec, options = TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)
    built(backend, spec, options).close()
    (engine,) = (tmp_path / "cache" / "tensorrt" / "tiny_cls" / "1").glob("*.engine")
    engine.write_bytes(engine.read_bytes()[:20])
    built(backend, spec, options).close()
    assert len(trt.builds) == 2


def test_load_when_model_changes_builds_a_new_engine(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    from tools.assets import models as test_models

    backend, spec, options = TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)
    built(backend, spec, options).close()
    test_models.write_model(test_models.make_tiny_cls(seed=7), spec.path)
    built(backend, spec, options).close()
    assert len(trt.builds) == 2
    assert len(list((tmp_path / "cache" / "tensorrt" / "tiny_cls" / "1").glob("*.engine"))) == 1


def test_load_when_dynamic_dims_have_no_range_stays_on_the_fallback(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    with pytest.raises(FallBack, match=r"no tensorrt\.shapes\.image range") as refused:
        TensorRTBackend().load(spec_of(repo, "tiny_cnn"), opts(tmp_path))
    assert refused.value.upgrade is None and refused.value.fallback == "onnxruntime"
    assert trt.builds == []


def test_load_when_int8_file_is_quantized_for_cpus_stays_on_the_fallback(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    path = qdq_model(tmp_path / "model.int8.onnx", np.array(128, np.uint8))
    spec = dataclasses.replace(spec_of(repo, "tiny_cls"), path=path, precision="int8")
    with pytest.raises(FallBack, match="symmetric INT8 Q/DQ only") as refused:
        TensorRTBackend().load(spec, opts(tmp_path))
    assert refused.value.upgrade is None and trt.builds == []


def test_load_when_contexts_cannot_start_falls_back(
        trt: Knobs, cuda: FakeCudart, repo: ModelRepository, tmp_path: Path) -> None:
    backend, spec, options = TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)
    built(backend, spec, options).close()
    cuda.fail.add("cudaStreamCreateWithFlags")
    with pytest.raises(FallBack, match="cannot run"):
        backend.load(spec, options)


def test_build_for_a_dla_core_runs_fp16_with_gpu_fallback(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    trt.dla_cores = 2  # an AGX Orin
    built(TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path, dla_core=1)).close()
    (build,) = trt.builds
    assert build["dla_core"] == 1 and sorted(build["flags"]) == ["FP16", "GPU_FALLBACK"]


# -- running ----------------------------------------------------------------------------------
def test_session_when_instances_run_at_once_each_has_its_own_context_and_stream(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    session = built(TensorRTBackend(), spec_of(repo, "tiny_cls", instances=2), opts(tmp_path))
    trt.run_barrier = threading.Barrier(2)  # both must be inside execute at the same time
    results = []
    threads = [threading.Thread(target=lambda i=i: results.append(
        session.infer({"x": X[i:i + 1]}))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 2
    contexts = {context for context, _stream, _thread in trt.runs}
    streams = {stream for _context, stream, _thread in trt.runs}
    assert len(contexts) == 2 and len(streams) == 2
    session.close()


def test_session_reads_pool_buffers_in_place_and_stages_plain_arrays(
        trt: Knobs, cuda: FakeCudart, repo: ModelRepository, tmp_path: Path) -> None:
    spec = spec_of(repo, "tiny_cls")
    session = built(TensorRTBackend(), spec, opts(tmp_path))  # discrete: pinned buffers
    pool = DeviceBufferPool(16, "pinned")
    batch = pool.concatenate("x", [X[:2], X[2:5]])
    host_to_device = fake_cudart.cudaMemcpyKind.cudaMemcpyHostToDevice

    def uploads_from() -> list[int]:
        return [src for _dst, src, _n, kind, _s in cuda.called("cudaMemcpyAsync")
                if kind == host_to_device]

    out = session.infer({"x": batch})["prob"]
    assert uploads_from() == [batch.ctypes.data]  # straight from the batcher's buffer
    np.testing.assert_allclose(out, reference(spec, tmp_path, {"x": X})["prob"], rtol=1e-6)
    cuda.calls.clear()
    session.infer({"x": X.copy()})
    (staged,) = uploads_from()
    assert staged != X.ctypes.data  # plain memory goes through the slot's staging buffer
    pool.close()
    session.close()
    assert cuda.live() == 0 and cuda.streams == set()


def test_session_when_shape_outside_profile_raises_invalid_input(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    session = built(TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path))
    with pytest.raises(InvalidInput, match="outside the engine's profile"):
        session.infer({"x": np.zeros((17, 3, 8, 8), np.float32)})
    session.close()


def test_session_with_managed_memory_on_jetson_attaches_its_buffers_to_its_stream(
        monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, tmp_path: Path) -> None:
    cuda = fake_cudart.install(monkeypatch, FakeCudart(fake_cudart.JETSON))
    trt = fake_tensorrt.install(monkeypatch)
    spec = spec_of(repo, "tiny_cls")
    session = built(TensorRTBackend(), spec, opts(tmp_path, memory="managed"))
    out = session.infer({"x": X})["prob"]
    np.testing.assert_allclose(out, reference(spec, tmp_path, {"x": X})["prob"], rtol=1e-6)
    ((_, stream, _),) = trt.runs
    attached = cuda.called("cudaStreamAttachMemAsync")
    assert len(attached) == 2  # the staged input and the output, before the launch
    assert {s for s, *_ in attached} == {stream}
    session.close()


# -- what the real runtime enforces (the doubles now do too) ---------------------------------
def test_managed_pool_buffer_goes_back_to_the_host_after_a_batch_on_jetson(
        monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, tmp_path: Path) -> None:
    """Without concurrent managed access, a pool buffer left attached to the stream of the
    context that ran it faults when the worker writes its next batch while another worker's
    batch runs on that stream."""
    cuda = fake_cudart.install(monkeypatch, FakeCudart(fake_cudart.JETSON))
    fake_tensorrt.install(monkeypatch)
    spec = spec_of(repo, "tiny_cls", instances=2)
    session = built(TensorRTBackend(), spec, opts(tmp_path, memory="managed"))
    pool = DeviceBufferPool(16, "managed")
    for _ in range(3):
        batch = pool.concatenate("x", [X])
        out = session.infer({"x": batch})
        for stream in list(cuda.streams):  # the other worker's batch, in flight
            cuda.launch(stream)
        cuda.cpu_access(batch.ctypes.data)  # the worker writes its next batch: allowed
        for stream in list(cuda.streams):
            cuda.cudaStreamSynchronize(stream)
    np.testing.assert_allclose(out["prob"], reference(spec, tmp_path, {"x": X})["prob"],
                               rtol=1e-6)
    assert not cuda.faults
    pool.close()
    session.close()


def test_host_location_inputs_get_host_addresses(
        monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, tmp_path: Path) -> None:
    """A shape tensor lives on the host: TensorRT reads it at enqueue from a host address;
    on a discrete GPU the staged device mirror is no such address."""
    fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    knobs = fake_tensorrt.install(monkeypatch, Knobs(host_tensors={"b"}))
    spec = spec_of(repo, "tiny_two_input")
    session = built(TensorRTBackend(), spec, opts(tmp_path))
    inputs = {"a": np.ones((2, 4), np.float32), "b": np.full((2, 4), 3, np.float32)}
    pool = DeviceBufferPool(4, "pinned")
    for feed in (inputs, {k: pool.concatenate(k, [v]) for k, v in inputs.items()}):
        out = session.infer(feed)
        want = reference(spec, tmp_path, inputs)
        np.testing.assert_allclose(out["sum"], want["sum"], rtol=1e-6)
    assert not knobs.faults
    pool.close()
    session.close()


def test_fixed_shape_engines_share_one_profile_whatever_the_instances(
        trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    backend, options = TensorRTBackend(), opts(tmp_path)
    for instances in (1, 3):
        built_or_cached = spec_of(repo, "tiny_nobatch", instances=instances)
        try:
            backend.load(built_or_cached, options).close()
        except EngineBuilding as building:
            assert building.upgrade is not None
            building.upgrade.result(timeout=10)
            backend.load(built_or_cached, options).close()
    assert len(trt.builds) == 1  # one engine serves both instance counts


def test_fp32_engines_clear_tf32(trt: Knobs, repo: ModelRepository, tmp_path: Path) -> None:
    built(TensorRTBackend(), spec_of(repo, "tiny_cls"), opts(tmp_path)).close()
    assert trt.builds[0]["cleared"] == ["TF32"]
