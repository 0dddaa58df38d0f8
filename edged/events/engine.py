"""One stream's events, frame by frame: `StreamEvents.update(frame_time, detections, frame)`
tracks the detections, places the objects in zones, counts line crossings, keeps snapshots and
returns what changed as `Changes`, ready to publish. Nothing here does I/O.

Time: `frame_time` is the frame's capture time (Unix s) and goes into the payloads as it is;
ages and throttles run on a stream clock that advances by the frames' steps and never goes
back, so a wall clock set back (NTP on a device that booted in 1970) cannot keep objects
alive. A stream whose source stalls should still call `update(now, Detections.empty())` now
and then, or its objects never end. `flush()` ends every object (a stream stopped on reload or
shutdown).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.events.assign import cluster_assign
from edged.events.config import EventsSettings
from edged.events.lifecycle import (
    Event,
    TrackedObject,
    announce,
    face_update,
    finish,
    object_id,
    update_if_due,
)
from edged.events.plates import LprConfig, Plates
from edged.events.snapshot import Snapshots
from edged.events.track import Assign, Track, Tracker
from edged.events.zones import Crossing, LineCounts, Lines, Zones
from edged.processing.detections import Detections

logger = logging.getLogger(__name__)

LineTotals = dict[str, dict[str, int]]  # label -> {"in": n, "out": n}


@dataclass(frozen=True)
class Changes:
    """What one frame changed. `events`: event dicts in order; `counts`: label → objects
    tracked now; `zone_counts`: zone → label → objects inside now; `lines`: line → its whole
    totals since start; `snapshots`: label → (id, JPEG) of that label's newest object when its
    snapshot changed; `object_snapshots`: id → JPEG of every object whose snapshot changed
    (for the disk store); `final_snapshots`: id → JPEG of the best view of every object that
    ended (what describes its event sees); `final_crossings`: id → the (line, "in" | "out")
    crossings of every object that ended, in order. Counts and lines hold only what changed
    (a count back to 0 is a change); the first update reports every configured label's and
    line's starting values."""

    events: list[Event] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    zone_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    lines: dict[str, LineTotals] = field(default_factory=dict)
    snapshots: dict[str, tuple[str, bytes]] = field(default_factory=dict)
    object_snapshots: dict[str, bytes] = field(default_factory=dict)
    # Frigate's tracked_object_update messages (a face told: known or an unknown group;
    # an object's plate read: `lpr`)
    updates: list[Event] = field(default_factory=list)
    final_snapshots: dict[str, bytes] = field(default_factory=dict)
    final_crossings: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    # id -> JPEG of the object's plate (its voted plate's best read) when that changed
    plate_snapshots: dict[str, bytes] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.events or self.counts or self.zone_counts or self.lines
                    or self.object_snapshots or self.updates or self.plate_snapshots)


