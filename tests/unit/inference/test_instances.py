"""`instances: auto`, the default: one instance per core on the CPU, two on a GPU, and the
batcher really running that many batches at once."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.backends import GateBackend, hold_worker, options
from support.models import cls_input, write_yaml

from edged.api.describe import model_config
from edged.backends import BackendOptions
from edged.inference import instances
from edged.inference.cache import ModelCache
from edged.inference.loadspec import engine_hints
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository


def test_instance_count_when_a_number_is_configured_keeps_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instances, "cores", lambda: 8)
    assert instances.instance_count(3, BackendOptions(providers=("cpu",))) == 3


def test_instance_count_when_auto_on_the_cpu_is_one_per_core(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instances, "cores", lambda: 6)
    assert instances.instance_count("auto", BackendOptions(providers=("cpu",))) == 6
    # A GPU chain without a CUDA device runs on the CPU: counted as the CPU.
    monkeypatch.setattr(instances.gpu, "device", lambda index=0: None)
    assert instances.instance_count("auto", BackendOptions(providers=("cuda", "cpu"))) == 6


def test_instance_count_when_auto_on_a_gpu_is_two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instances, "cores", lambda: 12)
    monkeypatch.setattr(instances.gpu, "device", lambda index=0: object())
    assert instances.instance_count("auto", BackendOptions(providers=("tensorrt", "cpu"))) == 2
    assert instances.instance_count("auto", on_gpu=True) == 2


def test_cores_is_the_process_affinity() -> None:
    assert 1 <= instances.cores() <= 4096


def test_auto_when_two_cores_runs_two_batches_at_once(
        monkeypatch: pytest.MonkeyPatch, repo: ModelRepository, gate: GateBackend,
        tmp_path: Path) -> None:
    monkeypatch.setattr(instances, "cores", lambda: 2)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(1.0)})
        second = scheduler.submit("tiny_cls", {"x": cls_input(2.0)})
        gate.wait_calls(2)  # the second ran beside the held one instead of queueing
        assert len(set(gate.threads)) == 2
        assert scheduler.batchers()[0].instances == 2
        gate.gate.set()
        assert first.result(10)["prob"].shape == (1, 4)
        assert second.result(10)["prob"].shape == (1, 4)
    finally:
        gate.gate.set()
        scheduler.close(5)
        cache.close(timeout_s=5)


def test_config_when_auto_reports_the_count_and_a_number_is_kept(
        monkeypatch: pytest.MonkeyPatch, repo_dir: Path) -> None:
    monkeypatch.setattr(instances, "cores", lambda: 4)
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    assert model.config.instances == "auto"
    assert model_config(model)["instance_group"][0]["count"] == 4
    assert engine_hints(model)["instances"] == 2  # TensorRT contexts: it runs on the GPU
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 4\ninstances: 3\n")
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    assert model_config(model)["instance_group"][0]["count"] == 3
    assert engine_hints(model)["instances"] == 3


def test_auto_with_a_queue_delay_fills_one_batch_at_a_time_and_runs_two(
        monkeypatch: pytest.MonkeyPatch, repo_dir: Path, gate: GateBackend,
        tmp_path: Path) -> None:
    """Two instances and a queue delay: arrivals join the batch one instance is filling (the
    other does not cut them off into a batch of its own), and once that batch runs, the other
    instance fills and runs the next beside it."""
    monkeypatch.setattr(instances, "cores", lambda: 2)
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 4\nbatching: {preferred_batch_sizes: "
               "[3], max_queue_delay_us: 5000000}\n")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30,
                       options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        cache.load("tiny_cls")
        gate.reset()
        gate.gate.clear()
        first = [scheduler.submit("tiny_cls", {"x": cls_input(float(i))}) for i in range(2)]
        with gate.cond:  # two of three: still filling, nothing ran
            assert not gate.cond.wait_for(lambda: gate.calls, 0.3)
        first.append(scheduler.submit("tiny_cls", {"x": cls_input(2.0)}))
        gate.wait_calls(1)
        assert gate.calls[0]["x"].shape[0] == 3  # one batch, held at the gate
        second = [scheduler.submit("tiny_cls", {"x": cls_input(float(i))}) for i in range(3)]
        gate.wait_calls(2)  # filled and run by the other instance while the first is held
        assert gate.calls[1]["x"].shape[0] == 3
        assert len(set(gate.threads)) == 2
        gate.gate.set()
        for future in first + second:
            assert future.result(10)["prob"].shape == (1, 4)
        stats = scheduler.batchers()[0].stats
        assert (stats.exec_count, stats.inference_count) == (2, 6)
    finally:
        gate.gate.set()
        scheduler.close(5)
        cache.close(timeout_s=5)


@pytest.mark.parametrize("rows_are_slow", [True, False])
def test_cpu_instances_when_rows_are_slow_split_the_queue_between_them(
        monkeypatch: pytest.MonkeyPatch, repo_dir: Path, gate: GateBackend, tmp_path: Path,
        rows_are_slow: bool) -> None:
    """Both CPU instances busy, four requests queued: where a row takes SPREAD_MIN_NS or
    more, the instance that comes free first takes its share (half) and leaves the rest to
    the other, so both cores run them; where rows are quick, one takes them all (one call)."""
    from edged.inference import batcher

    monkeypatch.setattr(instances, "cores", lambda: 2)
    monkeypatch.setattr(batcher, "SPREAD_MIN_NS", 0 if rows_are_slow else 1 << 60)
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 8\n")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30,
                       options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        held = [hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.0)})]
        held.append(scheduler.submit("tiny_cls", {"x": cls_input(1.0)}))
        gate.wait_calls(2)  # both instances held: what comes next queues
        queued = [scheduler.submit("tiny_cls", {"x": cls_input(float(i))})
                  for i in range(2, 6)]
        gate.gate.set()
        for future in held + queued:
            assert future.result(10)["prob"].shape == (1, 4)
        batches = [call["x"].shape[0] for call in gate.calls[2:]]
        assert sum(batches) == 4
        if rows_are_slow:
            assert max(batches) <= 2 and len(batches) >= 2
        else:
            assert batches == [4]
    finally:
        gate.gate.set()
        scheduler.close(5)
        cache.close(timeout_s=5)
