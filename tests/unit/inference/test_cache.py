"""The warm cache with real ONNX Runtime sessions: load once, warm-up, LRU under a budget, pins,
leases, failures that stay contained, and a swap that no request notices."""

from __future__ import annotations

import threading
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from support.backends import GateBackend, options
from support.models import write_yaml

from edged.core.errors import InvalidModel, ModelNotFound, Timeout
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from tools.assets import models as test_models

X = np.linspace(0, 1, 3 * 8 * 8, dtype=np.float32).reshape(1, 3, 8, 8)


def size_of(repo: ModelRepository, name: str) -> int:
    return repo.resolve(name).onnx_path.stat().st_size


def test_cache_when_eight_threads_ask_first_loads_once(repo: ModelRepository, tmp_path: Path,
                                                       gate: GateBackend) -> None:
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    start = threading.Barrier(8)
    leases = []

    def first_request() -> None:
        start.wait()
        leases.append(cache.acquire("tiny_cls"))

    threads = [threading.Thread(target=first_request) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert gate.loads == ["tiny_cls:1"]
    assert len({id(lease.session) for lease in leases}) == 1
    assert next(s for s in cache.status() if s.name == "tiny_cls").in_use == 8
    for lease in leases:
        lease.release()
    assert next(s for s in cache.status() if s.name == "tiny_cls").in_use == 0


def test_cache_when_loading_runs_warmup_before_ready(repo: ModelRepository, tmp_path: Path,
                                                     gate: GateBackend) -> None:
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    cache.load("tiny_cnn")
    assert len(gate.calls) == 1  # the warm-up, before anyone could use it
    assert gate.calls[0]["image"].shape == (1, 3, 32, 32)  # dynamic H/W warm at 32
    assert cache.ready("tiny_cnn")


def test_cache_when_warmup_shapes_given_uses_them(repo_dir: Path, tmp_path: Path,
                                                  gate: GateBackend) -> None:
    write_yaml(repo_dir, "tiny_cnn", "warmup: {batch_size: 2, shapes: {image: [3, 16, 24]}}\n")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30, options=options(tmp_path))
    cache.load("tiny_cnn")
    assert gate.calls[0]["image"].shape == (2, 3, 16, 24)


def test_cache_when_over_budget_evicts_least_recently_used_idle_unpinned(
        repo: ModelRepository, tmp_path: Path) -> None:
    names = ["tiny_cls", "tiny_cnn", "tiny_two_input"]
    budget = sum(size_of(repo, n) for n in names[:2])  # room for the first two only
    cache = ModelCache(repo, budget_bytes=budget, options=options(tmp_path))
    for name in names[:2]:
        cache.load(name)
    cache.acquire("tiny_cls").release()  # tiny_cnn is now the least recently used
    cache.load("tiny_two_input")
    assert [s.name for s in cache.status() if s.state == "READY"] == ["tiny_cls",
                                                                      "tiny_two_input"]
    assert cache.evictions == 1


def test_cache_counters_when_the_budget_evicts_count_that_but_not_an_unload(
        repo: ModelRepository, tmp_path: Path) -> None:
    cache = ModelCache(repo, budget_bytes=size_of(repo, "tiny_cls"), options=options(tmp_path))
    cache.load("tiny_cls")
    cache.load("tiny_cnn")  # over budget: the idle tiny_cls goes
    assert cache.unload("tiny_cnn")  # asked for: not an eviction
    cache.load("tiny_cls")
    counts = {c.name: (c.loads, c.failed_loads, c.evictions) for c in cache.counters()}
    assert counts == {"tiny_cls": (2, 0, 1), "tiny_cnn": (1, 0, 0)}
    assert cache.evictions == 1


def test_cache_counters_when_a_load_and_warmup_take_time_record_it_per_version(
        repo: ModelRepository, tmp_path: Path, gate: GateBackend) -> None:
    now = [1000.0]
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path),
                       clock=lambda: now[0])
    gate.gate.clear()  # the warm-up inference waits until the test has moved the clock
    loading = threading.Thread(target=cache.load, args=("tiny_cnn",))
    loading.start()
    gate.wait_calls(1)
    now[0] += 2.5
    gate.gate.set()
    loading.join(10)
    [counters] = cache.counters()
    assert (counters.name, counters.loads, dict(counters.load_seconds)) == ("tiny_cnn", 1,
                                                                           {1: 2.5})
    assert next(s for s in cache.status() if s.name == "tiny_cnn").load_seconds == 2.5


