"""The events room's settings, read as part of each stream (`streams[]` in `edged/config.py`):
tracking, which detections become objects, zones, lines, snapshots and what the stream
publishes. Every key is optional. A value's own checks (a polygon's shape, points in range, a
line of zero length) run in the schema, so their errors carry the key's line; the checks across
values (duplicate names) are `check_stream_events`, and labels against a model's are
`check_labels`, which can run only once the model is known."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from edged.core.errors import ConfigError, ConfigIssue
from edged.core.schema import Parsed, at_least, between, setting
from edged.events.geometry import self_intersection
from edged.tasks import BOXED_TASKS

MAX_COORD = 100_000  # frame pixels: larger than any sensor, small enough to catch typos
Anchor = Literal["bottom_center", "center"]
ZoneAnchor = Literal["bottom_center", "center", "mask"]
_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _check_topic_name(value: str) -> str | None:
    """Zone and line names are MQTT topic levels."""
    ok = 0 < len(value) <= 64 and set(value) <= _NAME_CHARS and value[0] not in "._-"
    return None if ok else f"{value!r} is not a valid name ([A-Za-z0-9_.-])"


def _check_points(points: list[list[float]], least: int) -> str | None:
    if len(points) < least:
        return f"needs at least {least} points, got {len(points)}"
    for i, point in enumerate(points):
        if len(point) != 2:
            return f"point {i} must be [x, y], got {point}"
        if not all(0 <= v <= MAX_COORD for v in point):
            return f"point {i} {point} is outside 0..{MAX_COORD} (frame pixels)"
    return None


def _check_polygon(points: list[list[float]]) -> str | None:
    problem = _check_points(points, 3)
    if problem:
        return problem
    for i in range(len(points)):
        if points[i] == points[(i + 1) % len(points)]:
            return f"points {i} and {(i + 1) % len(points)} are the same"
    crossing = self_intersection(points)
    if crossing is not None:
        return f"edges {crossing[0]} and {crossing[1]} cross: the polygon intersects itself"
    return None  # (a simple polygon without repeated points has an area)


def _check_line(points: list[list[float]]) -> str | None:
    problem = _check_points(points, 2)
    if problem:
        return problem
    if len(points) != 2:
        return f"a line is 2 points [[x1, y1], [x2, y2]], got {len(points)}"
    return "the line has zero length" if points[0] == points[1] else None


@dataclass(frozen=True)
class TrackConfig:
    iou_threshold: float = setting(0.3, "least IoU between an object's predicted box and a "
                                        "detection for them to match", check=between(0.01, 1))
    max_age_s: float = setting(1.0, "an object unseen this long has ended (shorter gaps and "
                                    "occlusions keep its id)", check=at_least(0))
    min_hits: int = setting(2, "frames in a row a new object must be seen before it is "
                               "announced (a one-frame false detection never is)",
                            check=between(1, 100))
    max_tracks: int = setting(64, "objects tracked at once; past it the one unseen longest is "
                                  "dropped, or the new one when all are in view",
                              check=between(1, 10000))
    update_interval_s: float = setting(1.0, "an object's update events at most this often",
                                       check=at_least(0))
    high_score: float = setting(0.5, "detections scoring at least this start objects and are "
                                     "matched first; weaker ones only keep objects alive "
                                     "(ByteTrack)", check=between(0, 1))


@dataclass(frozen=True)
class ZoneConfig:
    name: str = setting(help="zone name (in topics)", check=_check_topic_name)
    polygon: list[list[float]] = setting(help="[[x, y], ...] in frame pixels, 3 points or more",
                                         check=_check_polygon)
    anchor: ZoneAnchor = setting(
        "bottom_center", "what must be inside: a point of the box, bottom_center (feet, "
        "wheels) or center; or mask: at least `min_overlap` of a segment model's mask (an "
        "object without a mask is tested by its bottom centre)")
    min_overlap: float = setting(0.5, "anchor mask: the share of the mask's area inside the "
                                      "zone for the object to be in it", check=between(0.01, 1))
    inertia: int = setting(2, "frames in a row inside (outside) before an object enters "
                              "(leaves) the zone: a box jittering on the edge stays put",
                           check=between(1, 100))


@dataclass(frozen=True)
class LineConfig:
    name: str = setting(help="line name (in topics)", check=_check_topic_name)
    points: list[list[float]] = setting(
        help="[[x1, y1], [x2, y2]] in frame pixels; 'in' counts crossings from the left to the "
             "right of p1→p2 as seen on the screen (a line drawn left to right: moving down)",
        check=_check_line)
    anchor: ZoneAnchor = setting(
        "bottom_center", "the point whose path is followed: a point of the box, bottom_center "
        "or center; or mask: a segment model's mask's centre of mass (a frame without its "
        "mask: the last centre moved with the box; an object never with one: its bottom "
        "centre)")


@dataclass(frozen=True)
class SnapshotsConfig:
    enabled: bool = setting(True, "keep each object's best frame as a JPEG")
    jpeg_quality: int = setting(80, "JPEG quality", check=between(1, 100))
    crop: bool = setting(True, "the object and its surroundings rather than the whole frame")
    draw_box: bool = setting(True, "the object's box drawn on the snapshot")
    max_height: int = setting(360, "snapshots larger than this (or twice as wide) are scaled "
                                   "down to fit", check=between(16, 8192))


@dataclass(frozen=True)
class PublishConfig:
    frames: bool | None = setting(None, "each frame's results on streams/<stream>/results; "
                                        "null = by kind: not for a detect stream that "
                                        "publishes events, every frame for the others")
    events: bool = setting(True, "detect streams: track objects and publish their events, "
                                 "counts, line counts and snapshots")


@dataclass(frozen=True)
class Outputs:
    """What a stream publishes once its model's kind is known."""

    frames: bool  # each frame's results
    events: bool  # tracking on: events, counts, lines, snapshots


