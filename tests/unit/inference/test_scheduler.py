"""The dynamic batcher with real ONNX Runtime sessions. A gate around the sessions holds the
worker mid-inference, so the queue fills exactly as each story needs, without sleeps."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from support.backends import GateBackend, hold_worker, options
from support.models import cls_input, write_yaml
from support.polling import wait_until

from edged.core.errors import (
    InferenceFailed,
    InvalidInput,
    ModelNotFound,
    QueueFull,
    ShuttingDown,
    Timeout,
)
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from tools.assets import models as test_models

Core = tuple[ModelCache, Scheduler]


def direct(repo: ModelRepository, name: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(repo.resolve(name).onnx_path),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def markers(gate: GateBackend, name: str = "x") -> list[list[float]]:
    return [[float(v) for v in call[name][:, 0, 0, 0]] for call in gate.calls]


def test_batcher_when_requests_queue_batches_them_and_outputs_equal_unbatched(
        core: Core, gate: GateBackend, repo: ModelRepository) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    inputs = [cls_input(1.0 + i, rows=1 + i % 3) for i in range(6)]  # 1..3 rows each, 12 total
    futures = [scheduler.submit("tiny_cls", {"x": x}) for x in inputs]
    gate.gate.set()
    results = [f.result(10)["prob"] for f in futures]
    first.result(10)
    assert markers(gate) == [[0.5], [1, 2, 2, 3, 3, 3, 4, 5, 5, 6, 6, 6]]  # one batch of 12
    for x, got in zip(inputs, results, strict=True):
        np.testing.assert_allclose(got, direct(repo, "tiny_cls", {"x": x})[0], rtol=1e-5,
                                   atol=1e-6)


def test_batcher_when_batch_would_exceed_max_splits_at_the_limit(
        core: Core, gate: GateBackend, repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 4\n")
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    futures = [scheduler.submit("tiny_cls", {"x": cls_input(1.0 + i, rows=2)}) for i in range(3)]
    gate.gate.set()
    for f in [first, *futures]:
        f.result(10)
    assert [len(m) for m in markers(gate)] == [1, 4, 2]


def test_batcher_when_non_batch_dims_differ_never_mixes_them(core: Core,
                                                             gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cnn", {"image": np.ones((1, 3, 8, 8), np.float32)})
    shapes = [(8, 8), (8, 8), (10, 12), (10, 12), (8, 8)]
    futures = [scheduler.submit("tiny_cnn", {"image": np.ones((1, 3, *hw), np.float32)})
               for hw in shapes]
    gate.gate.set()
    outputs = [f.result(10)["logits"] for f in [first, *futures]]
    assert [call["image"].shape for call in gate.calls] == \
        [(1, 3, 8, 8), (2, 3, 8, 8), (2, 3, 10, 12), (1, 3, 8, 8)]  # FIFO kept, shapes apart
    assert all(o.shape == (1, 5) for o in outputs)


def test_batcher_when_model_has_two_inputs_and_outputs_splits_both(
        core: Core, gate: GateBackend, repo: ModelRepository) -> None:
    _, scheduler = core
    rng = np.random.default_rng(3)
    first = hold_worker(scheduler, gate, "tiny_two_input",
                        {"a": np.zeros((1, 4), np.float32), "b": np.zeros((1, 4), np.float32)})
    feeds = [{"a": rng.random((n, 4), dtype=np.float32), "b": rng.random((n, 4), dtype=np.float32)}
             for n in (1, 3, 2)]
    futures = [scheduler.submit("tiny_two_input", feed) for feed in feeds]
    gate.gate.set()
    first.result(10)
    assert len(gate.calls) == 2
    for feed, future in zip(feeds, futures, strict=True):
        got = future.result(10)
        want_sum, want_dot = direct(repo, "tiny_two_input", feed)
        np.testing.assert_allclose(got["sum"], want_sum, rtol=1e-6)
        np.testing.assert_allclose(got["dot"], want_dot, rtol=1e-6)


def test_batcher_when_model_has_no_batch_dim_runs_requests_one_by_one(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_nobatch", {"v": np.zeros(4, np.float32)})
    futures = [scheduler.submit("tiny_nobatch", {"v": np.full(4, i, np.float32)})
               for i in range(3)]
    gate.gate.set()
    for f in [first, *futures]:
        assert f.result(10)["out"].shape == (4,)
    assert [float(call["v"][0]) for call in gate.calls] == [0, 0, 1, 2]


def test_batcher_when_priorities_differ_runs_higher_priority_first(
        core: Core, gate: GateBackend, repo_dir: Path) -> None:
    # A full batch each (4 rows of max 4), so priority alone decides the order.
    write_yaml(repo_dir, "tiny_cls",
               "max_batch_size: 4\nbatching: {priority_levels: 3, default_priority: 2}\n")
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    low = scheduler.submit("tiny_cls", {"x": cls_input(3.0, rows=4)}, priority=3)
    default = scheduler.submit("tiny_cls", {"x": cls_input(2.0, rows=4)})
    high = scheduler.submit("tiny_cls", {"x": cls_input(1.0, rows=4)}, priority=1)
    gate.gate.set()
    for f in (first, low, default, high):
        f.result(10)
    assert [m[0] for m in markers(gate)] == [0.5, 1.0, 2.0, 3.0]


def test_scheduler_infer_when_model_idle_runs_on_the_calling_thread(core: Core,
                                                                    gate: GateBackend) -> None:
    _, scheduler = core
    scheduler.cache.load("tiny_cls")
    gate.reset()
    assert scheduler.infer("tiny_cls", {"x": cls_input(1.0)})["prob"].shape == (1, 4)
    assert gate.threads == [threading.current_thread().name]


def test_scheduler_infer_when_instance_busy_queues_and_batches(core: Core,
                                                               gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    results: list[np.ndarray] = []
    callers = [threading.Thread(target=lambda m=m: results.append(
        scheduler.infer("tiny_cls", {"x": cls_input(m)})["prob"])) for m in (1.0, 2.0)]
    for t in callers:
        t.start()
    wait_queued(scheduler, 2)
    assert len(gate.calls) == 1  # the single instance is busy: nobody ran beside it
    gate.gate.set()
    for t in callers:
        t.join(10)
    first.result(10)
    assert len(results) == 2
    assert sorted(markers(gate)[1]) == [1.0, 2.0]  # the two blocking calls ran as one batch
    assert all(name.startswith("edged-tiny_cls") for name in gate.threads)


def wait_queued(scheduler: Scheduler, n: int) -> None:
    batcher = scheduler.batchers()[0]
    wait_until(lambda: batcher.depth >= n, timeout=10, what=f"{n} requests queued")


def test_batcher_when_priority_outside_levels_is_invalid(core: Core) -> None:
    _, scheduler = core
    with pytest.raises(InvalidInput, match=r"priority 2 is outside 1..1"):
        scheduler.submit("tiny_cls", {"x": cls_input(1.0)}, priority=2)


def test_batcher_when_queue_full_rejects_with_queue_full(core: Core, gate: GateBackend,
                                                         repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "batching: {max_queue_size: 2}\n")
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    queued = [scheduler.submit("tiny_cls", {"x": cls_input(1.0)}) for _ in range(2)]
    with pytest.raises(QueueFull, match="queue is full"):
        scheduler.submit("tiny_cls", {"x": cls_input(2.0)})
    gate.gate.set()
    for f in [first, *queued]:
        f.result(10)
    assert scheduler.batchers()[0].stats.rejected == 1
    scheduler.submit("tiny_cls", {"x": cls_input(3.0)}).result(10)  # room again
    (row,) = scheduler.counters()  # what /metrics and the stats message read
    assert (row.model, row.rejected, row.timeouts) == ("tiny_cls", 1, 0)


def test_batcher_when_request_times_out_in_queue_it_is_never_executed(
        core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    doomed = scheduler.submit("tiny_cls", {"x": cls_input(7.0)}, timeout_s=0.05)
    patient = scheduler.submit("tiny_cls", {"x": cls_input(8.0)}, timeout_s=30)
    with pytest.raises(Timeout, match="timed out after"):
        doomed.result(10)  # fails while the worker is still held: enforced in the queue
    gate.gate.set()
    first.result(10)
    patient.result(10)
    assert 7.0 not in [v for m in markers(gate) for v in m]
    stats = scheduler.batchers()[0].stats
    assert (stats.timeouts, stats.success) == (1, 2)
    (row,) = scheduler.counters()
    assert (row.timeouts, row.failure, row.rejected) == (1, 1, 0)


def test_batcher_when_model_sets_default_timeout_applies_it(core: Core, gate: GateBackend,
                                                            repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "batching: {default_timeout_ms: 50}\n")
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    with pytest.raises(Timeout):
        scheduler.submit("tiny_cls", {"x": cls_input(7.0)}).result(10)
    gate.gate.set()
    first.result(10)


def test_batcher_when_backend_raises_fails_only_that_batch(core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    gate.fail_if = lambda inputs: bool(np.isnan(inputs["x"]).any())
    bad = cls_input(1.0)
    bad[0, 1, 1, 1] = np.nan
    with pytest.raises(InferenceFailed, match="injected backend failure"):
        scheduler.infer("tiny_cls", {"x": bad})
    assert scheduler.infer("tiny_cls", {"x": cls_input(2.0)})["prob"].shape == (1, 4)
    stats = scheduler.batchers()[0].stats
    assert (stats.failure, stats.success) == (1, 1)


def test_batcher_when_caller_cancels_while_queued_skips_it(core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    cancelled = scheduler.submit("tiny_cls", {"x": cls_input(7.0)})
    kept = scheduler.submit("tiny_cls", {"x": cls_input(8.0)})
    assert cancelled.cancel()
    gate.gate.set()
    first.result(10)
    kept.result(10)
    assert markers(gate) == [[0.5], [8.0]]


@pytest.mark.parametrize(("inputs", "message"), [
    ({"x": np.zeros((1, 3, 8, 8), np.float64)}, "dtype float64, expected float32"),
    ({"x": np.zeros((1, 3, 8, 9), np.float32)}, r"shape \[1, 3, 8, 9\], expected \[-1, 3, 8, 8\]"),
    ({"x": np.zeros((3, 8, 8), np.float32)}, r"shape \[3, 8, 8\]"),
    ({"y": np.zeros((1, 3, 8, 8), np.float32)}, r"expects inputs \['x'\], got \['y'\]"),
    ({"x": np.zeros((17, 3, 8, 8), np.float32)}, r"batch of 17 is outside 1..16"),
    ({"x": [[1.0]]}, "must be a numpy array"),
])
def test_scheduler_when_input_is_wrong_raises_invalid_input(core: Core, inputs: dict,
                                                            message: str) -> None:
    _, scheduler = core
    with pytest.raises(InvalidInput, match=message):
        scheduler.submit("tiny_cls", inputs)


def test_scheduler_when_two_inputs_disagree_on_batch_raises(core: Core) -> None:
    _, scheduler = core
    with pytest.raises(InvalidInput, match="disagree on the batch size"):
        scheduler.submit("tiny_two_input", {"a": np.zeros((2, 4), np.float32),
                                            "b": np.zeros((3, 4), np.float32)})


def test_scheduler_when_model_unknown_raises_not_found(core: Core) -> None:
    _, scheduler = core
    with pytest.raises(ModelNotFound):
        scheduler.submit("nope", {"x": cls_input(1.0)})


def test_scheduler_when_version_named_uses_it(tmp_path: Path) -> None:
    from tools.assets import models as test_models

    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    write_yaml(root, "tiny_cls", "version_policy: {all: true}\n")
    cache = ModelCache(ModelRepository(root), budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        x = cls_input(1.0)
        v1 = scheduler.infer("tiny_cls", {"x": x}, version=1)["prob"]
        v2 = scheduler.infer("tiny_cls", {"x": x}, version=2)["prob"]
        latest = scheduler.infer("tiny_cls", {"x": x})["prob"]
        assert not np.allclose(v1, v2) and np.array_equal(v2, latest)
        with pytest.raises(ModelNotFound):
            scheduler.submit("tiny_cls", {"x": x}, version=3)
    finally:
        scheduler.close(5)


def test_scheduler_when_closed_drains_queue_then_refuses(core: Core, gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    queued = scheduler.submit("tiny_cls", {"x": cls_input(1.0)})
    gate.gate.set()
    scheduler.close(5)
    assert queued.result(0)["prob"].shape == (1, 4) and first.done()
    with pytest.raises(ShuttingDown):
        scheduler.submit("tiny_cls", {"x": cls_input(1.0)})


def test_scheduler_when_close_deadline_passes_fails_leftovers(core: Core,
                                                              gate: GateBackend) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.5)})
    queued = scheduler.submit("tiny_cls", {"x": cls_input(1.0)})
    scheduler.close(0.05)  # the worker is held: the queued request cannot run in time
    with pytest.raises(ShuttingDown):
        queued.result(0)
    gate.gate.set()
    first.result(10)


def test_scheduler_with_real_ppocr_cls_when_batched_matches_single_runs(ppocr_cls: Path,
                                                                        tmp_path: Path) -> None:
    cache = ModelCache(ModelRepository(ppocr_cls), budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        rng = np.random.default_rng(0)
        images = [rng.random((1, 3, 48, 192), dtype=np.float32) for _ in range(6)]
        futures = [scheduler.submit("cls", {"x": x}) for x in images]
        batched = [f.result(30)["save_infer_model/scale_0.tmp_1"] for f in futures]
        for x, got in zip(images, batched, strict=True):
            single = scheduler.infer("cls", {"x": x})["save_infer_model/scale_0.tmp_1"]
            np.testing.assert_allclose(got, single, rtol=1e-4, atol=1e-5)
        stats = scheduler.batchers()[0].stats
        assert stats.exec_count < stats.success  # some of the first six ran together
    finally:
        scheduler.close(5)


def test_scheduler_when_a_named_version_leaves_the_disk_retires_its_batcher(
        tmp_path: Path) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    repo = ModelRepository(root)
    write_yaml(root, "tiny_cls", "version_policy: {all: true}\n")
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    repo.on_version_removed(scheduler.retire)  # as the daemon wires it
    try:
        scheduler.infer("tiny_cls", {"x": cls_input(1.0)}, version=1)
        assert scheduler.has_batcher("tiny_cls", 1)
        assert any(t.name.startswith("edged-tiny_cls:1-") for t in threading.enumerate())
        cache.unload("tiny_cls", 1)
        repo.remove_version("tiny_cls", 1)  # e.g. OTA pruning beyond keep_versions
        assert not scheduler.has_batcher("tiny_cls", 1)
        assert not any(t.name.startswith("edged-tiny_cls:1-") for t in threading.enumerate())
        scheduler.infer("tiny_cls", {"x": cls_input(2.0)})  # the model itself serves on
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)