def test_cache_counters_when_a_load_fails_count_each_attempt_not_each_request(
        repo_dir: Path, tmp_path: Path) -> None:
    (repo_dir / "tiny_cnn" / "1" / "model.onnx").write_bytes(b"\x0a\x02broken")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30, options=options(tmp_path))
    for _ in range(3):  # the first attempt fails; the next two get its remembered error
        with pytest.raises(InvalidModel):
            cache.acquire("tiny_cnn")
    with pytest.raises(InvalidModel):
        cache.load("tiny_cnn")  # an explicit load tries again
    [counters] = cache.counters()
    assert (counters.name, counters.loads, counters.failed_loads) == ("tiny_cnn", 0, 2)
    assert counters.load_seconds == {}


def test_cache_when_model_pinned_or_in_use_never_evicts_it(repo: ModelRepository,
                                                           tmp_path: Path) -> None:
    budget = size_of(repo, "tiny_cls")  # room for one model
    cache = ModelCache(repo, budget_bytes=budget, options=options(tmp_path), pinned=["tiny_cls"])
    cache.load("tiny_cls")
    lease = cache.acquire("tiny_cnn")  # over budget, but cls is pinned and cnn in use
    cache.load("tiny_nobatch")  # over budget still: nobatch was just loaded, the rest protected
    ready = {s.name for s in cache.status() if s.state == "READY"}
    assert {"tiny_cls", "tiny_cnn"} <= ready
    lease.release()  # cnn idle now: released leases are evicted while over budget
    ready = {s.name for s in cache.status() if s.state == "READY"}
    assert "tiny_cls" in ready and "tiny_cnn" not in ready


def test_cache_when_evicted_model_requested_again_reloads_it(repo: ModelRepository,
                                                             tmp_path: Path) -> None:
    cache = ModelCache(repo, budget_bytes=size_of(repo, "tiny_cls"), options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        first = scheduler.infer("tiny_cls", {"x": X})["prob"]
        scheduler.infer("tiny_cnn", {"image": np.ones((1, 3, 8, 8), np.float32)})
        assert not cache.ready("tiny_cls")
        np.testing.assert_array_equal(scheduler.infer("tiny_cls", {"x": X})["prob"], first)
    finally:
        scheduler.close(5)


def test_cache_when_model_file_corrupt_reports_it_and_serves_the_others(
        repo_dir: Path, tmp_path: Path) -> None:
    (repo_dir / "tiny_cnn" / "1" / "model.onnx").write_bytes(b"\x0a\x02broken")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30, options=options(tmp_path))
    with pytest.raises(InvalidModel, match=r"tiny_cnn/1/model\.onnx: not a valid ONNX model"):
        cache.load("tiny_cnn")
    cache.load("tiny_cls")
    states = {s.name: s for s in cache.status()}
    assert states["tiny_cls"].state == "READY"
    assert states["tiny_cnn"].state == "UNAVAILABLE"
    assert "not a valid ONNX model" in (states["tiny_cnn"].reason or "")


def test_cache_when_warmup_fails_model_is_not_ready(repo_dir: Path, tmp_path: Path) -> None:
    # a warm-up shape the graph cannot run: the model must not be reported ready
    write_yaml(repo_dir, "tiny_cnn", "warmup: {shapes: {image: [3, 0, 0]}}\n")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30, options=options(tmp_path))
    with pytest.raises(Exception, match="warm-up inference failed"):
        cache.load("tiny_cnn")
    assert not cache.ready("tiny_cnn")


def test_cache_when_unknown_model_raises_not_found(core: tuple[ModelCache, Scheduler]) -> None:
    cache, _ = core
    with pytest.raises(ModelNotFound):
        cache.acquire("nope")


