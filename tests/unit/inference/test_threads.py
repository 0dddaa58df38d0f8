"""`intra_op_threads: 0`: each model's first load on ONNX Runtime's CPU provider times one
intra-op thread against one per core and loads with the faster (timings injected, so the
choice is deterministic), remembers it in the cache directory, and leaves a count the config
names alone."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from support.backends import options
from support.models import write_yaml

from edged.backends import BackendOptions, LoadSpec
from edged.backends.onnxruntime import OrtBackend
from edged.inference import instances, threads
from edged.inference.cache import ModelCache
from edged.inference.loadspec import load_spec
from edged.inference.precision import sample_inputs
from edged.model.repository import ModelRepository, ModelVersion


class Timings:
    """An injected measurement: fixed p50s (one thread, many), and the counts it was asked."""

    def __init__(self, one_ms: float, many_ms: float) -> None:
        self.result = (one_ms, many_ms)
        self.calls: list[tuple[int, int]] = []

    def __call__(self, spec: LoadSpec, one: BackendOptions,
                 many: BackendOptions) -> tuple[float, float]:
        self.calls.append((one.intra_op_threads, many.intra_op_threads))
        return self.result


@pytest.fixture
def model(repo: ModelRepository) -> ModelVersion:
    return repo.resolve("tiny_cls")


@pytest.fixture
def auto(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> BackendOptions:
    monkeypatch.setattr(threads, "cores", lambda: 4)
    return dataclasses.replace(options(tmp_path), intra_op_threads=0)


def choose(model: ModelVersion, opts: BackendOptions, timings: Timings) -> int:
    chosen = threads.choose_threads(model, OrtBackend(), load_spec(model), opts,
                                    measure=timings)
    return chosen.intra_op_threads


@pytest.mark.parametrize(("one_ms", "many_ms", "expected"), [
    (0.82, 1.25, 1),  # PP-OCR cls here: splitting small operators costs more than it gives
    (88.0, 52.0, 4),  # PP-OCR det here: one per core
    (1.10, 1.00, 1),  # a gain under MIN_GAIN: the other cores stay free for other instances
])
def test_choose_when_left_to_edged_loads_the_faster_count(
        model: ModelVersion, auto: BackendOptions, one_ms: float, many_ms: float,
        expected: int) -> None:
    timings = Timings(one_ms, many_ms)
    assert choose(model, auto, timings) == expected
    assert timings.calls == [(1, 4)]


def test_choose_when_a_count_is_configured_or_the_model_runs_on_a_gpu_measures_nothing(
        model: ModelVersion, auto: BackendOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    timings = Timings(1.0, 9.0)
    assert choose(model, dataclasses.replace(auto, intra_op_threads=3), timings) == 3
    monkeypatch.setattr(instances.gpu, "device", lambda index=0: object())
    on_gpu = dataclasses.replace(auto, providers=("cuda", "cpu"))
    assert choose(model, on_gpu, timings) == 0  # ONNX Runtime's own default on a GPU
    assert timings.calls == []


def test_choose_when_remembered_does_not_measure_again(
        model: ModelVersion, auto: BackendOptions, tmp_path: Path) -> None:
    assert choose(model, auto, Timings(88.0, 52.0)) == 4
    again = Timings(1.0, 9.0)
    assert choose(model, auto, again) == 4
    assert again.calls == []
    memo = json.loads((tmp_path / "cache" / "threads" / "tiny_cls.1.json").read_text())
    assert (memo["one_ms"], memo["many_ms"], memo["key"]["cores"]) == (88.0, 52.0, 4)
    assert threads.remembered_threads(tmp_path / "cache", model) == 4


def test_choose_when_the_cores_change_or_the_memo_is_unreadable_measures_again(
        model: ModelVersion, auto: BackendOptions, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    choose(model, auto, Timings(88.0, 52.0))
    monkeypatch.setattr(threads, "cores", lambda: 8)  # another affinity: another answer
    again = Timings(1.0, 2.0)
    assert choose(model, auto, again) == 1
    (tmp_path / "cache" / "threads" / "tiny_cls.1.json").write_text("{broken")
    assert choose(model, auto, again) == 1
    assert again.calls == [(1, 8), (1, 8)]


def test_choose_when_timing_fails_loads_one_per_core_and_remembers_nothing(
        model: ModelVersion, auto: BackendOptions, tmp_path: Path) -> None:
    def broken(spec: LoadSpec, one: BackendOptions, many: BackendOptions
               ) -> tuple[float, float]:
        raise RuntimeError("out of memory for a second session")

    chosen = threads.choose_threads(model, OrtBackend(), load_spec(model), auto,
                                    measure=broken)
    assert chosen.intra_op_threads == 4
    assert not (tmp_path / "cache" / "threads").exists()
    assert threads.remembered_threads(tmp_path / "cache", model) is None


def test_measure_sessions_times_both_counts_on_real_sessions(
        model: ModelVersion, auto: BackendOptions) -> None:
    one, many = (dataclasses.replace(auto, intra_op_threads=n) for n in (1, 2))
    one_ms, many_ms = threads.measure_sessions(OrtBackend(), sample_inputs(model))(
        load_spec(model), one, many)
    assert one_ms > 0 and many_ms > 0


def test_cache_when_threads_are_left_to_edged_loads_the_session_with_the_choice(
        repo: ModelRepository, auto: BackendOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    timings = Timings(0.8, 1.2)
    monkeypatch.setattr(threads, "measure_sessions", lambda backend, inputs: timings)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=auto)
    try:
        with cache.acquire("tiny_cls") as lease:
            so = lease.session._so  # type: ignore[attr-defined]
            assert so.intra_op_num_threads == 1
        assert timings.calls == [(1, 4)]
    finally:
        cache.close()


def test_choose_when_the_input_size_is_dynamic_times_it_at_the_served_size(
        repo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """tiny_cnn takes any H x W; its frames are resized to 48 x 40 (model.yaml), so threads
    are timed on [1, 3, 40, 48] tensors, not the 32 x 32 a bare dynamic dim gets, and the log
    says so. (The corpus test times nudenet, dynamic with metadata imgsz 320, the same way.)"""
    write_yaml(repo_dir, "tiny_cnn", "preprocess: {resize: [48, 40]}\n")
    model = ModelRepository(repo_dir).resolve("tiny_cnn")
    seen: list[tuple[int, ...]] = []

    def time_loads(backend: object, loads: list, inputs: dict) -> list[float]:
        seen.extend(a.shape for a in inputs.values())
        return [2.0, 1.0]

    monkeypatch.setattr(threads, "time_loads", time_loads)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    opts = dataclasses.replace(options(tmp_path), intra_op_threads=0)
    with caplog.at_level("INFO", logger="edged.inference.threads"):
        chosen = threads.choose_threads(model, OrtBackend(), load_spec(model), opts)
    assert seen == [(1, 3, 40, 48)] and chosen.intra_op_threads == 2
    assert "at the served size: image [1, 3, 40, 48]" in caplog.text
