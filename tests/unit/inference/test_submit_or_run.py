"""Scheduler.submit_or_run, the API's way in: a quick, idle, loaded model runs on the asking
thread (no hop to a worker and back); anything else is submitted as before."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from support.backends import GateBackend, hold_worker
from support.models import cls_input, write_yaml

from edged.core.errors import InvalidInput, QueueFull
from edged.inference import batcher
from edged.inference.batching import Pending
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler

Core = tuple[ModelCache, Scheduler]


@pytest.fixture(autouse=True)
def cheap_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows count as cheap whatever this box's load (a first batch on a slow, shared VM took
    over TOGETHER_MAX_NS / 2 a row); a test of the other case sets the bound to 0 itself."""
    monkeypatch.setattr(batcher, "TOGETHER_MAX_NS", 1 << 60)


def test_submit_or_run_when_the_model_is_quick_and_idle_runs_on_the_callers_thread(
        core: Core, gate: GateBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, scheduler = core
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)  # quick, whatever this box's load
    cache.load("tiny_cls")
    first = scheduler.submit_or_run("tiny_cls", {"x": cls_input(1.0)})  # no batch timed yet
    first.result(10)
    assert gate.threads[-1].startswith("edged-tiny_cls")
    second = scheduler.submit_or_run("tiny_cls", {"x": cls_input(2.0)})
    assert second.done()  # it ran during the call
    assert gate.threads[-1] == threading.current_thread().name
    np.testing.assert_allclose(second.result()["prob"],
                               scheduler.submit("tiny_cls", {"x": cls_input(2.0)})
                               .result(10)["prob"])
    assert second.version == 1
    stats = scheduler.statistics()[("tiny_cls", 1)]
    assert stats.success == 3 and stats.exec_count == 3  # counted as every other run


def test_submit_or_run_when_batches_are_slow_submits(core: Core, gate: GateBackend,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cache, scheduler = core
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 0)
    cache.load("tiny_cls")
    gate.reset()  # the warm-up ran on this thread
    for marker in (1.0, 2.0):
        scheduler.submit_or_run("tiny_cls", {"x": cls_input(marker)}).result(10)
    assert all(name.startswith("edged-tiny_cls") for name in gate.threads)


def test_submit_or_run_when_the_instance_is_busy_queues(
        core: Core, gate: GateBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    _, scheduler = core
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)
    scheduler.submit("tiny_cls", {"x": cls_input(0.5)}).result(10)  # timed: quick
    held = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(1.0)})
    queued = scheduler.submit_or_run("tiny_cls", {"x": cls_input(2.0)})
    assert not queued.done()  # the one slot is busy: it waits its turn, never blocks here
    gate.gate.set()
    held.result(10)
    queued.result(10)
    assert threading.current_thread().name not in gate.threads


def test_submit_or_run_when_the_model_was_unloaded_submits_and_workers_load_it(
        core: Core, gate: GateBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, scheduler = core
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)
    scheduler.submit("tiny_cls", {"x": cls_input(0.5)}).result(10)  # timed: quick
    cache.unload("tiny_cls", 1)
    gate.reset()
    again = scheduler.submit_or_run("tiny_cls", {"x": cls_input(1.0)})
    assert again.result(10)["prob"].shape == (1, 4)
    assert gate.threads[-1].startswith("edged-tiny_cls")  # loaded off the asking thread


def test_submit_or_run_when_the_input_is_bad_raises_and_frees_the_slot(
        core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    _, scheduler = core
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)
    scheduler.submit("tiny_cls", {"x": cls_input(0.5)}).result(10)
    with pytest.raises(InvalidInput):
        scheduler.submit_or_run("tiny_cls", {"x": np.zeros((1, 3, 4, 4), np.float32)})
    assert scheduler.batchers()[0].free_slots == 1
    assert scheduler.submit_or_run("tiny_cls", {"x": cls_input(1.0)}).result(10)["prob"].shape \
        == (1, 4)


def test_submit_or_run_when_a_shadow_taps_the_model_offers_it_inline_runs_too(
        core: Core, gate: GateBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, scheduler = core
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)
    cache.load("tiny_cls")
    scheduler.submit("tiny_cls", {"x": cls_input(1.0)}).result(10)  # a batch timed: quick now
    offered: list[object] = []
    scheduler.taps["tiny_cls"] = lambda inputs: offered.append  # sample every request
    ran = scheduler.submit_or_run("tiny_cls", {"x": cls_input(2.0)})
    assert ran.done() and gate.threads[-1] == threading.current_thread().name
    assert offered == [ran]  # the shadow saw the request and its outputs, as with submit()


