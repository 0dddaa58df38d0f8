"""Tracking: one stream's detections become objects whose ids last across frames.

ByteTrack's association on boxes. Each track predicts where its box is now from a constant
velocity (its last box moved on by its smoothed speed, so two objects crossing each other stay
apart in the prediction); detections scoring at least `high_score` are matched first against
every track by IoU with the prediction, weaker ones then only against tracks still unmatched
(with a stricter IoU), so a person half-hidden behind a pillar keeps their id without weak
detections starting tracks of their own. Only detections of the same label match. A new track
is tentative until it was matched `min_hits` frames in a row (a tentative track that misses a
frame is dropped: flickering false detections never become objects); a confirmed one survives
gaps of up to `max_age_s`. At most `max_tracks` live at once.

The matcher is `assign.cluster_assign`: optimal, in plain Python
(`docs/decisions/013-events-engine.md` compares it with greedy matching, scipy's and lap's on
time and on crossing objects). Time is
the caller's stream clock in seconds (monotonic), so tracking is deterministic given it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from edged.events.assign import cluster_assign
from edged.events.config import TrackConfig
from edged.processing.boxes import iou_matrix

logger = logging.getLogger(__name__)

# similarity [tracks, detections], least similarity → (track row, detection column) pairs
Assign = Callable[[np.ndarray, float], list[tuple[int, int]]]
LOW_SCORE_IOU = 0.5  # ByteTrack's second round: weak detections need a closer match
VELOCITY_SMOOTHING = 0.5  # share of the newest measured speed in the smoothed one
# A track seen once has no speed to predict with: its second match compares boxes grown by
# this share of their size on every side (buffered IoU, C-BIoU), so an object that moved up to
# about its own width between frames (a walker at 5 fps) is still found.
FIRST_STEP_BUFFER = 0.5
DROP_LOG_INTERVAL_S = 60.0  # stream seconds between two "objects dropped" warnings


@dataclass(eq=False, slots=True)
class Track:
    key: int  # the tracker's own number; the object's public id is the lifecycle's
    label: str
    box: np.ndarray  # the last matched detection's box, frame pixels
    score: float
    born: float  # stream clock
    last_seen: float
    velocity: np.ndarray = field(default_factory=lambda: np.zeros(4))  # px/s per coordinate
    hits: int = 1  # frames matched in a row while tentative; all frames matched after
    confirmed: bool = False
    detection: int | None = None  # this frame's detection (index into update's input)



@dataclass(frozen=True)
class TrackStep:
    """What one frame did: `seen` the tracks matched or started (their `detection` set),
    `confirmed` those that reached min_hits now, `ended` the confirmed tracks that are gone
    (unseen past max_age_s, or dropped to make room)."""

    seen: list[Track]
    confirmed: list[Track]
    ended: list[Track]


class Tracker:
    def __init__(self, cfg: TrackConfig, *, assign: Assign = cluster_assign,
                 stream: str = "") -> None:
        self.cfg = cfg
        self.assign = assign
        self.stream = stream
        self.tracks: list[Track] = []
        self._next_key = 1
        self._label_codes: dict[str, int] = {}  # labels as ints for the same-label mask
        self._dropped = 0  # objects dropped for max_tracks since the last warning
        self._dropped_logged_at: float | None = None

    def update(self, t: float, boxes: np.ndarray, scores: np.ndarray,
               labels: Sequence[str]) -> TrackStep:
        """One frame at stream time `t`: [N, 4] boxes, [N] scores, N labels."""
        ended = [tr for tr in self.tracks
                 if tr.confirmed and t - tr.last_seen > self.cfg.max_age_s]
        live = [tr for tr in self.tracks if tr not in ended] if ended else self.tracks
        for tr in live:
            tr.detection = None
        matched = self._match(t, live, boxes, scores, labels)
        seen: list[Track] = []
        confirmed: list[Track] = []
        if matched:
            _follow(t, matched, boxes, scores.tolist())
        for tr, _d in matched:
            seen.append(tr)
            if not tr.confirmed and tr.hits >= self.cfg.min_hits:
                tr.confirmed = True
                confirmed.append(tr)
        # A tentative track that missed this frame was probably a false detection.
        self.tracks = [tr for tr in live if tr.confirmed or tr.detection is not None]
        taken = {d for _tr, d in matched}
        for d in np.argsort(-scores, kind="stable").tolist():
            if d in taken or scores[d] < self.cfg.high_score:
                continue
            track = self._start(t, boxes[d], float(scores[d]), labels[d], d, ended)
            if track is not None:
                seen.append(track)
                if track.confirmed:
                    confirmed.append(track)
        self._log_drops(t)
        return TrackStep(seen, confirmed, ended)

    def reset(self) -> list[Track]:
        """Forget every track; returns the confirmed ones (they end)."""
        gone = [tr for tr in self.tracks if tr.confirmed]
        self.tracks = []
        return gone

    def _match(self, t: float, live: list[Track], boxes: np.ndarray, scores: np.ndarray,
               labels: Sequence[str]) -> list[tuple[Track, int]]:
        if not live or len(boxes) == 0:
            return []
        last_seen = np.array([tr.last_seen for tr in live])
        predicted = (np.array([tr.box for tr in live])
                     + np.array([tr.velocity for tr in live]) * (t - last_seen)[:, None])
        similarity = iou_matrix(predicted, boxes)
        fresh = np.array([tr.hits == 1 for tr in live])
        if fresh.any():  # no speed known yet: compare grown boxes, so a fast one is found
            similarity[fresh] = iou_matrix(_grown(predicted[fresh]), _grown(boxes))
        track_codes = np.array([self._code(tr.label) for tr in live])
        det_codes = np.array([self._code(label) for label in labels])
        similarity[track_codes[:, None] != det_codes[None, :]] = 0.0
        high = np.flatnonzero(scores >= self.cfg.high_score)
        low = np.flatnonzero(scores < self.cfg.high_score)
        pairs = [(live[r], int(high[c]))
                 for r, c in self.assign(similarity[:, high], self.cfg.iou_threshold)]
        if low.size:
            taken = {id(tr) for tr, _d in pairs}
            rest = np.array([i for i, tr in enumerate(live) if id(tr) not in taken], np.intp)
            least = max(self.cfg.iou_threshold, LOW_SCORE_IOU)
            pairs += [(live[int(rest[r])], int(low[c]))
                      for r, c in self.assign(similarity[np.ix_(rest, low)], least)]
        return pairs

    def _start(self, t: float, box: np.ndarray, score: float, label: str, d: int,
               ended: list[Track]) -> Track | None:
        if len(self.tracks) >= self.cfg.max_tracks:
            victim = self._weakest()
            self._dropped += 1
            if victim is None:  # every track is in view: the newcomer waits
                return None
            self.tracks.remove(victim)
            if victim.confirmed:
                ended.append(victim)
        track = Track(self._next_key, label, box, score, born=t, last_seen=t, detection=d,
                      confirmed=self.cfg.min_hits <= 1)
        self._next_key += 1
        self.tracks.append(track)
        return track

    def _weakest(self) -> Track | None:
        """Among tracks not in view this frame: tentative before confirmed, then the one
        unseen longest, then the lowest score."""
        unseen = [tr for tr in self.tracks if tr.detection is None]
        if not unseen:
            return None
        return min(unseen, key=lambda tr: (tr.confirmed, tr.last_seen, tr.score))

    def _code(self, label: str) -> int:
        code = self._label_codes.get(label)
        if code is None:  # bounded by the model's label count
            code = self._label_codes[label] = len(self._label_codes)
        return code

    def _log_drops(self, t: float) -> None:
        if not self._dropped:
            return
        last = self._dropped_logged_at
        if last is None or t - last >= DROP_LOG_INTERVAL_S:
            logger.warning("stream %s: %d objects dropped to stay within track.max_tracks=%d "
                           "(raise it, or narrow labels/min_score)", self.stream,
                           self._dropped, self.cfg.max_tracks)
            self._dropped = 0
            self._dropped_logged_at = t


def _grown(boxes: np.ndarray) -> np.ndarray:
    """Boxes grown by FIRST_STEP_BUFFER of their width and height on every side."""
    size = np.concatenate([boxes[:, 2:] - boxes[:, :2]] * 2, axis=1) * FIRST_STEP_BUFFER
    return boxes + size * np.array([-1, -1, 1, 1])


def _follow(t: float, matched: list[tuple[Track, int]], boxes: np.ndarray,
            scores: list[float]) -> None:
    """Move each matched track onto its detection and smooth its speed; all at once (numpy
    on [K, 4] costs what it costs on one box)."""
    tracks = [tr for tr, _d in matched]
    new = boxes[[d for _tr, d in matched]]
    velocity = np.array([tr.velocity for tr in tracks])
    dt = t - np.array([tr.last_seen for tr in tracks])
    with np.errstate(divide="ignore", invalid="ignore"):
        measured = (new - np.array([tr.box for tr in tracks])) / dt[:, None]
    first = np.array([tr.hits == 1 for tr in tracks])[:, None]  # no speed to smooth yet
    smoothed = np.where(first, measured, VELOCITY_SMOOTHING * measured
                        + (1 - VELOCITY_SMOOTHING) * velocity)
    velocity = np.where((dt > 0)[:, None], smoothed, velocity)
    for i, (tr, d) in enumerate(matched):
        tr.box, tr.velocity = new[i], velocity[i]
        tr.score, tr.last_seen, tr.detection = scores[d], t, d
        tr.hits += 1
