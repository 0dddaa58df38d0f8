"""The life of an object as subscribers see it: Frigate-shaped events.

`{"type": "new" | "update" | "end", "before": obj | None, "after": obj}`, where `obj` is
`TrackedObject.payload()`: id, stream, label, sub_label (+ its score), score, top_score, box,
start_time, end_time, frame_time, current_zones, entered_zones, has_snapshot. `new` once the
tracker confirmed the object; `update` only when something a subscriber acts on changed (its
zones, a better top_score, its sub_label, a first snapshot), at most every
`update_interval_s`; `end` when it is gone. `before` is the object as last published.

Ids are `<start_time>-<stream>-<n>`, e.g. `1718000000.123-door-17`: the capture time (ms) of
its first frame, the stream and a per-stream counter. They are unique per device (streams have
unique names; a restart starts the counter again but not the clock), readable, sort by time
within a stream, and are safe as file names (snapshot store) and topic levels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from edged.events.plates import PlateVote
from edged.events.snapshot import SnapshotState
from edged.events.track import Track
from edged.events.zones import Crossing, LineState, ZoneState
from edged.tasks import rle

Event = dict[str, Any]
Watched = tuple[tuple[str, ...], tuple[str, ...], float, str | None, bool, str | None, bool]


@dataclass(eq=False, slots=True)
class TrackedObject:
    """One track's public side: what its detections said, where it is, what was published."""

    track: Track
    stream: str
    start_time: float  # capture time (Unix s) of its first frame
    frame_time: float  # capture time of the last frame it was seen in
    zones: ZoneState
    lines: LineState
    snapshot: SnapshotState = field(default_factory=SnapshotState)
    id: str | None = None  # given when the tracker confirms it
    score: float = 0.0
    top_score: float = 0.0
    box: list[float] = field(default_factory=list)
    sub_label: str | None = None
    sub_label_score: float | None = None
    # a segment or pose model's mask polygon or keypoints, of its latest detection
    mask: list[list[float]] | None = None
    # (height, width) of the frame the mask was found in when the stream publishes masks as
    # COCO RLE (`masks: rle`); None: as the polygon
    mask_frame: tuple[int, int] | None = None
    keypoints: dict[str, list[float]] | None = None
    current_zones: list[str] = field(default_factory=list)
    end_time: float | None = None
    crossings: list[Crossing] = field(default_factory=list)  # made while still tentative
    published: Event | None = None  # payload of the last new/update
    published_watch: Watched | None = None
    published_at: float = -math.inf  # stream clock
    # A face cascade's verdict ({name, similarity} or {name: None, similarity, group}), and
    # the (name, group) last said on tracked_object_update.
    identity: dict[str, Any] | None = None
    face_said: tuple[str | None, int | None] | None = None
    plate: PlateVote | None = None  # a stream with lpr: its text cascade's reads, voted
    plate_sent: str | None = None  # the plate last told on tracked_object_update
    plate_name: str | None = None  # the known plate's name it matched
    # The plate's own picture: the JPEG of the voted plate's best read, and which read it is
    # ((plate, score): a better read or another plate voted makes a new one)
    plate_jpeg: bytes | None = None
    plate_shown: tuple[str, float] | None = None
    plate_encoded_at: float = -math.inf  # stream clock

    @property
    def label(self) -> str:
        return self.track.label

    @property
    def announced(self) -> bool:
        return self.id is not None

    def observe(self, frame_time: float, sub_label: str | None,
                sub_label_score: float | None, mask: list[list[float]] | None = None,
                keypoints: dict[str, list[float]] | None = None,
                mask_frame: tuple[int, int] | None = None) -> None:
        """This frame's detection of the object (the track has its box and score; a cascade
        may have read a sub_label on it; a segment or pose model gave its mask or points;
        `mask_frame`: the frame's (height, width) when its mask is published as RLE)."""
        self.frame_time = frame_time
        self.mask, self.keypoints, self.mask_frame = mask, keypoints, mask_frame
        self.score = score = self.track.score
        if score > self.top_score:
            self.top_score = score
        self.box = self.track.box.tolist()
        if sub_label is not None:
            sub_score = 0.0 if sub_label_score is None else float(sub_label_score)
            # The most confident reading wins: a cascade on crops flickers frame to frame.
            if self.sub_label_score is None or sub_score > self.sub_label_score:
                self.sub_label, self.sub_label_score = sub_label, sub_score

    def observe_identity(self, identity: dict[str, Any] | None) -> None:
        """A face cascade's verdict on this frame's detection: a known name outranks an
        unknown group, and of known ones the most similar holds (frames flicker)."""
        if identity is None:
            return
        held = self.identity
        if held is None or (identity.get("name") is not None and (
                held.get("name") is None or identity["similarity"] > held["similarity"])):
            self.identity = dict(identity)

    def watched(self) -> Watched:
        """What a subscriber acts on; an update is due when it changed."""
        return (tuple(self.current_zones), tuple(self.zones.entered), self.top_score,
                self.sub_label, self.snapshot.jpeg is not None,
                self.plate.plate if self.plate is not None else None,
                self.plate_jpeg is not None)

    def payload(self) -> Event:
        event = self._payload()
        if self.mask is not None:  # a segment model's: not watched (no update of its own)
            if self.mask_frame is None:
                event["mask"] = self.mask
            else:  # COCO RLE at frame size, made only for what is published
                encoded = rle.encode_safely(self.mask, *self.mask_frame)
                if encoded is not None:
                    event["mask"] = encoded
        if self.keypoints is not None:
            event["keypoints"] = self.keypoints
        if self.identity is not None:
            event["identity"] = self.identity
        if self.plate is not None:  # (a stream with lpr: Frigate's two fields, null at first)
            event["recognized_license_plate"] = self.plate.plate
            event["recognized_license_plate_score"] = self.plate.score
            # its best read's picture: GET /v2/edged/snapshots/<id>/plate (kept with the
            # object's snapshot)
            event["has_plate_snapshot"] = self.plate_jpeg is not None
        return event

    def _payload(self) -> Event:
        return {"id": self.id, "stream": self.stream, "label": self.label,
                "sub_label": self.sub_label, "sub_label_score": self.sub_label_score,
                "score": round(self.score, 4), "top_score": round(self.top_score, 4),
                "box": list(self.box), "start_time": self.start_time,
                "end_time": self.end_time, "frame_time": self.frame_time,
                "current_zones": list(self.current_zones),
                "entered_zones": list(self.zones.entered),
                "has_snapshot": self.snapshot.jpeg is not None}


