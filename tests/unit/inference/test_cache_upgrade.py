"""A model whose best backend is not ready yet (a TensorRT engine building) is served on its
fallback at once and moved onto that backend when it is, the way a version swap moves
requests: leases already taken finish where they started, nothing is dropped. A failed build,
or an unload in between, leaves things as they were."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from doubles import fake_cudart, fake_tensorrt
from doubles.fake_cudart import DISCRETE, FakeCudart
from support.backends import options

from edged import backends
from edged.backends import (
    BackendOptions,
    EngineBuilding,
    FallBack,
    LoadSpec,
    register_backend,
)
from edged.backends.onnxruntime import OrtBackend
from edged.backends.tensorrt import TensorRTBackend
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository

X = np.linspace(0, 1, 3 * 8 * 8, dtype=np.float32).reshape(1, 3, 8, 8)


class Recorded:
    """An ONNX Runtime session that says which backend it stands for and whether it closed."""

    def __init__(self, session: Any, providers: list[str]) -> None:
        self.session = session
        self.inputs, self.outputs = session.inputs, session.outputs
        self.providers, self.nbytes = providers, session.nbytes
        self.closed = False

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        assert not self.closed, "inference on a closed session"
        return self.session.infer(inputs)

    def close(self) -> None:
        self.closed = True


class Fallback:
    name = "onnxruntime"

    def __init__(self) -> None:
        self.real = OrtBackend()
        self.sessions: list[Recorded] = []

    def unavailable_reason(self) -> str | None:
        return None

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        return self.real.auto_precision(int8, why)

    def load(self, spec: LoadSpec, opts: BackendOptions) -> Recorded:
        self.sessions.append(Recorded(self.real.load(spec, opts), ["CPUExecutionProvider"]))
        return self.sessions[-1]


class Building:
    """A backend whose engine is ready when the test completes `ready`."""

    name = "tensorrt"

    def __init__(self) -> None:
        self.real = OrtBackend()
        self.ready: Future[None] = Future()
        self.ready.set_running_or_notify_cancel()
        self.sessions: list[Recorded] = []

    def unavailable_reason(self) -> str | None:
        return None

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        return TensorRTBackend().auto_precision(int8, why)  # TensorRT's rule, no tensorrt

    def load(self, spec: LoadSpec, opts: BackendOptions) -> Recorded:
        if not self.ready.done():
            raise EngineBuilding(f"{spec.label}: building", self.ready)
        if self.ready.exception() is not None:
            raise FallBack(f"{spec.label}: the build failed")
        self.sessions.append(Recorded(self.real.load(spec, opts), ["FakeTensorRT"]))
        return self.sessions[-1]


@pytest.fixture
def pair(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Building, Fallback]]:
    monkeypatch.setattr(backends, "_REGISTRY", dict(backends._REGISTRY))
    monkeypatch.setattr(backends, "_instances", {})
    building, fallback = Building(), Fallback()
    register_backend("tensorrt", lambda: building)
    register_backend("onnxruntime", lambda: fallback)
    yield building, fallback


def test_cache_when_engine_builds_serves_fallback_then_swaps_keeping_leases(
        pair: tuple[Building, Fallback], repo: ModelRepository, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    building, fallback = pair
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    early = cache.acquire("tiny_cls")
    assert early.entry.backend == "onnxruntime"
    assert [s.backend for s in cache.status() if s.name == "tiny_cls"] == ["onnxruntime"]
    expected = early.session.infer({"x": X})["prob"]

    with caplog.at_level(logging.INFO, logger="edged.inference.cache"):
        building.ready.set_result(None)  # the cache's callback runs here, on this thread
    assert "tiny_cls:1: requests now go to tensorrt (was onnxruntime)" in caplog.text
    with cache.acquire("tiny_cls") as late:
        assert late.entry.backend == "tensorrt"
        np.testing.assert_allclose(late.session.infer({"x": X})["prob"], expected, rtol=1e-6)
    # The lease taken before the swap still runs on its session, which closes after it.
    np.testing.assert_allclose(early.session.infer({"x": X})["prob"], expected, rtol=1e-6)
    assert not fallback.sessions[0].closed
    early.release()
    assert fallback.sessions[0].closed
    (status,) = [s for s in cache.status() if s.name == "tiny_cls"]
    assert (status.state, status.backend, status.providers) == ("READY", "tensorrt",
                                                                ("FakeTensorRT",))
    assert status.nbytes == building.sessions[0].nbytes
    cache.close()


def test_cache_when_build_fails_keeps_serving_the_fallback(
        pair: tuple[Building, Fallback], repo: ModelRepository, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    building, _ = pair
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    cache.load("tiny_cls")
    with caplog.at_level(logging.WARNING, logger="edged.inference.cache"):
        building.ready.set_exception(RuntimeError("TensorRT built no engine"))
    assert "tiny_cls:1 stays on onnxruntime: TensorRT built no engine" in caplog.text
    with cache.acquire("tiny_cls") as lease:
        assert lease.entry.backend == "onnxruntime" and not lease.session.closed
    assert building.sessions == []
    cache.close()


def test_cache_when_model_unloaded_before_build_ends_does_not_bring_it_back(
        pair: tuple[Building, Fallback], repo: ModelRepository, tmp_path: Path) -> None:
    building, _ = pair
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    cache.load("tiny_cls")
    assert cache.unload("tiny_cls", timeout_s=5)
    building.ready.set_result(None)
    assert not cache.ready("tiny_cls") and building.sessions == []
    cache.close()


def test_cache_when_engine_already_built_loads_it_directly(
        pair: tuple[Building, Fallback], repo: ModelRepository, tmp_path: Path) -> None:
    building, fallback = pair
    building.ready.set_result(None)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    with cache.acquire("tiny_cls") as lease:
        assert lease.entry.backend == "tensorrt"
    assert fallback.sessions == []
    cache.close()


def test_scheduler_on_doubles_of_tensorrt_and_cuda_answers_the_same_across_the_upgrade(
        monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, tmp_path: Path) -> None:
    cuda = fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    trt = fake_tensorrt.install(monkeypatch)
    trt.build_gate = threading.Event()
    monkeypatch.setattr(backends, "_instances", {})
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    batch = np.linspace(-1, 1, 4 * 3 * 8 * 8, dtype=np.float32).reshape(4, 3, 8, 8)
    try:
        futures = [scheduler.submit("tiny_cls", {"x": batch[i:i + 1]}) for i in range(4)]
        before = np.concatenate([f.result(10)["prob"] for f in futures])
        with cache.acquire("tiny_cls") as lease:
            assert lease.entry.backend == "onnxruntime"
            upgraded = threading.Event()  # runs after the cache's own callback
            lease.entry.upgrade.add_done_callback(lambda _: upgraded.set())
        trt.build_gate.set()
        assert upgraded.wait(10)
        with cache.acquire("tiny_cls") as lease:
            assert lease.entry.backend == "tensorrt"
        futures = [scheduler.submit("tiny_cls", {"x": batch[i:i + 1]}) for i in range(4)]
        after = np.concatenate([f.result(10)["prob"] for f in futures])
        np.testing.assert_allclose(after, before, rtol=1e-6)
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)
    assert cuda.live() == 0  # the workers' pinned pools and the session's buffers are freed
