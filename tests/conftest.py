"""Shared fixtures: a real model repository of generated ONNX files, real ONNX Runtime sessions,
and a gate around them so a test can hold a worker mid-inference without sleeping."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

import make_test_models
import numpy as np
import pytest

from edged.backends import BackendOptions, LoadSpec, register_backend
from edged.backends.onnxruntime import OrtBackend, OrtSession
from edged.cache import ModelCache
from edged.repository import ModelRepository
from edged.scheduler import Scheduler

# The fixtures of the support package (a broker, the daemon served in-process, an artifact
# server, an OTA signing key), for every test under tests/.
pytest_plugins = ["support.artifacts", "support.broker", "support.daemon", "support.ota"]

ORT_TARGET = "edged.backends.onnxruntime:OrtBackend"


def gpu_missing_reason() -> str | None:
    if not any(Path("/dev").glob("nvidia[0-9]*")) and not Path("/dev/nvhost-ctrl").exists():
        return "no NVIDIA GPU on this machine (/dev/nvidia* and /dev/nvhost-* absent)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = gpu_missing_reason()
    if reason is None:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"gpu test skipped: {reason}"))


@pytest.fixture
def repo_dir(tmp_path: Path) -> Path:
    """A repository with every tiny test model, one version each."""
    return make_test_models.write_repository(tmp_path / "models")


@pytest.fixture
def repo(repo_dir: Path) -> ModelRepository:
    return ModelRepository(repo_dir)


def write_yaml(repo_dir: Path, name: str, text: str) -> None:
    (repo_dir / name / "model.yaml").write_text(text)


def options(tmp_path: Path) -> BackendOptions:
    return BackendOptions(providers=("cpu",), intra_op_threads=1, cache_dir=tmp_path / "cache")


class GateBackend:
    """Real ONNX Runtime sessions whose infer() records each call and then waits for the gate.

    With the gate closed a worker is held mid-batch, so queued requests stay queued for as
    long as the test needs; `wait_calls(n)` waits (bounded) until n calls have started."""

    name = "onnxruntime"

    def __init__(self) -> None:
        self.real = OrtBackend()
        self.gate = threading.Event()
        self.gate.set()
        self.cond = threading.Condition()
        self.calls: list[dict[str, np.ndarray]] = []
        self.loads: list[str] = []
        self.threads: list[str] = []  # the thread each call ran on
        self.fail_if = None  # optional predicate on inputs: raise inside the backend call

    def unavailable_reason(self) -> str | None:
        return None

    def load(self, spec: LoadSpec, opts: BackendOptions) -> GatedSession:
        with self.cond:
            self.loads.append(spec.label)
        return GatedSession(self, self.real.load(spec, opts))

    def wait_calls(self, n: int, timeout: float = 10.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, timeout), \
                f"expected {n} backend calls, saw {len(self.calls)}"

    def reset(self) -> None:
        with self.cond:
            self.calls.clear()
            self.threads.clear()


class GatedSession:
    def __init__(self, backend: GateBackend, session: OrtSession) -> None:
        self.backend = backend
        self.session = session
        self.inputs, self.outputs = session.inputs, session.outputs
        self.providers, self.nbytes = session.providers, session.nbytes

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.backend.cond:
            self.backend.calls.append({k: np.array(v, copy=True) for k, v in inputs.items()})
            self.backend.threads.append(threading.current_thread().name)
            self.backend.cond.notify_all()
        if not self.backend.gate.wait(10):
            raise RuntimeError("test gate never opened")
        if self.backend.fail_if is not None and self.backend.fail_if(inputs):
            raise RuntimeError("injected backend failure")
        return self.session.infer(inputs)

    def close(self) -> None:
        self.session.close()


@pytest.fixture
def gate() -> Iterator[GateBackend]:
    backend = GateBackend()
    register_backend("onnxruntime", lambda: backend)
    try:
        yield backend
    finally:
        backend.gate.set()
        register_backend("onnxruntime", ORT_TARGET)


@pytest.fixture
def core(repo: ModelRepository, tmp_path: Path) -> Iterator[tuple[ModelCache, Scheduler]]:
    """A cache with a generous budget and a scheduler over the test repository."""
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        yield cache, scheduler
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)


@pytest.fixture
def ppocr_cls(tmp_path: Path) -> Path:
    """A repository holding the real PP-OCR cls model from the rapidocr-onnxruntime wheel."""
    from edged.bench.assets import PPOCR_CLS, ppocr_model

    root = tmp_path / "ppocr"
    (root / "cls" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_CLS), root / "cls" / "1" / "model.onnx")
    (root / "cls" / "model.yaml").write_text(
        "max_batch_size: 8\ninputs: [{name: x, shape: [3, 48, 192]}]\n")
    return root


def cpu_count() -> int:
    return os.cpu_count() or 1
