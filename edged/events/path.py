"""Where each object went: the bottom centre of its box over time, a few points a second at
most, for what describes its event (edged/describer). Bounded: past MAX_POINTS an object's
path keeps every other point, so a long stay costs the same as a short one."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

MAX_POINTS = 64
MIN_GAP_S = 0.25  # an object is looked at (and a point added) at most this often
MIN_STEP = 0.05  # ... and only when it moved this share of its box's size (or 2 s passed)
STILL_S = 2.0

Point = tuple[float, float, float]  # (seconds since the object was first seen, x, y)


class Paths:
    """The paths of a stream's live objects, by object id; fed each frame on the stream's
    thread, taken once when an object ends."""

    def __init__(self) -> None:
        self._paths: dict[str, list[Point]] = {}
        self._start: dict[str, float] = {}
        self._due: dict[str, float] = {}  # no point before this frame time (MIN_GAP_S)

    def observe(self, frame_time: float,
                seen: Iterable[tuple[str | None, Sequence[float]]]) -> None:
        """This frame's announced objects: (id, box [x1, y1, x2, y2])."""
        due = self._due
        for object_id, box in seen:
            if object_id is None or frame_time < due.get(object_id, -1.0):
                continue  # (most frames: one lookup, the box not read)
            path = self._paths.get(object_id)
            if path is None:
                self._start[object_id] = frame_time
                path = self._paths[object_id] = []
            due[object_id] = frame_time + MIN_GAP_S  # looked at: not again before then
            x1, y1, x2, y2 = (float(v) for v in box)
            point = (frame_time - self._start[object_id], (x1 + x2) / 2, y2)
            if path and not _worth(path[-1], point, max(x2 - x1, y2 - y1)):
                continue
            path.append(point)
            if len(path) > MAX_POINTS:
                del path[1:-1:2]  # every other point, the first and the newest kept

    def take(self, object_id: str) -> list[Point]:
        """An ended object's path (and forget it)."""
        self._start.pop(object_id, None)
        self._due.pop(object_id, None)
        return self._paths.pop(object_id, [])

    def __len__(self) -> int:
        return len(self._paths)


def _worth(last: Point, point: Point, size: float) -> bool:
    gap = point[0] - last[0]
    moved = max(abs(point[1] - last[1]), abs(point[2] - last[2]))
    return moved >= MIN_STEP * max(size, 1.0) or gap >= STILL_S
