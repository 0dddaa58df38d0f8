"""A stream's live view: its latest processed frame and what was found in it, kept by
reference on the stream's thread (no copy, no drawing: an assignment per frame), and drawn and
encoded only when someone asks (`latest.jpg`, `live.mjpeg`, the status page), on the asker's
thread, once per frame and size however many ask.

The frame is the pipeline's own array and is never written to (the drawing is on a scaled
copy): sources hand each frame in an array of its own (OpenCV allocates one per read), so
holding the latest costs one frame of memory per stream and nothing else."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.processing.detections import Detections
from edged.processing.draw import Box, Overlay, annotate, encode_jpeg
from edged.streams.config import StreamConfig

FPS_WINDOW = 32  # frames the fps estimate covers
Visible = tuple[str | None, str, float, Sequence[float], str | None]  # id, label, score, box, sub


@dataclass(frozen=True)
class Seen:
    """One processed frame as it was recorded: its pixels, its results (post-processing's, as
    published) and, for a detect stream that tracks, the objects seen in it."""

    seq: int
    captured: float  # Unix s
    frame: np.ndarray
    results: dict[str, Any]
    objects: tuple[Visible, ...] | None  # None: not tracked (every detection is drawn)


@dataclass(frozen=True)
class Picture:
    seq: int
    captured: float
    jpeg: bytes


class LiveView:
    def __init__(self, cfg: StreamConfig, *, state: Callable[[], str], max_viewers: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`state`: the source's state now (drawn in the corner); `max_viewers`: live MJPEG
        viewers at once."""
        self.name = cfg.name
        self.state = state
        self.max_viewers = max_viewers
        self.clock = clock
        self.zones = [(z.name, z.polygon) for z in cfg.zones]
        self.lines = [(line.name, line.points) for line in cfg.lines]
        self.viewers = 0
        self.pictures = 0  # drawn and encoded since start (each shared by its askers)
        self._latest: Seen | None = None
        self._times: deque[float] = deque(maxlen=FPS_WINDOW)
        self._lock = threading.Lock()  # viewers, the frame times
        self._draw_lock = threading.Lock()  # one drawing at a time; the next asker reuses it
        # (raw, height) -> the last picture drawn of that kind, and when (clock)
        self._drawn: dict[tuple[bool, int | None], tuple[Picture, float]] = {}

    # -- on the stream's thread ------------------------------------------------------------
    def record(self, seq: int, captured: float, frame: np.ndarray, results: dict[str, Any],
               objects: tuple[Visible, ...] | None) -> None:
        """A processed frame: kept by reference, nothing drawn."""
        self._latest = Seen(seq, captured, frame, results, objects)
        now = self.clock()
        with self._lock:
            self._times.append(now)

    # -- for anyone ------------------------------------------------------------------------
    @property
    def latest(self) -> Seen | None:
        return self._latest

    def fps(self) -> float | None:
        """Processed frames a second over the last FPS_WINDOW; 0 once they stopped coming
        (three of their intervals, or 2 s, late); None before two frames."""
        with self._lock:
            times = list(self._times)
        if len(times) < 2:
            return None
        rate = (len(times) - 1) / max(times[-1] - times[0], 1e-6)
        if self.clock() - times[-1] > max(2.0, 3 / rate):
            return 0.0
        return rate

    def watch(self) -> Callable[[], None] | None:
        """One more live viewer: the call that ends its watch, or None when there are
        `max_viewers` already."""
        with self._lock:
            if self.viewers >= self.max_viewers:
                return None
            self.viewers += 1
        done = threading.Event()

        def release() -> None:
            if not done.is_set():
                done.set()
                with self._lock:
                    self.viewers -= 1

        return release

    def picture(self, *, raw: bool = False, height: int | None = None,
                max_age_s: float = 0.0) -> Picture | None:
        """The latest frame as JPEG, annotated unless `raw`, at most `height` pixels high;
        None before the first frame. Drawn at most once per frame and size, and no more often
        than `max_age_s` per size: a picture that young is answered even if a newer frame
        came, so viewers out of step with one another (or a burst of askers) cost no more
        drawings than one viewer."""
        seen = self._latest
        if seen is None:
            return None
        key = (raw, height)
        with self._draw_lock:
            held = self._drawn.get(key)
            if held is not None and (held[0].seq == seen.seq
                                     or self.clock() - held[1] < max_age_s):
                return held[0]
            started = self.clock()
            overlay = Overlay() if raw else Overlay(boxes=boxes_of(seen), zones=self.zones,
                                                    lines=self.lines, corner=self._corner(seen))
            picture = Picture(seen.seq, seen.captured,
                              encode_jpeg(annotate(seen.frame, overlay, height)))
            self._drawn[key] = (picture, started)
            self.pictures += 1
        return picture

    def _corner(self, seen: Seen) -> list[str]:
        fps = self.fps()
        lines = [f"{self.name}  {'-' if fps is None else f'{fps:.1f}'} fps  {self.state()}",
                 time.strftime("%H:%M:%S", time.localtime(seen.captured))
                 + f"  #{seen.seq}"]
        answer = answer_of(seen.results)
        if answer:
            lines.append(answer)
        return lines


def boxes_of(seen: Seen) -> list[Box]:
    """What to draw: the tracked objects seen in the frame (with their ids once announced),
    or every detection of a stream that does not track."""
    if seen.objects is not None:
        return [Box((float(b[0]), float(b[1]), float(b[2]), float(b[3])), label, score,
                    object_id, sub_label)
                for object_id, label, score, b, sub_label in seen.objects]
    found = seen.results.get("detections")
    if not isinstance(found, Detections):
        return []
    return [Box((box[0], box[1], box[2], box[3]), label, score, object_id, sub_label)
            for box, label, score, object_id, sub_label in zip(
                found.boxes.tolist(), found.labels, found.scores.tolist(), found.ids,
                found.sub_labels, strict=True)]


def answer_of(results: dict[str, Any]) -> str | None:
    """A classifier's answer in a few words (`red 1.00`); None for other results."""
    classes = results.get("classes")
    if not classes:
        return None
    return ", ".join(f"{c['label']} {c['score']:.2f}" for c in classes[:3])