def together(scheduler: Scheduler, *markers: float, rows: int = 1) -> list[Pending]:
    admitted = [scheduler.admit("tiny_cls", {"x": cls_input(m, rows)}) for m in markers]
    scheduler.run_together(admitted)
    return [a.future for a in admitted]


def test_run_together_when_the_model_is_cheap_and_idle_runs_them_as_one_batch_here(
        core: Core, gate: GateBackend) -> None:
    """Requests that arrived in one turn of the loop: one backend call on this thread, each
    caller its own row back."""
    _, scheduler = core
    scheduler.submit("tiny_cls", {"x": cls_input(0.5)}).result(10)  # its rows are timed
    assert scheduler.cheap("tiny_cls")
    gate.reset()
    futures = together(scheduler, 1.0, 2.0, 3.0)
    assert all(f.done() for f in futures)  # ran during the call
    assert gate.threads == [threading.current_thread().name]
    assert [float(x) for x in gate.calls[0]["x"][:, 0, 0, 0]] == [1.0, 2.0, 3.0]
    for marker, future in zip((1.0, 2.0, 3.0), futures, strict=True):
        alone = scheduler.submit("tiny_cls", {"x": cls_input(marker)}).result(10)
        np.testing.assert_allclose(future.result()["prob"], alone["prob"], rtol=1e-5)
    stats = scheduler.statistics()[("tiny_cls", 1)]
    assert stats.batch_sizes[3][0] == 1 and stats.success == 7  # counted as a batch of 3


def test_run_together_when_rows_are_not_cheap_queues_them_for_the_workers(
        core: Core, gate: GateBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    _, scheduler = core
    scheduler.submit("tiny_cls", {"x": cls_input(0.5)}).result(10)
    monkeypatch.setattr(batcher, "TOGETHER_MAX_NS", 0)
    assert not scheduler.cheap("tiny_cls")
    gate.reset()
    futures = together(scheduler, 1.0, 2.0)
    assert [f.result(10)["prob"].shape for f in futures] == [(1, 4), (1, 4)]
    assert all(name.startswith("edged-tiny_cls") for name in gate.threads)


def test_run_together_when_the_instance_is_busy_queues_them_and_never_blocks(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    scheduler.submit("tiny_cls", {"x": cls_input(0.5)}).result(10)
    held = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(9.0)})
    futures = together(scheduler, 1.0, 2.0)
    assert not any(f.done() for f in futures)
    gate.gate.set()
    held.result(10)
    assert [f.result(10)["prob"].shape for f in futures] == [(1, 4), (1, 4)]
    assert threading.current_thread().name not in gate.threads


def test_run_together_when_rows_overflow_the_batch_runs_what_fits_and_queues_the_rest(
        core: Core, gate: GateBackend, repo_dir: Path) -> None:
    """max_batch_size 4: a turn of 3 + 2 rows runs the 3 here, the 2 on a worker."""
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 4\n")
    _, scheduler = core
    scheduler.submit("tiny_cls", {"x": cls_input(0.5)}).result(10)
    gate.reset()
    first = scheduler.admit("tiny_cls", {"x": cls_input(1.0, rows=3)})
    second = scheduler.admit("tiny_cls", {"x": cls_input(2.0, rows=2)})
    scheduler.run_together([first, second])
    assert first.future.done()
    assert second.future.result(10)["prob"].shape == (2, 4)
    assert gate.threads[0] == threading.current_thread().name
    assert gate.threads[1].startswith("edged-tiny_cls")


def test_run_together_when_the_queue_is_full_fails_only_those_that_did_not_fit(
        core: Core, gate: GateBackend, repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 4\nbatching: {max_queue_size: 1}\n")
    _, scheduler = core
    held = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(9.0)})
    futures = together(scheduler, 1.0, 2.0)  # the worker is held: both go to the queue
    with pytest.raises(QueueFull):
        futures[1].result(0)
    gate.gate.set()
    held.result(10)
    assert futures[0].result(10)["prob"].shape == (1, 4)
