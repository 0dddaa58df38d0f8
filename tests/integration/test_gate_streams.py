"""The change gate in a real pipeline, gated against ungated on one clip, every frame counted:
a video OpenCV writes (a dark, noisy 320x192 ground, JPEG-coded; a lit square crosses it to
the right and another back to the left, in short moves between two-second holds, static 80%
of the time) played by a file source with the file's own clock and `backpressure: block`
through det_yolov8 (a real detector: the lit pixels' box), the scheduler, post-processing and
the events stage (tracking, a zone, a line). What subscribers learn is compared message for
message, with the frame each message came from."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from itertools import pairwise
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.backends import options

from edged.core.errors import InferenceFailed
from edged.events.config import LineConfig, ZoneConfig
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.service.metrics import Metrics
from edged.streams.config import GateConfig
from edged.streams.events_stage import EventsHub
from edged.streams.streamset import StreamSet
from tools.assets import models as test_models
from tools.bench.gate_clips import (
    Run,
    outcome,
    play,
    reaction_lags,
    same_objects,
    stream_config,
    timeline,
)

W, H, FPS = 320, 192, 10.0
SIDE, TOP = 40, 76
SPEED, HOLD = 20, 25  # 200 px/s; 2.5 s holds, more than twice the tracker's max_age_s
PASSES = ((-SIDE, 40, 140, 240, W), (W, 200, 60, -SIDE))
ZONE = ZoneConfig(name="right", polygon=[[160, 0], [320, 0], [320, 192], [160, 192]])
LINE = LineConfig(name="middle", points=[[160, 192], [160, 0]])  # upwards: rightwards is "in"


def write_clip(path: Path) -> list[int]:
    """The clip (module doc); returns the frames in which the square moved."""
    frames = timeline(PASSES, speed=SPEED, hold=HOLD, idle=10, width=W, tile=SIDE)
    first_pass = sum(max(1, round(abs(b - a) / SPEED)) for a, b in pairwise(PASSES[0]))
    rng = np.random.default_rng(0)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (W, H))
    assert writer.isOpened(), f"OpenCV cannot write {path}"
    moves = 0
    try:
        for x, moved in frames:
            moves += moved
            frame = np.full((H, W, 3), 40.0)
            if x is not None:
                left, right = max(0, x), min(W, x + SIDE)
                frame[TOP:TOP + SIDE, left:right] = \
                    (40, 230, 40) if moves <= first_pass else (230, 40, 40)
            frame += rng.normal(0.0, 3.0, frame.shape)
            writer.write(np.clip(frame, 0, 255).astype(np.uint8))
    finally:
        writer.release()
    return [i for i, (_x, moved) in enumerate(frames) if moved]


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scheduler]:
    root = tmp_path_factory.mktemp("gate")
    repo = test_models.write_repository(root / "models", names=["det_yolov8", "colors"])
    cache = ModelCache(ModelRepository(repo), budget_bytes=1 << 30, options=options(root))
    scheduler = Scheduler(cache)
    try:
        yield scheduler
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[int]]:
    path = tmp_path_factory.mktemp("clip") / "door.avi"
    return path, write_clip(path)


def run(scheduler: Scheduler, clip: Path, gate: bool, **keys: float) -> Run:
    cfg = stream_config("det_yolov8", clip, gate, zones=[ZONE], lines=[LINE])
    if keys:
        cfg = cfg.__class__(**{**cfg.__dict__, "gate": GateConfig(enabled=gate, **keys)})
    return play(scheduler, cfg, clip, timeout_s=60)


def test_gated_stream_when_the_scene_is_static_80_percent_publishes_the_same_objects(
        scheduler: Scheduler, clip: tuple[Path, list[int]]) -> None:
    path, moving = clip
    ungated, gated = run(scheduler, path, False), run(scheduler, path, True)
    frames = ungated.frames
    assert 1 - len(moving) / frames >= 0.8 and gated.frames == frames
    assert ungated.calls == frames and ungated.gated == 0
    assert gated.calls <= 0.3 * ungated.calls, (gated.calls, ungated.calls)
    assert gated.calls + gated.gated == frames and gated.dropped == 0  # gated are not drops
    seen, unseen = outcome(gated), outcome(ungated)
    assert same_objects(seen, unseen) == []
    assert [(o["label"], o["zones"]) for o in seen.objects] == [("bicycle", ["right"]),
                                                                ("car", ["right"])]
    assert len({o["id"] for o in seen.objects}) == 2 == seen.events["new"] == seen.events["end"]
    assert seen.lines == {"middle": {"bicycle": {"in": 1, "out": 0},
                                     "car": {"in": 0, "out": 1}}}
    lags = reaction_lags(seen, unseen)
    assert len(lags) > 4 and all(0 <= lag <= 1 / FPS + 1e-6 for lag in lags), lags


def test_gated_stream_when_holds_outlast_max_age_and_max_skip_keeps_objects_alive(
        scheduler: Scheduler, clip: tuple[Path, list[int]]) -> None:
    """No look at all during a 2.5 s hold (max_skip_s 60; the tracker's max_age_s is 1 s): the
    objects stay, and end when they have left, at the same frame as when every frame is
    inferred. Only the first frame and the frames that moved went to the model."""
    path, moving = clip
    gated = run(scheduler, path, True, max_skip_s=60.0)
    ungated = run(scheduler, path, False)
    assert gated.calls == 1 + len(moving)
    seen, unseen = outcome(gated), outcome(ungated)
    assert same_objects(seen, unseen) == []
    assert [(o["new"], o["end"]) for o in seen.objects] == \
        [(o["new"], o["end"]) for o in unseen.objects]


def test_gated_stream_when_frames_were_held_back_exports_them_apart_from_drops(
        scheduler: Scheduler, clip: tuple[Path, list[int]]) -> None:
    gated = run(scheduler, clip[0], True)
    row = gated.stats.as_dict()
    assert row["gated"] == gated.gated > 0 and row["dropped"] == 0
    assert row["processed"] == gated.calls
    text = Metrics(list, list, streams=lambda: {"door": gated.stats}, gpus=list,
                   jetson=lambda: None).render().decode()
    found = {(s.name, tuple(s.labels.items())): s.value
             for family in text_string_to_metric_families(text) for s in family.samples}
    assert found[("edged_stream_frames_gated_total", (("stream", "door"),))] == gated.gated
    assert found[("edged_stream_frames_processed_total", (("stream", "door"),))] == gated.calls


def test_stream_set_when_a_detect_stream_tracks_gates_it_unless_frames_were_asked_for(
        scheduler: Scheduler, clip: tuple[Path, list[int]]) -> None:
    path = clip[0]
    streams = StreamSet(scheduler, None, events=EventsHub(None, device=None))
    base = stream_config("det_yolov8", path, False)
    configs = [
        base.__class__(**{**base.__dict__, "name": "auto", "gate": GateConfig()}),
        base.__class__(**{**base.__dict__, "name": "frames", "gate": GateConfig(),
                          "publish": base.publish.__class__(frames=True)}),
        base.__class__(**{**base.__dict__, "name": "cls", "model": "colors",
                          "gate": GateConfig()}),
        base.__class__(**{**base.__dict__, "name": "cls_on", "model": "colors",
                          "gate": GateConfig(enabled=True)}),
    ]
    assert streams.start(configs) == 4
    try:
        gates = {p.cfg.name: p.gate is not None for p in streams.pipelines()}
    finally:
        streams.stop()
    assert gates == {"auto": True, "frames": False, "cls": False, "cls_on": True}


class FailingOnce:
    """The real scheduler, but the first frame submitted fails (a backend error)."""

    def __init__(self, real: Scheduler) -> None:
        self.real = real
        self.submitted = 0

    def submit(self, model: str, inputs: Mapping[str, np.ndarray], **kw: Any) -> Future[Any]:
        self.submitted += 1
        if self.submitted == 1:
            failed: Future[Any] = Future()
            failed.set_exception(InferenceFailed("the backend failed"))
            return failed
        return self.real.submit(model, inputs, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_gated_stream_when_a_frame_fails_in_the_model_looks_again_at_the_next(
        scheduler: Scheduler, clip: tuple[Path, list[int]]) -> None:
    """The model never saw the failed frame's picture: the gate must not hold the frames after
    it against that picture (the scene starts empty and still, so it would have, for 60 s)."""
    path, moving = clip
    flaky = FailingOnce(scheduler)
    cfg = stream_config("det_yolov8", path, True, zones=[ZONE], lines=[LINE])
    cfg = cfg.__class__(**{**cfg.__dict__, "gate": GateConfig(enabled=True, max_skip_s=60.0)})
    gated = play(flaky, cfg, path, timeout_s=60)  # type: ignore[arg-type]
    assert gated.stats.failed == 1
    assert flaky.submitted == 2 + len(moving)  # the failed look, a second one, every move
    assert gated.stats.processed == 1 + len(moving)
    assert outcome(gated).events["new"] == 2  # the objects came all the same