class StreamEvents:
    def __init__(self, stream: str, settings: EventsSettings, *,
                 assign: Assign = cluster_assign, keep_plates: bool = True) -> None:
        """`keep_plates`: a snapshot store keeps the plates' own pictures (without one, none
        is encoded and no event says it has one)."""
        self.stream = stream
        self.keep_plates = keep_plates
        self.cfg = settings.track
        self.labels = frozenset(settings.labels)
        self.min_score = settings.min_score
        self.tracker = Tracker(settings.track, assign=assign, stream=stream)
        self.zones = Zones(settings.zones)
        self.lines = Lines(settings.lines)
        self.line_counts = LineCounts(self.lines.names, sorted(self.labels))
        self.snapshots = Snapshots(settings.snapshots) if settings.snapshots.enabled else None
        self._objects: dict[int, TrackedObject] = {}  # by track key
        self._newest: dict[str, str] = {}  # label -> id of its newest announced object
        self._crossed: dict[str, list[tuple[str, str]]] = {}  # id -> its (line, direction)
        self._number = 0
        self._clock = 0.0  # stream seconds: the sum of the frames' forward steps
        self._last_frame_time: float | None = None
        self._reported_counts: dict[str, int] = {}
        self._reported_zones: dict[str, dict[str, int]] = {z: {} for z in self.zones.names}
        self.seen: list[TrackedObject] = []  # the objects the last frame showed (live view)
        lpr: LprConfig | None = getattr(settings, "lpr", None)
        self.plates = Plates(lpr) if lpr is not None and lpr.enabled else None
        # masks: rle (the stream's per-frame results' form): objects' masks as COCO RLE at
        # the size of the frame they were found in (a held frame, with no pixels, keeps the
        # last size: it repeats the last answer)
        self.rle = getattr(settings, "masks", "polygon") == "rle"
        self._frame_size: tuple[int, int] | None = None

    def update(self, frame_time: float, detections: Detections,
               frame: np.ndarray | None = None) -> Changes:
        """One frame: its capture time, its detections and, for snapshots, its pixels (BGR).
        The detections tracked get the id of their object once it is announced."""
        t = self._advance(frame_time)
        if frame is not None:
            self._frame_size = (int(frame.shape[0]), int(frame.shape[1]))
        kept = self._wanted(detections)
        step = self.tracker.update(t, detections.boxes[kept], detections.scores[kept],
                                   [detections.labels[i] for i in kept])
        changes = Changes()
        seen = [self._observe(tr, frame_time, detections, kept) for tr in step.seen]
        self._place(seen, frame, changes)
        self.seen = seen
        for tr in step.ended:
            self._end(self._objects.pop(tr.key), t, changes)
        for tr in step.confirmed:
            self._announce(self._objects[tr.key], t, changes)
        for obj in self._objects.values():
            if self.plates is not None:  # (after its new event: a read before it waited)
                told = self.plates.update(obj, self.stream, frame_time)
                if told is not None:
                    changes.updates.append(told)
            if obj.announced:  # (one announced now has nothing due: its new event is fresh)
                self._snapshot_if_due(obj, t, changes)
                self._plate_if_due(obj, t, changes)
                event = update_if_due(obj, t, self.cfg.update_interval_s)
                if event is not None:
                    changes.events.append(event)
                face = face_update(obj)
                if face is not None:
                    changes.updates.append(face)
        live = {tr.key for tr in self.tracker.tracks}
        for key in [k for k in self._objects if k not in live]:
            del self._objects[key]  # tentative tracks the tracker dropped: never announced
        self._count(changes)
        for tr in step.seen:
            tracked = self._objects.get(tr.key)
            if tracked is not None and tr.detection is not None:
                detections.ids[kept[tr.detection]] = tracked.id
        return changes

    def flush(self) -> Changes:
        """End every live object (its end_time: when it was last seen); counts go to 0."""
        changes = Changes()
        for tr in self.tracker.reset():
            self._end(self._objects.pop(tr.key), self._clock, changes)
        self._objects.clear()
        self.seen = []
        self._count(changes)
        return changes

    def present(self) -> frozenset[tuple[str, str]]:
        """The (kind, name) pairs the live announced objects carry: a face's enrolled name
        (`face`), a known plate's name (`plate`); edged/events/presence.py."""
        names = set()
        for obj in self._objects.values():
            if not obj.announced:
                continue
            if obj.identity is not None and obj.identity.get("name"):
                names.add(("face", str(obj.identity["name"])))
            if obj.plate_name is not None:
                names.add(("plate", obj.plate_name))
        return frozenset(names)

    def objects(self) -> list[dict[str, Any]]:
        """The announced live objects, as their payloads now."""
        return [obj.payload() for obj in self._objects.values() if obj.announced]

    def counts(self) -> dict[str, int]:
        """Every label's count as last reported (to publish the whole state again)."""
        return dict(self._reported_counts)

    def zone_counts(self) -> dict[str, dict[str, int]]:
        return {zone: dict(by_label) for zone, by_label in self._reported_zones.items()}

    def line_totals(self) -> dict[str, LineTotals]:
        return {name: self.line_counts.snapshot(name) for name in self.lines.names}

    def _advance(self, frame_time: float) -> float:
        if self._last_frame_time is not None and math.isfinite(frame_time):
            step = frame_time - self._last_frame_time
            if step < 0:
                logger.debug("stream %s: capture time went back %.3f s", self.stream, -step)
            self._clock += max(0.0, step)
        if math.isfinite(frame_time):
            self._last_frame_time = frame_time
        return self._clock

    def _wanted(self, detections: Detections) -> list[int]:
        """The detections tracking takes (their indices): wanted labels, enough score, a real
        box."""
        boxes = detections.boxes
        x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
        ok = (np.isfinite(boxes).all(axis=1) & (x2 > x1) & (y2 > y1)
              & (detections.scores >= self.min_score))
        return [i for i in np.flatnonzero(ok).tolist()
                if not self.labels or detections.labels[i] in self.labels]

    def _observe(self, tr: Track, frame_time: float, detections: Detections,
                 kept: list[int]) -> TrackedObject:
        obj = self._objects.get(tr.key)
        if obj is None:
            obj = self._objects[tr.key] = TrackedObject(
                tr, self.stream, frame_time, frame_time, self.zones.new_state(),
                self.lines.new_state())
        assert tr.detection is not None  # a track seen this frame has its detection
        index = kept[tr.detection]
        mask, size = _finite(detections.masks[index]), None
        if self.rle and mask is not None:
            size = self._frame_size
            if size is None:  # never a frame's pixels: no size to draw it at
                mask = None
        obj.observe(frame_time, detections.sub_labels[index], detections.sub_label_scores[index],
                    mask, detections.keypoints[index], size)
        obj.observe_identity(detections.identities[index])
        if self.plates is not None:  # (its picture only where one is kept: no copy else)
            keep = self.snapshots is not None and self.keep_plates
            self.plates.observe(obj, detections.texts[index], detections.text_scores[index],
                                detections.text_views[index] if keep else None)
        return obj

    def _place(self, seen: list[TrackedObject], frame: np.ndarray | None,
               changes: Changes) -> None:
        """Zones, lines and snapshot candidates of the objects seen in this frame."""
        if not seen:
            return
        boxes = np.array([obj.track.box for obj in seen])
        if self.zones.names:
            inside = self.zones.inside(boxes, [obj.mask for obj in seen]).tolist()
            for obj, row in zip(seen, inside, strict=True):
                if self.zones.observe(obj.zones, row):
                    obj.current_zones = self.zones.current(obj.zones)
        if self.lines.names:
            crossed = self.lines.observe([obj.lines for obj in seen], boxes,
                                         [obj.mask for obj in seen])
            for obj, crossings in zip(seen, crossed, strict=True):
                if crossings:
                    self._cross(obj, crossings)
        if self.snapshots is not None and frame is not None:
            for obj in seen:
                self.snapshots.consider(obj.snapshot, frame, obj.track.box, obj.score)

    def _cross(self, obj: TrackedObject, crossings: list[Crossing]) -> None:
        if not obj.announced:  # counted if it is announced, forgotten if it never is
            obj.crossings += crossings
            return
        for line, direction in crossings:
            self.line_counts.add(self.lines.names[line], obj.label, direction)
            if obj.id is not None:
                self._crossed.setdefault(obj.id, []).append((self.lines.names[line], direction))

    def _announce(self, obj: TrackedObject, t: float, changes: Changes) -> None:
        self._number += 1
        new_id = object_id(obj.start_time, self.stream, self._number)
        self._newest[obj.label] = new_id
        obj.id = new_id  # the snapshot is published under it
        self._encode(obj, t, changes)
        self._plate_if_due(obj, t, changes)  # (its plate's picture is stored after it)
        changes.events.append(announce(obj, new_id, t))
        pending, obj.crossings = obj.crossings, []
        self._cross(obj, pending)

    def _snapshot_if_due(self, obj: TrackedObject, t: float, changes: Changes) -> None:
        state = obj.snapshot
        if state.pending is not None and t - state.encoded_at >= self.cfg.update_interval_s:
            self._encode(obj, t, changes)

    def _encode(self, obj: TrackedObject, t: float, changes: Changes) -> None:
        if self.snapshots is None or obj.id is None:
            return
        jpeg = self.snapshots.encode(obj.snapshot, t)
        if jpeg is None:
            return
        changes.object_snapshots[obj.id] = jpeg
        if self._newest.get(obj.label) == obj.id:
            changes.snapshots[obj.label] = (obj.id, jpeg)

    def _plate_if_due(self, obj: TrackedObject, t: float, changes: Changes, *,
                      now: bool = False) -> None:
        """The plate's own picture, when its voted plate's best read is not the one encoded:
        at once the first time, then at most every update_interval_s (and at its end, `now`).
        Only where snapshots are on and a store keeps them: it is kept with the object's
        snapshot (it has no topic of its own)."""
        if self.snapshots is None or not self.keep_plates or obj.id is None or obj.plate is None:
            return
        best = obj.plate.best_view()
        if best is None or obj.plate.plate is None:
            return
        shown = (obj.plate.plate, best[0])
        if shown == obj.plate_shown or (
                not now and t - obj.plate_encoded_at < self.cfg.update_interval_s):
            return
        jpeg = self.snapshots.jpeg(best[1])
        if jpeg is None:
            return
        obj.plate_jpeg, obj.plate_shown, obj.plate_encoded_at = jpeg, shown, t
        changes.plate_snapshots[obj.id] = jpeg

    def _end(self, obj: TrackedObject, t: float, changes: Changes) -> None:
        if not obj.announced:
            return
        self._encode(obj, t, changes)  # its best view, if a better one waited
        self._plate_if_due(obj, t, changes, now=True)
        if obj.snapshot.jpeg is not None and obj.id is not None:
            changes.final_snapshots[obj.id] = obj.snapshot.jpeg
        if obj.id is not None and obj.id in self._crossed:
            changes.final_crossings[obj.id] = self._crossed.pop(obj.id)
        changes.events.append(finish(obj))

    def _count(self, changes: Changes) -> None:
        announced = [obj for obj in self._objects.values() if obj.announced]
        now = Counter(obj.label for obj in announced)
        changes.counts.update(_diff(self._reported_counts, now, self.labels))
        for z, zone in enumerate(self.zones.names):
            inside = Counter(obj.label for obj in announced if obj.zones.member[z])
            diff = _diff(self._reported_zones[zone], inside, self.labels)
            if diff:
                changes.zone_counts[zone] = diff
        changes.lines.update(self.line_counts.take_changed())


def _diff(reported: dict[str, int], now: Counter[str], labels: frozenset[str]) -> dict[str, int]:
    """Labels whose count differs from the one last reported (updating it); a label once
    reported stays, so it is reported again when it falls to 0."""
    out = {}
    for label in sorted(set(reported) | set(now) | labels):
        n = now.get(label, 0)
        if reported.get(label) != n:
            reported[label] = n
            out[label] = n
    return out


def _finite(mask: list[list[float]] | None) -> list[list[float]] | None:
    """A detection's mask polygon, or None where it is not [x, y] pairs of finite numbers
    (zones, lines and events then treat the object as one without a mask)."""
    if mask is None:
        return None
    try:
        points = np.asarray(mask, np.float64)
    except (TypeError, ValueError):
        return None
    if points.size and (points.ndim != 2 or points.shape[1] != 2 or
                        not np.isfinite(points).all()):
        return None
    return mask
