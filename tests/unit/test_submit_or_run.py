"""Scheduler.submit_or_run, the API's way in: a quick, idle, loaded model runs on the asking
thread (no hop to a worker and back); anything else is submitted as before."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.backends import GateBackend, hold_worker
from support.models import cls_input

from edged import batcher
from edged.cache import ModelCache
from edged.errors import InvalidInput
from edged.scheduler import Scheduler

Core = tuple[ModelCache, Scheduler]


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
