"""The scheduler and cache when things go wrong or race: callbacks that resubmit, batches that
cannot grow, shutdown with odd leftovers, load failures, swaps that meet loads in flight.

Long configured delays and bounded joins stand in for timing asserts: a test that would hang
if the behaviour were wrong fails on its bounded wait instead."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from support.backends import GateBackend, hold_worker, options
from support.models import cls_input, write_yaml
from support.polling import wait_until

from edged.core.errors import InvalidInput, ModelLoadError, ShuttingDown, Timeout
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from tools.assets import models as test_models

Core = tuple[ModelCache, Scheduler]


def close_in_background(scheduler: Scheduler, timeout_s: float = 60) -> threading.Thread:
    thread = threading.Thread(target=scheduler.close, args=(timeout_s,))
    thread.start()
    return thread


def test_batcher_when_timeout_callback_submits_again_does_not_deadlock(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    retried: list[object] = []
    done = threading.Event()

    def retry_on_timeout(future: object) -> None:
        retried.append(scheduler.submit("tiny_cls", {"x": cls_input(2.0)}))  # takes the lock
        done.set()

    doomed = scheduler.submit("tiny_cls", {"x": cls_input(1.0)}, timeout_s=0.05)
    doomed.add_done_callback(retry_on_timeout)
    assert done.wait(10)
    with pytest.raises(Timeout):
        doomed.result(0)
    gate.gate.set()
    first.result(10)
    retried[0].result(10)  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", ["next request has another shape", "max preferred reached"])
def test_batcher_when_batch_cannot_grow_sends_it_without_waiting_the_delay(
        core: Core, gate: GateBackend, repo_dir: Path, case: str) -> None:
    write_yaml(repo_dir, "tiny_cnn", "max_batch_size: 16\nbatching: {preferred_batch_sizes: "
                                     "[1, 4], max_queue_delay_us: 60000000}\n")  # one minute
    _, scheduler = core
    # The held request fills the largest preferred size, so it goes at once too.
    first = hold_worker(scheduler, gate, "tiny_cnn", {"image": np.ones((4, 3, 8, 8), np.float32)})
    if case == "max preferred reached":
        futures = [scheduler.submit("tiny_cnn", {"image": np.ones((1, 3, 8, 8), np.float32)})
                   for _ in range(5)]
        expected = (4, 3, 8, 8)  # five rows queued: trimmed to the largest preferred size
    else:
        futures = [scheduler.submit("tiny_cnn", {"image": np.ones((2, 3, 8, 8), np.float32)}),
                   scheduler.submit("tiny_cnn", {"image": np.ones((1, 3, 9, 9), np.float32)})]
        expected = (2, 3, 8, 8)  # the next request has another shape: this batch cannot grow
    gate.gate.set()
    first.result(10)
    futures[0].result(10)  # would wait a minute if the batcher waited out the delay
    assert gate.calls[1]["image"].shape == expected


def test_scheduler_close_when_last_queued_request_was_cancelled_returns_promptly(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    assert scheduler.submit("tiny_cls", {"x": cls_input(1.0)}).cancel()
    closing = close_in_background(scheduler)
    gate.gate.set()
    closing.join(10)
    assert not closing.is_alive()  # nothing left to drain: no waiting out the 60 s
    first.result(0)


def test_scheduler_close_when_cold_load_fails_fails_requests_and_returns_promptly(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    gate.gate.clear()
    gate.fail_if = lambda inputs: True  # the warm-up will fail once released
    future = scheduler.submit("tiny_cls", {"x": cls_input(1.0)})
    gate.wait_calls(1)
    closing = close_in_background(scheduler)
    gate.gate.set()
    closing.join(10)
    assert not closing.is_alive()
    with pytest.raises(ModelLoadError, match="warm-up inference failed"):
        future.result(0)


def test_scheduler_close_when_inline_caller_holds_the_slot_never_runs_two_at_once(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    scheduler.cache.load("tiny_cls")
    gate.reset()
    gate.gate.clear()
    inline = threading.Thread(target=scheduler.infer, args=("tiny_cls", {"x": cls_input(0.5)}))
    inline.start()
    gate.wait_calls(1)
    queued = scheduler.submit("tiny_cls", {"x": cls_input(1.0)})
    closing = close_in_background(scheduler)
    batcher = scheduler.batchers()[0]
    wait_until(lambda: batcher.stopping, timeout=10, what="close() told the workers to stop")
    assert len(gate.calls) == 1  # the queued request waits for the slot, stopping or not
    gate.gate.set()
    for thread in (inline, closing):
        thread.join(10)
    queued.result(0)
    assert batcher.free_slots == 1


def test_scheduler_close_when_one_model_is_draining_the_others_already_refuse(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    scheduler.infer("tiny_cnn", {"image": np.ones((1, 3, 8, 8), np.float32)})
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    closing = close_in_background(scheduler)
    cnn = next(b for b in scheduler.batchers() if b.name == "tiny_cnn")
    wait_until(lambda: cnn.stopping, timeout=10, what="tiny_cnn's batcher stopping")
    with pytest.raises(ShuttingDown):
        scheduler.submit("tiny_cnn", {"image": np.ones((1, 3, 8, 8), np.float32)})
    gate.gate.set()
    closing.join(10)
    first.result(0)


def test_batcher_when_cache_raises_unexpected_error_fails_queued_and_keeps_serving(
        core: Core, gate: GateBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    cache, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    victim = scheduler.submit("tiny_cls", {"x": cls_input(1.0)})

    def unreadable(*args: object, **kwargs: object) -> None:
        raise PermissionError("model dir unreadable")

    monkeypatch.setattr(cache, "acquire", unreadable)
    gate.gate.set()
    first.result(10)
    with pytest.raises(ModelLoadError, match="model dir unreadable"):
        victim.result(10)
    monkeypatch.undo()
    assert scheduler.submit("tiny_cls", {"x": cls_input(2.0)}).result(10)["prob"].shape == (1, 4)


def test_batcher_when_swap_changes_the_signature_fails_only_queued_misfits_and_says_who_ran(
        tmp_path: Path, gate: GateBackend) -> None:
    root = test_models.write_repository(tmp_path / "m", names=["tiny_cls"])
    test_models.write_model(test_models.make_tiny_cnn(), root / "tiny_cls" / "2" /
                                 "model.onnx")
    (root / "tiny_cls" / "model.yaml").unlink()  # each version's signature from its ONNX file
    (root / "tiny_cls" / "2" / "model.yaml").write_text("warmup: {enabled: false}\n")
    repo = ModelRepository(root)
    repo.set_active("tiny_cls", 1)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
        misfit = scheduler.submit("tiny_cls", {"x": cls_input(1.0)})
        # Version 2 goes live while the worker still holds version 1 (its drain times out and
        # version 1 unloads with its last lease), so the queued request meets version 2.
        cache.swap("tiny_cls", 2, drain_timeout_s=0.05)
        gate.gate.set()
        first.result(10)
        assert first.version == 1  # the version that ran it, told to the API's response
        with pytest.raises(InvalidInput, match="does not fit version 2"):
            misfit.result(10)
        after = scheduler.submit("tiny_cls", {"image": np.ones((1, 3, 8, 8), np.float32)})
        assert after.result(10)["logits"].shape == (1, 5) and after.version == 2
    finally:
        scheduler.close(5)


def test_cache_when_failed_load_is_repeated_raises_a_fresh_error_each_time(
        repo_dir: Path, tmp_path: Path) -> None:
    (repo_dir / "tiny_cnn" / "1" / "model.onnx").write_bytes(b"\x0a\x02broken")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30, options=options(tmp_path))
    errors = []
    for _ in range(50):
        with pytest.raises(Exception) as caught:
            cache.acquire("tiny_cnn")
        errors.append(caught.value)
    assert len({id(e) for e in errors}) == 50

    def frames(error: BaseException) -> int:
        tb, n = error.__traceback__, 0
        while tb:
            tb, n = tb.tb_next, n + 1
        return n

    assert frames(errors[-1]) <= frames(errors[1])  # no traceback growing with every raise


def test_cache_load_when_over_budget_keeps_the_model_it_just_loaded(
        repo: ModelRepository, tmp_path: Path) -> None:
    budget = repo.resolve("tiny_cls").onnx_path.stat().st_size
    cache = ModelCache(repo, budget_bytes=budget, options=options(tmp_path))
    lease = cache.acquire("tiny_cls")  # in use: cannot be evicted
    cache.load("tiny_cnn")
    assert cache.ready("tiny_cnn")
    lease.release()


def test_cache_swap_when_old_version_is_still_loading_unloads_it_once_used(
        tmp_path: Path, gate: GateBackend) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    repo = ModelRepository(root)
    repo.set_active("tiny_cls", 1)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    gate.gate.clear()
    leases: list = []
    loading = threading.Thread(target=lambda: leases.append(cache.acquire("tiny_cls")))
    loading.start()
    gate.wait_calls(1)  # version 1 is mid-load (its warm-up is held)
    swapping = threading.Thread(target=cache.swap, args=("tiny_cls", 2))
    swapping.start()
    gate.gate.set()
    loading.join(10)
    leases[0].release()  # the old version's one user is done
    swapping.join(10)
    assert not swapping.is_alive()
    assert cache.default_version("tiny_cls") == 2
    assert (cache.ready("tiny_cls", 1), cache.ready("tiny_cls", 2)) == (False, True)


def test_cache_swap_when_swapped_back_while_draining_keeps_it_loaded(tmp_path: Path) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    write_yaml(root, "tiny_cls", "version_policy: {all: true}\n")
    repo = ModelRepository(root)
    repo.set_active("tiny_cls", 1)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    lease = cache.acquire("tiny_cls")  # version 1 in use
    cache.swap("tiny_cls", 2, drain_timeout_s=0.01)  # 1 keeps draining behind the lease
    cache.swap("tiny_cls", 1, drain_timeout_s=5)  # back to 1 before it drained
    lease.release()
    assert cache.default_version("tiny_cls") == 1
    assert (cache.ready("tiny_cls", 1), cache.ready("tiny_cls", 2)) == (True, False)
