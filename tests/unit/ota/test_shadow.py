"""The shadow run of a candidate beside the serving version, with a real cache, scheduler and
ONNX Runtime sessions: sampled requests are compared in the model's own kind (top-1 for
classifiers, box matching for detectors), samples are skipped and counted while serving
queues are busy or the candidate has used its share, and a shadow without enough samples in
time asks to be rejected. The agreement measures and the rollout's parsing are here too."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.backends import GateBackend, hold_worker, options
from support.models import cls_input
from support.polling import wait_until

from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.ota.config import ShadowConfig
from edged.ota.manifest import Artifact, Manifest, Rejected, parse_manifest
from edged.ota.rollout import Rollout, bounds_for, judge, parse_rollout
from edged.ota.shadow import Shadow
from edged.processing.agreement import Agreement, compare, match_boxes
from tools.assets import models as test_models


@pytest.fixture
def two_versions(repo_dir: Path, tmp_path: Path) -> tuple[ModelCache, Scheduler]:
    """tiny_cls 1 serving (the active pointer) and 2 (another seed) loaded beside it; grid_det
    1 serving and 2, the same model again."""
    test_models.write_model(test_models.make_tiny_cls(1),
                                 repo_dir / "tiny_cls" / "2" / "model.onnx")
    test_models.write_repository(repo_dir, versions=2, names=["grid_det"])
    repo = ModelRepository(repo_dir)
    repo.set_active("tiny_cls", 1)
    repo.set_active("grid_det", 1)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    for name in ("tiny_cls", "grid_det"):
        cache.load(name, 2)
    scheduler = Scheduler(cache)
    yield cache, scheduler
    scheduler.close(5)
    cache.close()


class Decisions:
    def __init__(self) -> None:
        self.made: list[tuple[bool, str]] = []
        self.event = threading.Event()

    def __call__(self, shadow: Shadow, promote: bool, detail: str) -> None:
        self.made.append((promote, detail))
        self.event.set()


def start(cache: ModelCache, scheduler: Scheduler, name: str, decide: Decisions,
          cfg: ShadowConfig | None = None, **rollout: Any) -> Shadow:
    manifest = Manifest(name, 2, "onnx", Artifact(1, "0" * 64, url="file:///x"),
                        rollout=Rollout("shadow", **{"sample": 1.0, **rollout}))
    shadow = Shadow(manifest, 1, cache.describe(name, 2), cache, cfg or ShadowConfig(),
                    busy=scheduler.busy, decide=decide, seed=0)
    scheduler.taps[name] = shadow.offer
    shadow.start()
    return shadow


def test_shadow_when_the_candidate_differs_measures_top1_and_asks_to_reject(
        two_versions: tuple[ModelCache, Scheduler]) -> None:
    cache, scheduler = two_versions
    decide = Decisions()
    shadow = start(cache, scheduler, "tiny_cls", decide, cfg=ShadowConfig(max_share=1.0),
                   min_samples=12)
    for i in range(40):
        if shadow.state != "running":
            break
        x = np.random.default_rng(i).normal(0, 3, (1, 3, 8, 8)).astype(np.float32)
        scheduler.infer("tiny_cls", {"x": x})  # one at a time: never busy
        wait_until(lambda: shadow.state != "running" or shadow.runs >= shadow.sampled,
                   timeout=10, what="the shadow to catch up",
                   details=lambda: repr(shadow.progress()))
    assert decide.event.wait(10)
    promote, detail = decide.made[0]
    assert not promote and "min_top1_agreement" in detail
    metrics = shadow.metrics()
    assert metrics["samples"] == 12 and metrics["failure_rate"] == 0.0
    assert metrics["top1_agreement"] is not None and metrics["top1_agreement"] < 0.98
    assert metrics["candidate_p99_ms"] is not None
    shadow.stop("rejected")
    assert shadow.progress()["state"] == "rejected"


def test_shadow_when_serving_queues_are_busy_skips_and_counts_samples(
        gate: GateBackend, two_versions: tuple[ModelCache, Scheduler]) -> None:
    cache, scheduler = two_versions
    decide = Decisions()
    first = hold_worker(scheduler, gate, "tiny_cls", {"x": cls_input(0.1)})  # the worker held
    shadow = start(cache, scheduler, "tiny_cls", decide, cfg=ShadowConfig(max_share=1.0),
                   min_samples=1000)
    futures = [scheduler.submit("tiny_cls", {"x": cls_input(0.2 + i / 10)}) for i in range(5)]
    # The first found the queue empty; the other four found serving work waiting.
    assert shadow.sampled == 5 and shadow.skipped["busy"] == 4
    gate.gate.set()
    outputs = [f.result(10) for f in [first, *futures]]
    assert all(o["prob"].shape == (1, 4) for o in outputs)  # serving went on as ever
    wait_until(lambda: shadow.runs + shadow.skipped["busy"] >= 5, timeout=10,
               what="the accepted sample to run or be skipped")
    assert shadow.runs + shadow.skipped["busy"] == 5 and shadow.failures == 0
    shadow.stop("cancelled")


def test_shadow_when_the_candidate_has_used_its_share_skips_samples(
        two_versions: tuple[ModelCache, Scheduler]) -> None:
    cache, scheduler = two_versions
    decide = Decisions()
    shadow = start(cache, scheduler, "tiny_cls", decide, cfg=ShadowConfig(max_share=1e-9),
                   min_samples=1000)
    scheduler.infer("tiny_cls", {"x": cls_input(0.1)})
    wait_until(lambda: shadow.runs == 1, timeout=10, what="the first sample to run")
    for i in range(5):
        scheduler.infer("tiny_cls", {"x": cls_input(0.2 + i / 10)})
    assert shadow.skipped["share"] == 5 and shadow.runs == 1
    shadow.stop("cancelled")


def test_shadow_when_min_samples_do_not_come_in_time_asks_to_reject(
        two_versions: tuple[ModelCache, Scheduler]) -> None:
    cache, scheduler = two_versions
    decide = Decisions()
    shadow = start(cache, scheduler, "tiny_cls", decide, min_samples=50, max_duration_s=0.3)
    assert decide.event.wait(10)
    assert decide.made == [(False, "only 0 of 50 samples in 0.3 s")]
    assert shadow.reason == "shadow_timeout" and shadow.state == "rejecting"


def test_shadow_when_a_detector_agrees_matches_its_boxes(
        two_versions: tuple[ModelCache, Scheduler]) -> None:
    cache, scheduler = two_versions
    decide = Decisions()
    shadow = start(cache, scheduler, "grid_det", decide, cfg=ShadowConfig(max_share=1.0),
                   min_samples=4)
    assert shadow.kind == "detect" and set(shadow.bounds) == {
        "min_box_f1", "min_label_agreement", "max_failure_rate"}
    for cell in range(4):
        image = np.zeros((1, 3, 64, 64), np.float32)
        image[0, cell % 3, 16 * cell:16 * cell + 16, 0:16] = 1.0  # a square of one colour
        scheduler.infer("grid_det", {"image": image})
        wait_until(lambda done=cell: shadow.runs > done, timeout=10, what="the sample to run")
    assert decide.event.wait(10)
    assert decide.made[0][0] is True
    metrics = shadow.metrics()
    assert metrics["box_f1"] == 1.0 and metrics["label_agreement"] == 1.0


def test_agreement_when_boxes_move_or_change_class_counts_f1_and_labels() -> None:
    ref = (np.array([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]], float),
           np.array([0, 1, 2]))
    other = (np.array([[1, 0, 11, 10], [20, 20, 30, 30], [80, 80, 90, 90]], float),
             np.array([0, 2, 2]))
    assert match_boxes(*ref, *other) == (2, 1)  # the third box moved away entirely
    agreement = Agreement()
    agreement.add({"y": np.ones(3)}, {"y": np.ones(3)})
    agreement.add_boxes(ref, other)
    metrics = agreement.metrics()
    assert metrics["box_f1"] == pytest.approx(2 * 2 / 6)
    assert metrics["label_agreement"] == pytest.approx(0.5)


def test_compare_when_given_lists_equals_the_stacked_statistics() -> None:
    rng = np.random.default_rng(3)
    a = [{"p": rng.random((4,)), "q": rng.random((2, 2))} for _ in range(6)]
    b = [{k: v + rng.normal(0, 0.01, v.shape) for k, v in o.items()} for o in a]
    got = compare(a, b, classify="p", labels=[0, 1, 2, 3, 0, 1])
    flat_a = np.stack([np.concatenate([o["p"], o["q"].ravel()]) for o in a])
    flat_b = np.stack([np.concatenate([o["p"], o["q"].ravel()]) for o in b])
    cos = np.einsum("ij,ij->i", flat_a, flat_b) / (np.linalg.norm(flat_a, axis=1)
                                                  * np.linalg.norm(flat_b, axis=1))
    assert got["max_abs_error"] == pytest.approx(np.abs(flat_a - flat_b).max())
    assert got["mean_abs_error"] == pytest.approx(np.abs(flat_a - flat_b).mean())
    assert got["relative_error"] == pytest.approx(np.linalg.norm(flat_a - flat_b)
                                                  / np.linalg.norm(flat_a))
    assert got["cosine"] == pytest.approx(cos.mean())
    assert got["cosine_min"] == pytest.approx(cos.min())
    top = np.mean([np.argmax(x["p"]) == np.argmax(y["p"]) for x, y in zip(a, b, strict=True)])
    assert got["top1_agreement"] == pytest.approx(top)


def test_rollout_when_well_formed_parses_and_judges_its_bounds() -> None:
    rollout = parse_rollout({"mode": "shadow", "sample": 0.1, "min_samples": 500,
                             "max_duration_s": 3600,
                             "promote_if": {"min_top1_agreement": 0.97, "max_p99_ms": 20}})
    assert rollout.shadow and rollout.min_samples == 500
    bounds = bounds_for(rollout, "classify")
    assert bounds == {"min_top1_agreement": 0.97, "max_p99_ms": 20.0, "max_failure_rate": 0.0}
    checks, failed = judge({"top1_agreement": 0.96, "candidate_p99_ms": 3.0,
                            "failure_rate": 0.0}, bounds)
    assert [c.passed for c in checks] == [True, True, False]
    assert failed == ["min_top1_agreement: 0.96 < 0.97"]
    assert bounds_for(Rollout("shadow"), "raw") == {"min_cosine": 0.99, "max_failure_rate": 0.0}
    with pytest.raises(Rejected, match=r"bad_rollout.*detect model"):
        bounds_for(parse_rollout({"mode": "shadow", "promote_if": {"min_box_f1": 0.9}}),
                   "classify")


@pytest.mark.parametrize(("rollout", "says"), [
    ("shadow", "rollout must be an object"),
    ({"mode": "canary"}, "rollout.mode must be direct or shadow"),
    ({"mode": "shadow", "sample": 0}, r"rollout.sample must be in \(0, 1\]"),
    ({"mode": "shadow", "sample": True}, "rollout.sample must be a number"),
    ({"mode": "shadow", "min_samples": 0}, "min_samples must be an integer"),
    ({"mode": "shadow", "max_duration_s": -1}, "max_duration_s must be in"),
    ({"mode": "shadow", "promote_if": {"min_vibes": 1}}, "unknown rollout.promote_if bounds"),
    ({"mode": "shadow", "promote_if": {"min_cosine": "high"}}, "min_cosine must be a number"),
    ({"mode": "shadow", "when": "now"}, "unknown rollout fields: when"),
])
def test_manifest_when_the_rollout_is_malformed_is_refused_naming_it(rollout: Any,
                                                                     says: str) -> None:
    doc = {"model": "m", "version": 2, "artifact": {"url": "file:///a", "size": 1,
                                                    "sha256": "0" * 64}, "rollout": rollout}
    import json

    with pytest.raises(Rejected, match=f"bad_manifest: .*{says}"):
        parse_manifest(json.dumps(doc).encode())
