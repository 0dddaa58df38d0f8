"""The response cache (Triton's semantics): a model that opts in has a request it was already
asked answered without running it, counted as Triton counts hits and misses; entries are keyed
by every input's name, dtype, shape and bytes and the outputs asked for, held within a byte
budget (least recently used out first), and dropped when their version stops serving."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.backends import GateBackend, options
from support.models import cls_input, write_yaml

from edged.api.describe import model_config, model_statistics
from edged.core.errors import InvalidModel
from edged.inference.batching import BatcherStats
from edged.inference.cache import ModelCache
from edged.inference.responses import ENTRY_OVERHEAD_BYTES, SMALL_INPUT_BYTES, Miss, ResponseCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.model.tensor import TensorSpec

SPECS = (TensorSpec("x", np.dtype(np.float32), (-1, 4)),)
Core = tuple[ModelCache, Scheduler, ResponseCache]


def look(cache: ResponseCache, x: np.ndarray, outputs: tuple[str, ...] = (),
         version: int = 1) -> tuple[dict[str, np.ndarray] | None, Miss | int]:
    return cache.lookup("m", version, {"x": x}, SPECS, outputs)


def missed(cache: ResponseCache, x: np.ndarray, outputs: tuple[str, ...] = (),
           version: int = 1) -> Miss:
    found, miss = look(cache, x, outputs, version)
    assert found is None and isinstance(miss, Miss)
    return miss


def test_response_cache_when_an_answer_was_kept_returns_a_read_only_copy_of_it() -> None:
    cache = ResponseCache(1 << 20)
    x = np.ones((1, 4), np.float32)
    answer = {"y": np.arange(4, dtype=np.float32)}
    assert cache.insert(missed(cache, x), answer) is not None
    answer["y"][0] = 99  # the batch's buffer is reused: the entry must not change with it
    found, ns = look(cache, x.copy())
    assert found is not None and isinstance(ns, int)
    np.testing.assert_array_equal(found["y"], np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError):
        found["y"][0] = 1


@pytest.mark.parametrize("other", [
    {"x": np.full((1, 4), 2, np.float32)},  # another byte
    {"x": np.ones((2, 2), np.float32)},  # another shape, the same bytes
    {"x": np.ones((1, 4), np.float32).view(np.int32)},  # another dtype, the same bytes
    {"outputs": ("y",)},  # other outputs asked for
    {"version": 2},  # another version
])
def test_response_cache_when_anything_in_the_key_differs_misses(other: dict) -> None:
    cache = ResponseCache(1 << 20)
    cache.insert(missed(cache, np.ones((1, 4), np.float32)), {"y": np.zeros(2, np.float32)})
    x = other.get("x", np.ones((1, 4), np.float32))
    found, _ = cache.lookup("m", other.get("version", 1), {"x": x},
                            (TensorSpec("x", x.dtype, (-1, -1)),), other.get("outputs", ()))
    assert found is None


def test_response_cache_when_an_input_is_large_keys_it_by_a_digest_not_its_bytes() -> None:
    cache = ResponseCache(1 << 20)
    big = np.random.default_rng(0).random((1, SMALL_INPUT_BYTES), dtype=np.float32)
    miss = missed(cache, big)
    assert max(len(p) for p in miss.key if isinstance(p, bytes)) < 64
    cache.insert(miss, {"y": np.zeros(1, np.float32)})
    assert look(cache, big.copy())[0] is not None
    changed = big.copy()
    changed[0, -1] += 1
    assert look(cache, changed)[0] is None


def test_response_cache_when_over_budget_drops_the_least_recently_used_first() -> None:
    answer = {"y": np.zeros(1000, np.float32)}  # 4000 bytes
    cache = ResponseCache(3 * (4000 + ENTRY_OVERHEAD_BYTES + 100))
    inputs = [np.full((1, 4), i, np.float32) for i in range(4)]
    for x in inputs[:3]:
        cache.insert(missed(cache, x), answer)
    assert look(cache, inputs[0])[0] is not None  # used: the second one is now the oldest
    cache.insert(missed(cache, inputs[3]), answer)
    assert len(cache) == 3 and cache.evictions == 1 and cache.bytes <= cache.budget_bytes
    assert look(cache, inputs[1])[0] is None
    assert all(look(cache, inputs[i])[0] is not None for i in (0, 2, 3))


def test_response_cache_when_an_answer_exceeds_the_whole_budget_keeps_nothing() -> None:
    cache = ResponseCache(1000)
    ns = cache.insert(missed(cache, np.ones((1, 4), np.float32)),
                      {"y": np.zeros(1000, np.float32)})
    assert ns is not None  # still a miss that was counted, as Triton counts a failed insert
    assert len(cache) == 0 and cache.bytes == 0 and cache.refused == 1


def test_response_cache_when_the_same_key_went_in_meanwhile_counts_no_second_miss() -> None:
    cache = ResponseCache(1 << 20)
    x = np.ones((1, 4), np.float32)
    first, second = missed(cache, x), missed(cache, x)
    assert cache.insert(first, {"y": np.zeros(1, np.float32)}) is not None
    assert cache.insert(second, {"y": np.zeros(1, np.float32)}) is None


def test_response_cache_when_a_version_is_forgotten_drops_it_and_its_late_answers() -> None:
    cache = ResponseCache(1 << 20)
    x = np.ones((1, 4), np.float32)
    cache.insert(missed(cache, x), {"y": np.zeros(1, np.float32)})
    cache.insert(missed(cache, x, version=2), {"y": np.zeros(1, np.float32)})
    late = missed(cache, 2 * x)  # being computed while the version goes
    cache.forget("m", 1)
    cache.insert(late, {"y": np.zeros(1, np.float32)})
    assert len(cache) == 1 and look(cache, x, version=2)[0] is not None
    assert look(cache, x)[0] is None and look(cache, 2 * x)[0] is None


def test_response_cache_when_bytes_elements_split_differently_keys_them_apart() -> None:
    cache = ResponseCache(1 << 20)
    specs = (TensorSpec("s", np.dtype(object), (-1,)),)
    ab = np.array([b"ab", b"c"], dtype=object)
    _, miss = cache.lookup("m", 1, {"s": ab}, specs, ())
    assert isinstance(miss, Miss)
    cache.insert(miss, {"y": np.zeros(1, np.float32)})
    found, _ = cache.lookup("m", 1, {"s": np.array([b"a", b"bc"], dtype=object)}, specs, ())
    assert found is None
    assert cache.lookup("m", 1, {"s": np.array(["ab", "c"], dtype=object)}, specs, ())[0] \
        is not None


@pytest.fixture
def cached(repo_dir: Path, tmp_path: Path, gate: GateBackend) -> Iterator[Core]:
    """tiny_cls with `response_cache: true`, a scheduler answering from a 1 MiB cache that
    forgets a version when its session goes."""
    write_yaml(repo_dir, "tiny_cls", "response_cache: true\n")
    cache = ModelCache(ModelRepository(repo_dir), budget_bytes=1 << 30,
                       options=options(tmp_path))
    responses = ResponseCache(1 << 20)
    cache.session_gone.append(responses.forget)
    scheduler = Scheduler(cache, responses=responses)
    try:
        yield cache, scheduler, responses
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)


def ask(scheduler: Scheduler, x: np.ndarray, cached: tuple[str, ...] | None = ()
        ) -> dict[str, np.ndarray]:
    admitted = scheduler.admit("tiny_cls", {"x": x}, cached=cached)
    if not admitted.future.done():
        scheduler.queue(admitted)
    return admitted.future.result(10)


def test_scheduler_when_a_cached_model_is_asked_again_answers_without_running_it(
        cached: Core, gate: GateBackend) -> None:
    cache, scheduler, _ = cached
    cache.load("tiny_cls")
    gate.reset()
    first = ask(scheduler, cls_input(1.0))
    admitted = scheduler.admit("tiny_cls", {"x": cls_input(1.0)}, cached=())
    assert admitted.future.done() and admitted.future.version == 1  # answered at admission
    np.testing.assert_array_equal(admitted.future.result()["prob"], first["prob"])
    assert len(gate.calls) == 1
    stats = scheduler.statistics()[("tiny_cls", 1)]
    assert (stats.success, stats.cache_hits, stats.cache_misses) == (2, 1, 1)
    assert (stats.exec_count, stats.inference_count) == (1, 1)  # hits run nothing
    assert stats.cache_hit_ns > 0 and stats.cache_miss_ns > 0


def test_scheduler_when_no_cache_is_asked_or_the_model_opts_out_always_runs(
        cached: Core, gate: GateBackend, repo_dir: Path) -> None:
    cache, scheduler, responses = cached
    cache.load("tiny_cls")
    gate.reset()
    for _ in range(2):  # e.g. outputs to shared memory: never looked up
        ask(scheduler, cls_input(1.0), cached=None)
    assert len(gate.calls) == 2 and len(responses) == 0
    cache.load("tiny_cnn")  # no response_cache in its model.yaml
    for _ in range(2):
        admitted = scheduler.admit("tiny_cnn", {"image": np.zeros((1, 3, 8, 8), np.float32)},
                                   cached=())
        scheduler.queue(admitted)
        admitted.future.result(10)
    assert len(responses) == 0
    assert scheduler.statistics()[("tiny_cnn", 1)].cache_misses == 0


def test_scheduler_when_the_version_is_unloaded_its_answers_go(
        cached: Core, gate: GateBackend) -> None:
    cache, scheduler, responses = cached
    cache.load("tiny_cls")
    ask(scheduler, cls_input(1.0))
    assert len(responses) == 1
    assert cache.unload("tiny_cls")
    assert len(responses) == 0 and responses.bytes == 0
    gate.reset()
    ask(scheduler, cls_input(1.0))  # loads (and warms) it again, and runs it again
    assert gate.calls[-1]["x"][0, 0, 0, 0] == 1.0


def test_scheduler_when_bad_input_comes_refuses_it_before_any_lookup(cached: Core) -> None:
    cache, scheduler, responses = cached
    cache.load("tiny_cls")
    with pytest.raises(Exception, match="shape"):
        scheduler.admit("tiny_cls", {"x": np.zeros((1, 3, 4, 4), np.float32)}, cached=())
    assert scheduler.statistics()[("tiny_cls", 1)].cache_misses == 0 and len(responses) == 0


def test_model_yaml_when_a_cached_model_is_not_deterministic_is_refused_naming_the_key(
        repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "response_cache: true\ndeterministic: false\n")
    with pytest.raises(InvalidModel, match=r"response_cache: is true, but deterministic"):
        ModelRepository(repo_dir).get("tiny_cls", 1)


def test_model_config_when_asked_shows_the_cache_as_triton_does(repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "response_cache: true\n")
    config = model_config(ModelRepository(repo_dir).get("tiny_cls", 1))
    assert config["response_cache"] == {"enable": True}
    assert config["edged"]["deterministic"] is True


def test_statistics_when_some_requests_hit_reports_them_as_triton_does() -> None:
    stats = BatcherStats()
    stats.record([100], 1, 1000, 0.0, failed=False)  # one miss that ran (waited 100 ns)
    stats.record_miss(50)
    for _ in range(3):
        stats.record_hit(20)
    got = model_statistics("m", 1, stats)["inference_stats"]
    assert got["success"] == {"count": 4, "ns": 100 + 1000 + 50 + 60}
    assert got["queue"]["count"] == 4  # hits too, as Triton counts them
    assert got["compute_infer"] == {"count": 1, "ns": 1000}  # hits ran nothing
    assert got["compute_input"]["count"] == got["compute_output"]["count"] == 1
    assert got["cache_hit"] == {"count": 3, "ns": 60}
    assert got["cache_miss"] == {"count": 1, "ns": 50}


def test_metrics_when_a_model_hit_the_cache_exposes_tritons_cache_families() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from edged.inference.modelstatus import InferenceCounters
    from edged.service.metrics import Metrics

    row = InferenceCounters("m", 1, 4, 0, 1, 1, 10, 0, 10, 0, cache_hits=3,
                            cache_hit_ns=60_000, cache_misses=1, cache_miss_ns=5_000)
    cache = ResponseCache(1 << 20)
    cache.insert(missed(cache, np.ones((1, 4), np.float32)), {"y": np.zeros(4, np.float32)})
    metrics = Metrics(lambda: [row], list, responses=cache.snapshot, gpus=list,
                      jetson=lambda: None)
    found = {s.name: s.value for family in
             text_string_to_metric_families(metrics.render().decode()) for s in family.samples}
    assert found["edged_cache_num_hits_per_model_total"] == 3
    assert found["edged_cache_hit_duration_per_model_total"] == 60  # microseconds
    assert found["edged_cache_num_misses_per_model_total"] == 1
    assert found["edged_cache_miss_duration_per_model_total"] == 5
    assert found["edged_inference_request_success_total"] == 4  # hits included
    assert found["edged_response_cache_entries"] == 1
    assert 0 < found["edged_response_cache_bytes"] <= found["edged_response_cache_budget_bytes"]
    assert found["edged_response_cache_evictions_total"] == 0


def test_scheduler_when_an_answer_is_handed_out_it_is_already_cached(
        cached: Core, gate: GateBackend) -> None:
    """As Triton inserts before it responds: a client that sends the same request again as
    soon as it has its answer finds it (whichever thread ran the batch)."""
    cache, scheduler, responses = cached
    cache.load("tiny_cls")
    seen: list[int] = []
    admitted = scheduler.admit("tiny_cls", {"x": cls_input(1.0)}, cached=())
    admitted.future.add_done_callback(lambda _: seen.append(len(responses)))
    scheduler.queue(admitted)  # a worker runs it
    admitted.future.result(10)
    assert seen == [1]


def test_scheduler_when_requests_ran_as_one_batch_keeps_each_its_own_rows(
        cached: Core, gate: GateBackend) -> None:
    cache, scheduler, responses = cached
    cache.load("tiny_cls")
    inputs = [cls_input(1.0), cls_input(2.0, rows=2)]
    admitted = [scheduler.admit("tiny_cls", {"x": x}, cached=("prob",)) for x in inputs]
    scheduler.run_together(admitted)
    answers = [a.future.result(10)["prob"] for a in admitted]
    assert len(responses) == 2
    for x, answer in zip(inputs, answers, strict=True):
        again = scheduler.admit("tiny_cls", {"x": x}, cached=("prob",))
        assert again.future.done()
        np.testing.assert_array_equal(again.future.result()["prob"], answer)