def object_id(start_time: float, stream: str, number: int) -> str:
    return f"{start_time:.3f}-{stream}-{number}"


def announce(obj: TrackedObject, object_id: str, t: float) -> Event:
    """The `new` event of a confirmed object."""
    obj.id = object_id
    return _publish(obj, "new", t)


def update_if_due(obj: TrackedObject, t: float, interval_s: float) -> Event | None:
    """The `update` event when something watched changed and the last event is old enough."""
    if t - obj.published_at < interval_s or obj.watched() == obj.published_watch:
        return None
    return _publish(obj, "update", t)


def finish(obj: TrackedObject) -> Event:
    """The `end` event: the object was last seen at its frame_time."""
    obj.end_time = obj.frame_time
    return {"type": "end", "before": obj.published, "after": obj.payload()}


def face_update(obj: TrackedObject) -> Event | None:
    """Frigate's `tracked_object_update` of type `face` when an announced object's face is
    first told, or becomes someone (or another group): `name` (null: unknown), `score` (the
    cosine similarity), `group` (an unknown face's group), `camera` (Frigate's word for the
    stream), `stream`, `timestamp` (the frame's capture time)."""
    identity = obj.identity
    if identity is None or obj.id is None:
        return None
    said = (identity.get("name"), identity.get("group"))
    if said == obj.face_said or (obj.face_said is not None and obj.face_said[0] is not None
                                 and said[0] == obj.face_said[0]):
        return None
    obj.face_said = said
    return {"type": "face", "id": obj.id, "name": said[0], "score": identity["similarity"],
            "group": said[1], "camera": obj.stream, "stream": obj.stream,
            "timestamp": obj.frame_time}


def _publish(obj: TrackedObject, kind: str, t: float) -> Event:
    after = obj.payload()
    event = {"type": kind, "before": obj.published, "after": after}
    obj.published, obj.published_watch, obj.published_at = after, obj.watched(), t
    return event