def outputs(publish: PublishConfig, kind: str) -> Outputs:
    """A detect stream tracks and publishes events (unless `events: false`) and then no
    per-frame results unless `frames: true` asks for them; classify and raw streams have no
    objects to track and publish every frame's results (unless `frames: false`)."""
    events = publish.events and kind in BOXED_TASKS
    frames = publish.frames if publish.frames is not None else not events
    return Outputs(frames, events)


class EventsSettings(Protocol):
    """What the events room reads from a stream's config (StreamConfig has it all)."""

    @property
    def track(self) -> TrackConfig: ...
    @property
    def labels(self) -> list[str]: ...
    @property
    def min_score(self) -> float: ...
    @property
    def zones(self) -> list[ZoneConfig]: ...
    @property
    def lines(self) -> list[LineConfig]: ...
    @property
    def snapshots(self) -> SnapshotsConfig: ...


def check_stream_events(parsed: Parsed[Any], path: str,
                        stream: EventsSettings) -> list[ConfigIssue]:
    """Zone names, line names and labels are unique within the stream (`path`: its key path,
    e.g. `streams[0]`)."""
    issues = []
    for key, names in (("zones", [z.name for z in stream.zones]),
                       ("lines", [ln.name for ln in stream.lines])):
        for j, name in enumerate(names):
            if name in names[:j]:
                issues.append(parsed.issue(f"{path}.{key}[{j}].name",
                                           f"duplicate {key[:-1]} name {name!r}"))
    for j, label in enumerate(stream.labels):
        if not label.strip():
            issues.append(parsed.issue(f"{path}.labels[{j}]", "a label cannot be empty"))
        elif label in stream.labels[:j]:
            issues.append(parsed.issue(f"{path}.labels[{j}]", f"duplicate label {label!r}"))
    return issues


def check_labels(labels: Sequence[str], known: Sequence[str], *, path: str) -> None:
    """Raise ConfigError naming each of `labels` (a stream's `labels:`, at key path `path`,
    e.g. `streams[0]`, or "" for the stream itself) that the model cannot produce; `known` is
    the model's label list."""
    names = set(known)
    some = ", ".join(list(known)[:20]) + (", ..." if len(known) > 20 else "")
    key = f"{path}.labels" if path else "labels"
    issues = [ConfigIssue(f"{key}[{j}]", f"the model has no label {label!r} ({some})")
              for j, label in enumerate(labels) if label not in names]
    if issues:
        raise ConfigError(issues)