def test_cache_unload_when_lease_held_waits_for_it(core: tuple[ModelCache, Scheduler]) -> None:
    cache, _ = core
    lease = cache.acquire("tiny_cls")
    assert cache.unload("tiny_cls", timeout_s=0.05) is False  # still in use: not unloaded
    assert cache.ready("tiny_cls")
    lease.release()  # the retiring model goes with its last lease
    assert not cache.ready("tiny_cls")


def test_cache_swap_when_eight_clients_call_no_request_fails_and_each_switches_once(
        tmp_path: Path) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    repo = ModelRepository(root)
    repo.set_active("tiny_cls", 1)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    old = scheduler.infer("tiny_cls", {"x": X})["prob"]
    seen: list[list[str]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    swapped = threading.Event()
    after_swap = threading.Barrier(9)

    def client(i: int) -> None:
        try:
            # Bounded (~10 s of calls), but enough to outlast a swap on a loaded machine; stops
            # 20 calls after the swap.
            for n in range(200_000):
                out = scheduler.infer("tiny_cls", {"x": X})["prob"]
                seen[i].append("old" if np.array_equal(out, old) else "new")
                if swapped.is_set() and n > 20 and seen[i][-20:] == ["new"] * 20:
                    break
        except BaseException as exc:
            errors.append(exc)
        finally:
            after_swap.wait(30)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    cache.swap("tiny_cls", 2, drain_timeout_s=10)
    swapped.set()
    after_swap.wait(30)
    scheduler.close(5)
    assert errors == []
    for trace in seen:
        switches = sum(1 for a, b in pairwise(trace) if a != b)
        assert trace[-1] == "new" and switches <= 1, trace
    assert sum("new" in t for t in seen) == 8
    assert sum("old" in t for t in seen) >= 1  # the swap really happened under load
    assert [(s.version, s.state) for s in cache.status() if s.state == "READY"] == [(2, "READY")]


def test_cache_when_another_load_of_the_version_outlasts_the_wait_raises_timeout(
        repo: ModelRepository, tmp_path: Path, gate: GateBackend) -> None:
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path), load_wait_s=0.2)
    gate.gate.clear()  # the first load stops in its warm-up inference
    first = threading.Thread(target=cache.load, args=("tiny_cls",))
    first.start()
    gate.wait_calls(1)
    with pytest.raises(Timeout, match=r"tiny_cls:1 is still loading after 0\.2 s"):
        cache.acquire("tiny_cls")
    gate.gate.set()
    first.join(10)
    with cache.acquire("tiny_cls") as lease:  # the first load landed; nothing was lost
        assert lease.model.version == 1
    assert gate.loads == ["tiny_cls:1"]


def test_cache_preload_within_budget_when_the_next_model_would_not_fit_leaves_it_and_says_why(
        repo: ModelRepository, tmp_path: Path) -> None:
    budget = size_of(repo, "tiny_cls") + size_of(repo, "colors") + 1
    cache = ModelCache(repo, budget_bytes=budget, options=options(tmp_path))
    missed = cache.preload(["tiny_cls", "colors", "tiny_cnn"], within_budget=True)
    assert missed == ["tiny_cnn"]
    assert cache.loaded() == ["colors:1", "tiny_cls:1"]  # nothing evicted to make room
    row = next(r for r in cache.status() if r.name == "tiny_cnn")
    assert row.state == "UNAVAILABLE" and row.reason is not None
    assert row.reason.startswith("not preloaded: the cache budget") and \
        row.reason.endswith("loads on first request")
    with cache.acquire("tiny_cnn") as lease:  # a request still loads it (evicting an idle one)
        assert lease.model.name == "tiny_cnn"


def test_cache_unload_when_a_session_closes_trims_the_heap(
        core: tuple[ModelCache, Scheduler], monkeypatch: pytest.MonkeyPatch) -> None:
    import edged.inference.cache as cache_module

    trims: list[bool] = []
    monkeypatch.setattr(cache_module, "trim_heap", lambda: trims.append(True) or True)
    cache, _ = core
    cache.load("tiny_cls")
    assert cache.unload("tiny_cls") and trims == [True]
