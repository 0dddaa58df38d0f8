"""Change gating: a camera stream's frame goes to the model only when its picture changed since
the frame the model last saw, and in any case at least every `max_skip_s`. A frame the gate
keeps from the model costs a small grey thumbnail and one difference; the pipeline hands the
last answer on for it (`StreamPipeline._hold`), so tracked objects stay alive and in place.

The measure is in the spirit of Frigate's motion check, and cheaper: the frame sampled by
nearest neighbour at twice the thumbnail's size, made grey, averaged 2x2 (INTER_AREA at an
exact factor of 2; at a camera's arbitrary ratio INTER_AREA costs 1-10 ms a frame) to
`height` rows and blurred 3x3 (Frigate blurs its thumbnail too): about 0.1-0.3 ms a frame
whatever the camera's size, and sensor noise of sigma 10 grey levels after JPEG does not pass.
The thumbnail is compared with that of the last frame sent to the model, not with a running
average of the background: the question is not "is something moving" but "would the model see
anything other than what it saw". A slow change therefore adds up until it passes, and a
parked car is not "motion" for ever. Pixels that differ by more than `pixel_threshold` grey
levels count as changed; the frame goes to the model when more than `threshold` of the
thumbnail's pixels changed. Its resolution is a sample, half a thumbnail pixel (2.4 frame
pixels at 480 rows, 5.4 at 1080): an object that moved less than about that since the model
looked can be held back until its motion adds up.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable

import cv2
import numpy as np

from edged.streams.config import GateConfig

logger = logging.getLogger(__name__)


def wanted(cfg: GateConfig, *, tracking: bool, frames: bool, pictures: bool) -> bool:
    """Whether a stream gates its frames: `auto` for a stream that tracks objects and
    publishes no per-frame results (every frame's answer was not asked for); `true` for any
    stream with pictures; never for sensors (`check_stream_gate` refuses `true` there)."""
    if not pictures or cfg.enabled is False:
        return False
    if cfg.enabled == "auto":
        return tracking and not frames
    return bool(cfg.enabled)


def thumbnail(frame: np.ndarray, height: int) -> np.ndarray:
    """A grey, slightly blurred copy of the frame at most `height` rows high (the frame's
    aspect kept). The gate's only copies of a frame are this (13 kB at 133x100) and the
    colour sample at twice its size (160 kB), whatever the camera's resolution."""
    h, w = frame.shape[:2]
    rows = min(height, h)
    cols = max(1, round(w * rows / h))
    twice = 2 * rows <= h and 2 * cols <= w
    small = cv2.resize(frame, (2 * cols, 2 * rows) if twice else (cols, rows),
                       interpolation=cv2.INTER_NEAREST)
    if small.dtype != np.uint8:
        small = cv2.convertScaleAbs(small)
    if small.ndim == 3:
        channels = small.shape[2]
        small = cv2.cvtColor(small, cv2.COLOR_BGR2GRAY) if channels == 3 else \
            cv2.cvtColor(small, cv2.COLOR_BGRA2GRAY) if channels == 4 else \
            np.ascontiguousarray(small[..., 0])
    if twice:
        small = cv2.resize(small, (cols, rows), interpolation=cv2.INTER_AREA)
    return cv2.GaussianBlur(small, (3, 3), 0)


class ChangeGate:
    """One stream's gate. `admit` for each frame, in capture order, on the stream's thread;
    `reset` when a frame sent to the model failed (the next one goes)."""

    def __init__(self, cfg: GateConfig) -> None:
        self.cfg = cfg
        self._reference: np.ndarray | None = None  # the last admitted frame's thumbnail
        self._since = 0.0  # its capture time (monotonic s)
        self._key: Hashable = None  # what answered it (model name and version), frame size
        self.last_change = 0.0  # the share of pixels that changed in the last frame measured
        self.moved = False  # the last frame was measured and had changed (motion, for records)

    def admit(self, frame: np.ndarray, now: float, key: Hashable = None) -> bool:
        """True: this frame goes to the model (and becomes the reference). `now`: its capture
        time (monotonic s); `key`: what would answer it, a new one always gets a fresh look."""
        thumb = thumbnail(frame, self.cfg.height)
        reference = self._reference
        key = (key, frame.shape)  # a camera back at another size: boxes are in new pixels
        due = (reference is None or key != self._key
               or not 0 <= now - self._since < self.cfg.max_skip_s)
        self.moved = False
        if not due:
            assert reference is not None
            changed = cv2.threshold(cv2.absdiff(thumb, reference), self.cfg.pixel_threshold,
                                    255, cv2.THRESH_BINARY)[1]
            count = cv2.countNonZero(changed)
            self.last_change = count / thumb.size
            due = self.moved = count > self.cfg.threshold * thumb.size
        if due:
            self._reference, self._since, self._key = thumb, now, key
        return due

    def reset(self) -> None:
        """Forget the reference: the next frame goes to the model."""
        self._reference = None
