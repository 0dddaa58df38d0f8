"""A batcher checks requests against the version the cache serves now (issue 49, item 1): a
swap is followed at the next admission, not when a worker next runs; requests admitted against
the old version and run together after the swap are each checked against the new one (a 400
for those that do not fit, never a run that fails as a 500)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edged.core.errors import InvalidInput
from edged.inference import batcher
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from tools.assets.models import make_scale, write_model

Core = tuple[ModelCache, Scheduler]


@pytest.fixture(autouse=True)
def cheap_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows count as cheap whatever this box's load (run_together runs them on the caller)."""
    monkeypatch.setattr(batcher, "TOGETHER_MAX_NS", 1 << 60)


@pytest.fixture
def scale_v1(repo_dir: Path) -> Path:
    write_model(make_scale(4), repo_dir / "scale" / "1" / "model.onnx")
    return repo_dir


def add_version(repo_dir: Path, version: int, n: int) -> None:
    write_model(make_scale(n), repo_dir / "scale" / str(version) / "model.onnx")


def test_admit_when_a_swap_changed_the_inputs_checks_against_the_version_swapped_in(
        core: Core, scale_v1: Path) -> None:
    cache, scheduler = core
    four = np.ones((1, 4), np.float32)
    assert scheduler.infer("scale", {"x": four})["y"].tolist() == [[2.0] * 4]
    add_version(scale_v1, 2, 8)
    cache.swap("scale", 2)
    eight = np.ones((1, 8), np.float32)
    admitted = scheduler.admit("scale", {"x": eight})  # no run in between moved it on
    scheduler.run_or_queue(admitted)
    assert admitted.future.result(10)["y"].tolist() == [[2.0] * 8]
    with pytest.raises(InvalidInput, match=r"\[-1, 8\]"):
        scheduler.admit("scale", {"x": four})
    assert scheduler.model("scale").version == 2


def test_run_together_when_a_swap_lands_after_admission_refuses_what_does_not_fit(
        core: Core, scale_v1: Path) -> None:
    cache, scheduler = core
    four = np.ones((1, 4), np.float32)
    scheduler.infer("scale", {"x": four})  # its rows timed: requests together run here
    admitted = [scheduler.admit("scale", {"x": four * i}) for i in range(3)]
    add_version(scale_v1, 2, 8)
    cache.swap("scale", 2)
    scheduler.run_together(admitted)
    for one in admitted:
        with pytest.raises(InvalidInput, match=r"\[-1, 8\]"):
            one.future.result(10)
    stats = scheduler.statistics()[("scale", 2)]
    assert stats.failure == 3 and stats.exec_count == 0


def test_run_together_when_a_swap_kept_the_inputs_runs_them_on_the_new_version(
        core: Core, scale_v1: Path) -> None:
    cache, scheduler = core
    four = np.ones((1, 4), np.float32)
    scheduler.infer("scale", {"x": four})
    admitted = [scheduler.admit("scale", {"x": four * i}) for i in range(3)]
    write_model(make_scale(4, factor=4.0), scale_v1 / "scale" / "2" / "model.onnx")
    cache.swap("scale", 2)
    scheduler.run_together(admitted)
    for i, one in enumerate(admitted):
        assert one.future.result(10)["y"].tolist() == [[4.0 * i] * 4]
        assert one.future.version == 2
