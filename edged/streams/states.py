"""State classification (Frigate 0.17's): a region of a stream's frame (a gate, a door, a
parking spot) is cropped and read by a classifier every `interval_s` seconds of capture time,
or sooner when its picture changed (the change gate's measure, on the region only); a read
becomes the state only when `debounce` reads in a row agree (and score at least
`min_score`): a read that differs from the state is looked at again on the next frames until
it is confirmed or not. Only a change of state is published: retained on
`streams/<stream>/states/<name>`, on `state_changes` (what changed, from what), and in the
stream's results while it publishes them. The classifier runs on the stream's own thread
through the scheduler (at the stream's priority), as a cascade does: a slow classifier slows
only its stream, and a read that fails is counted and skipped (the state stays)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.core.errors import ConfigError, ConfigIssue, EdgedError, InvalidModel
from edged.events.publish import compact
from edged.inference.scheduler import Scheduler
from edged.model.config import PostprocessConfig
from edged.model.repository import ModelVersion
from edged.mqtt import topics
from edged.processing.post import Postprocessor
from edged.processing.pre import mismatch
from edged.sources import worth_logging
from edged.streams.asking import ask_image
from edged.streams.config import GateConfig
from edged.streams.gate import ChangeGate
from edged.streams.state_config import StateConfig

logger = logging.getLogger(__name__)

Send = Callable[[str, bytes, bool], None]  # (suffix, payload, retain)


def check_classifier(key: str, model: ModelVersion) -> None:
    """A state's model must be a classifier taking one image of a fixed size (ConfigError
    naming `key`)."""
    kind = (model.config.postprocess or PostprocessConfig()).kind
    problem = None
    if kind != "classify":
        problem = f"{model.label} is not a classify model (postprocess.kind: {kind})"
    elif len(model.inputs) != 1 or model.config.preprocess is None:
        problem = f"{model.label} takes no image (one input and its preprocess: are needed)"
    else:
        why = mismatch(model.config.preprocess, model.inputs[0], model.max_batch_size > 0)
        if why is not None:
            problem = f"{model.label}: {why}"
    if problem is not None:
        raise ConfigError([ConfigIssue(key, problem)])


def pixel_box(cfg: StateConfig, width: int, height: int, key: str) -> tuple[int, int, int, int]:
    """The region's bounding box in this frame's pixels (x1, y1, x2, y2; x2, y2 exclusive).
    ConfigError naming `key` when it is not inside the frame."""
    points = np.asarray(cfg.region, np.float64)
    if cfg.units == "fractions":
        points = points * [width, height]
    x1, y1 = points.min(axis=0)
    x2, y2 = points.max(axis=0)
    if x2 > width or y2 > height:
        raise ConfigError([ConfigIssue(f"{key}.region", f"the region {cfg.region} is outside "
                                                        f"the {width}x{height} frame")])
    left, top = math.floor(float(x1)), math.floor(float(y1))
    return left, top, max(math.ceil(float(x2)), left + 1), max(math.ceil(float(y2)), top + 1)


@dataclass
class Debounce:
    """K reads in a row must agree before the state changes."""

    needed: int
    state: str | None = None
    candidate: str | None = None
    run: int = 0

    def read(self, label: str) -> bool:
        """One read; True when the state changed."""
        if label == self.state:
            self.candidate, self.run = None, 0
            return False
        if label == self.candidate:
            self.run += 1
        else:
            self.candidate, self.run = label, 1
        if self.run >= self.needed:
            self.state, self.candidate, self.run = label, None, 0
            return True
        return False


class StateWatcher:
    """One state of one stream: `frame` for each frame (on the stream's thread)."""

    def __init__(self, stream: str, cfg: StateConfig, key: str, scheduler: Scheduler,
                 send: Send | None, *, priority: int | None = None,
                 timeout_s: float = 10.0, wall: Callable[[], float] = time.time) -> None:
        self.stream = stream
        self.cfg = cfg
        self.key = key  # its key path in the config, e.g. streams[0].states[1]
        self.scheduler = scheduler
        self.send = send
        self.priority = priority
        self.timeout_s = timeout_s
        self.wall = wall
        self.gate = ChangeGate(GateConfig(threshold=cfg.change_threshold if cfg.on_change
                                          else 1.0, max_skip_s=cfg.interval_s))
        self.debounce = Debounce(cfg.debounce)
        self.score: float | None = None
        self.since: float | None = None
        self.reads = 0
        self.failed = 0
        self.disabled: str | None = None  # why it stopped (its region outside the frame)
        self._post: tuple[ModelVersion, Postprocessor] | None = None
        check_classifier(f"{key}.model", scheduler.model(cfg.model))

    @property
    def state(self) -> str | None:
        return self.debounce.state

    def frame(self, data: np.ndarray, captured: float, captured_mono: float) -> bool:
        """Read the region when due; True when the state changed (then published)."""
        if self.disabled is not None:
            return False
        height, width = data.shape[:2]
        try:
            x1, y1, x2, y2 = pixel_box(self.cfg, width, height, self.key)
        except ConfigError as exc:
            self.disabled = str(exc)
            logger.error("stream %s: state %s is off: %s", self.stream, self.cfg.name, exc,
                         extra={"stream": self.stream, "code": exc.code})
            return False
        region = data[y1:y2, x1:x2]
        # a read waiting for its confirmation looks again at the next frame, whatever the gate
        if not self.gate.admit(region, captured_mono, (width, height)) \
                and self.debounce.candidate is None:
            return False
        try:
            label, score = self._classify(region)
        except EdgedError as exc:
            self.gate.reset()
            self.failed += 1
            if worth_logging(self.failed):
                logger.warning("stream %s: state %s: the read failed (#%d): %s", self.stream,
                               self.cfg.name, self.failed, exc,
                               extra={"stream": self.stream, "code": exc.code})
            return False
        self.reads += 1
        if score < self.cfg.min_score:
            # a doubtful read confirms nothing: a candidate waiting for it is given up, so the
            # gate decides the next read again (it would be read every frame, for ever)
            self.debounce.candidate, self.debounce.run = None, 0
            return False
        previous = self.debounce.state
        if not self.debounce.read(label):
            if label == previous:
                self.score = score
            return False
        self.score, self.since = score, captured
        self._publish(previous)
        return True

    def view(self) -> dict[str, Any]:
        return {"state": self.state, "score": self.score, "since": self.since}

    def _publish(self, previous: str | None) -> None:
        if self.send is None:
            return
        body = {"stream": self.stream, "name": self.cfg.name, "state": self.state,
                "previous": previous, "score": self.score, "time": self.since}
        self.send(topics.state(self.stream, self.cfg.name), compact(body), True)
        self.send(topics.STATE_CHANGES, compact({"type": "state", **body}), False)

    def _classify(self, region: np.ndarray) -> tuple[str, float]:
        model, outputs, _ = ask_image(self.scheduler, self.cfg.model, region,
                                      priority=self.priority, timeout_s=self.timeout_s,
                                      what=f"state model {self.cfg.model}")
        if self._post is None or self._post[0] is not model:
            self._post = (model, Postprocessor(model.config.postprocess, model.dir.parent))
        results = self._post[1](outputs, None)
        classes = results.get("classes")
        if not classes:
            raise InvalidModel(f"state model {self.cfg.model} gave no classes")
        best = classes[0]
        return str(best["label"]), round(float(best["score"]), 5)


class States:
    """A stream's watchers."""

    def __init__(self, watchers: list[StateWatcher]) -> None:
        self.watchers = watchers

    def frame(self, data: np.ndarray, captured: float, captured_mono: float) -> None:
        for watcher in self.watchers:
            try:
                watcher.frame(data, captured, captured_mono)
            except Exception:  # a bug here must not stop the stream's results
                watcher.failed += 1
                if worth_logging(watcher.failed):
                    logger.exception("stream %s: state %s failed (#%d)", watcher.stream,
                                     watcher.cfg.name, watcher.failed,
                                     extra={"stream": watcher.stream, "code": "state_failed"})

    def view(self) -> dict[str, dict[str, Any]]:
        """The states now (for the stream's results and status)."""
        return {w.cfg.name: w.view() for w in self.watchers if w.state is not None}
