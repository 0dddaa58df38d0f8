"""A stream's live view: its latest processed frame and what was found in it, kept by
reference on the stream's thread (no copy, no drawing: an assignment per frame), and drawn and
encoded only when someone asks (`latest.jpg`, `live.mjpeg`, the status page), on the asker's
thread, once per frame and size however many ask.

The frame is the pipeline's own array and is never written to (the drawing is on a scaled
copy): sources hand each frame in an array of its own (OpenCV allocates one per read), so
holding the latest costs one frame of memory per stream, plus the last pictures of a few sizes
(KEEP_SIZES, at most KEEP_BYTES of JPEG, the least recently asked for dropped first): a client
that asks for hundreds of heights keeps no more. Any height at or above the frame's is the
full size, one picture. Sizes are drawn side by side: a drawing holds up only the askers of
its own size, who then share it."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.processing.detections import Detections
from edged.processing.draw import Box, Overlay, annotate, encode_jpeg
from edged.streams.config import StreamConfig

FPS_WINDOW = 32  # frames the fps estimate covers
# Pictures kept per view: the sizes its viewers ask for (the page's, Home Assistant's, the
# zone helper's full one), each the last drawn of its size, within KEEP_BYTES (the latest one
# is kept even if larger alone: a 4K frame's).
KEEP_SIZES = 8
KEEP_BYTES = 4 * 1024 * 1024
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


Size = tuple[bool, int | None]  # (raw, height): None is the frame's own height


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
        # The pictures kept, least recently asked for first: size -> the last drawn of that
        # size, and when its drawing began (clock); their JPEG bytes; the sizes being drawn
        # now, each with the event its drawing sets when done. Held for lookups only, never
        # for a drawing.
        self._kept_lock = threading.Lock()
        self._kept: OrderedDict[Size, tuple[Picture, float]] = OrderedDict()
        self._kept_bytes = 0
        self._drawing: dict[Size, threading.Event] = {}

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
        drawings than one viewer. An asker waits only for a drawing of its own size."""
        seen = self._latest
        if seen is None:
            return None
        if height is not None and height >= seen.frame.shape[0]:
            height = None  # never enlarged: the full size, whatever larger height was asked
        size = (raw, height)
        while True:
            with self._kept_lock:
                held = self._kept.get(size)
                if held is not None and (held[0].seq >= seen.seq
                                         or self.clock() - held[1] < max_age_s):
                    self._kept.move_to_end(size)
                    return held[0]
                drawing = self._drawing.get(size)
                if drawing is None:
                    done = self._drawing[size] = threading.Event()
                    break
            drawing.wait()  # this size is being drawn: its picture is shared (checked above)
        try:
            started = self.clock()
            overlay = Overlay() if raw else Overlay(boxes=boxes_of(seen), zones=self.zones,
                                                    masks=masks_of(seen), poses=poses_of(seen),
                                                    lines=self.lines, corner=self._corner(seen))
            picture = Picture(seen.seq, seen.captured,
                              encode_jpeg(annotate(seen.frame, overlay, height)))
            with self._kept_lock:
                self._keep(size, picture, started)
                self.pictures += 1
        finally:
            with self._kept_lock:
                del self._drawing[size]
            done.set()
        return picture

    def kept(self) -> tuple[int, int]:
        """The sizes whose last picture is kept, and their JPEG bytes together."""
        with self._kept_lock:
            return len(self._kept), self._kept_bytes

    def _keep(self, size: Size, picture: Picture, started: float) -> None:
        """Keep `picture` as its size's last (under _kept_lock), dropping the least recently
        asked for sizes past KEEP_SIZES or KEEP_BYTES (never the one just kept)."""
        old = self._kept.pop(size, None)
        if old is not None:
            self._kept_bytes -= len(old[0].jpeg)
        self._kept[size] = (picture, started)
        self._kept_bytes += len(picture.jpeg)
        while len(self._kept) > 1 and (len(self._kept) > KEEP_SIZES
                                       or self._kept_bytes > KEEP_BYTES):
            _, (dropped, _) = self._kept.popitem(last=False)
            self._kept_bytes -= len(dropped.jpeg)

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


def masks_of(seen: Seen) -> list[tuple[str, list[list[float]]]]:
    """A segment model's masks in the frame, a semantic model's regions: (label, polygon)."""
    regions = seen.results.get("segments")
    if isinstance(regions, list):
        return [(s["label"], polygon) for s in regions for polygon in s["polygons"]]
    found = seen.results.get("detections")
    if not isinstance(found, Detections):
        return []
    return [(label, mask) for label, mask in zip(found.labels, found.masks, strict=True)
            if mask]


def poses_of(seen: Seen) -> list[tuple[str, dict[str, list[float]]]]:
    """A pose model's keypoints in the frame: (label, {name: [x, y, score]})."""
    found = seen.results.get("detections")
    if not isinstance(found, Detections):
        return []
    return [(label, points) for label, points in zip(found.labels, found.keypoints,
                                                     strict=True) if points]


def answer_of(results: dict[str, Any]) -> str | None:
    """A classifier's answer in a few words (`red 1.00`), a text recogniser's reading
    (`'A12345' 0.98`), a class map's biggest classes (`road 45%`); None for other results."""
    read = results.get("text")
    if isinstance(read, dict) and "text" in read:
        return f"{read['text']!r} {read['score']:.2f}"
    regions = results.get("segments")
    if isinstance(regions, list) and regions:
        return ", ".join(f"{s['label']} {s['area']:.0%}" for s in regions[:3])
    classes = results.get("classes")
    if not classes:
        return None
    return ", ".join(f"{c['label']} {c['score']:.2f}" for c in classes[:3])
