"""Zones and lines: where a stream's objects are, and which lines they crossed.

An object is in a zone when an anchor point of its box (the bottom centre by default: where
feet and wheels are), or `min_overlap` of a segment model's mask (`anchor: mask`), is inside
the zone's polygon for `inertia` frames in a row, and leaves it
after as many frames outside, so a box jittering on the edge does not flicker in and out. Each
object knows the zones it is in now and every zone it ever entered, in order.

A line counts crossings per label and direction: "in" from the left to the right of the
directed segment p1→p2 as seen on the screen, "out" back. The anchor a line follows is a point
of the box (the bottom centre by default), or with `anchor: mask` a segment model's mask's
centre of mass (supervision's CENTER_OF_MASS). A frame without the object's mask moves its
last centre with its box (a point that jumped to the box's foot could cross a line between
them); an object that never had one is followed by its bottom centre.
Each object has a side of each line,
committed only once its anchor is clear of a dead band around the line (5% of the box's width
plus height, at least 2 px), and a crossing is counted when the committed side changes and
the anchor's path since the last commitment touched the segment itself (a pass beside its end
counts nothing). Jitter on the line therefore stays inside the band or touches the segment
without committing the far side: one pass, one count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edged.events.config import LineConfig, ZoneConfig
from edged.events.geometry import anchors, inside, mask_anchors, mask_share, paths_meet, sides

BAND_SHARE = 0.05  # of the box's width + height: the anchor's usual jitter
BAND_MIN_PX = 2.0


@dataclass(slots=True)
class ZoneState:
    """One object's zones: membership per zone (in the config's order), frames in a row its
    anchor disagreed with it, and the zones it ever entered (in the order entered)."""

    member: list[bool]
    streak: list[int]
    entered: list[str] = field(default_factory=list)


@dataclass(slots=True)
class LineState:
    """One object's sides of each line (+1 right, -1 left, 0 not yet known), whether its path
    touched the segment since that side was committed, and its previous anchor points by kind
    (the paths' starts)."""

    side: list[int]
    touched: list[bool]
    previous: dict[str, np.ndarray] | None = None
    mask_offset: np.ndarray | None = None  # its last mask's centre less its box's foot


class Zones:
    def __init__(self, configs: Sequence[ZoneConfig]) -> None:
        self.names = [z.name for z in configs]
        self.anchor = [z.anchor for z in configs]
        self.inertia = [z.inertia for z in configs]
        self.polygons = [np.asarray(z.polygon, np.float64) for z in configs]
        self.min_overlap = [z.min_overlap for z in configs]

    def new_state(self) -> ZoneState:
        return ZoneState([False] * len(self.names), [0] * len(self.names))

    def inside(self, boxes: np.ndarray,
               masks: Sequence[list[list[float]] | None] | None = None) -> np.ndarray:
        """[N, 4] boxes (and the objects' mask polygons, None where one has none) → [N, zones]
        bool: whether each object's anchor is inside each zone."""
        out = np.zeros((len(boxes), len(self.names)), bool)
        kinds = {"bottom_center" if kind == "mask" else kind for kind in self.anchor}
        points: dict[str, np.ndarray] = {kind: anchors(boxes, kind) for kind in kinds}
        for z, polygon in enumerate(self.polygons):
            if self.anchor[z] != "mask":
                out[:, z] = inside(points[self.anchor[z]], polygon)
                continue
            out[:, z] = inside(points["bottom_center"], polygon)  # objects with no mask
            for i, mask in enumerate(masks or ()):
                if mask is not None and len(mask) >= 3:
                    out[i, z] = mask_share(np.asarray(mask, np.float64),
                                           polygon) >= self.min_overlap[z]
        return out

    def observe(self, state: ZoneState, inside_now: Sequence[bool]) -> bool:
        """One frame's observation of one object; True when its membership changed."""
        changed = False
        for z, now in enumerate(inside_now):
            if now == state.member[z]:
                state.streak[z] = 0
                continue
            state.streak[z] += 1
            if state.streak[z] >= self.inertia[z]:
                state.member[z] = bool(now)
                state.streak[z] = 0
                changed = True
                if now and self.names[z] not in state.entered:
                    state.entered.append(self.names[z])
        return changed

    def current(self, state: ZoneState) -> list[str]:
        return [name for name, member in zip(self.names, state.member, strict=True) if member]


Crossing = tuple[int, str]  # (line index, "in" | "out")


class Lines:
    def __init__(self, configs: Sequence[LineConfig]) -> None:
        self.names = [ln.name for ln in configs]
        self.anchor = [ln.anchor for ln in configs]
        self.ends = [(np.asarray(ln.points[0], np.float64), np.asarray(ln.points[1], np.float64))
                     for ln in configs]

    def new_state(self) -> LineState:
        return LineState([0] * len(self.names), [False] * len(self.names))

    def observe(self, states: Sequence[LineState], boxes: np.ndarray,
                masks: Sequence[list[list[float]] | None] | None = None) -> list[list[Crossing]]:
        """One frame of N objects: their states, [N, 4] boxes now (and mask polygons, None
        where one has none) → each object's crossings (most often none). Updates the
        states."""
        crossings: list[list[Crossing]] = [[] for _ in states]
        if not self.names or not len(states):
            return crossings
        points = {kind: self._mask_points(states, boxes, masks) if kind == "mask"
                  else anchors(boxes, kind) for kind in set(self.anchor)}
        band = np.maximum(BAND_MIN_PX, BAND_SHARE * ((boxes[:, 2] - boxes[:, 0])
                                                     + (boxes[:, 3] - boxes[:, 1])))
        for ln, (p1, p2) in enumerate(self.ends):
            now = points[self.anchor[ln]]
            starts = np.array([now[i] if s.previous is None else s.previous[self.anchor[ln]]
                               for i, s in enumerate(states)]).reshape(-1, 2)
            touched = paths_meet(starts, now, p1, p2).tolist()
            side_now = sides(now, p1, p2, band).tolist()
            for i, state in enumerate(states):
                state.touched[ln] = state.touched[ln] or touched[i]
                s = side_now[i]
                if s == 0:
                    continue  # on the line: the side is not committed yet
                if state.side[ln] not in (0, s) and state.touched[ln]:
                    crossings[i].append((ln, "in" if s == 1 else "out"))
                state.side[ln] = s
                state.touched[ln] = False
        for i, state in enumerate(states):
            state.previous = {kind: point[i] for kind, point in points.items()}
        return crossings


    @staticmethod
    def _mask_points(states: Sequence[LineState], boxes: np.ndarray,
                     masks: Sequence[list[list[float]] | None] | None) -> np.ndarray:
        """Each object's mask centre; where it has no mask this frame, its last one's place
        relative to its box's foot (updated where it has)."""
        points, found = mask_anchors(boxes, masks)
        feet = anchors(boxes, "bottom_center")
        for i, state in enumerate(states):
            if found[i]:
                state.mask_offset = points[i] - feet[i]
            elif state.mask_offset is not None:
                points[i] = feet[i] + state.mask_offset
        return points


class LineCounts:
    """Crossings since start per line, label and direction; which lines changed since the
    last `take_changed()`."""

    def __init__(self, names: Sequence[str], labels: Sequence[str]) -> None:
        self.counts: dict[str, dict[str, dict[str, int]]] = {
            name: {label: {"in": 0, "out": 0} for label in labels} for name in names}
        self._changed = set(names)  # the first report says where each line starts

    def add(self, line: str, label: str, direction: str) -> None:
        by_label = self.counts[line].setdefault(label, {"in": 0, "out": 0})
        by_label[direction] += 1
        self._changed.add(line)

    def take_changed(self) -> dict[str, dict[str, dict[str, int]]]:
        changed = {name: self.snapshot(name) for name in sorted(self._changed)}
        self._changed.clear()
        return changed

    def snapshot(self, name: str) -> dict[str, dict[str, int]]:
        return {label: dict(v) for label, v in self.counts[name].items()}
