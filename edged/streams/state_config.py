"""A stream's classified regions (`streams[].states[]`, `edged/streams/states.py`): the
config and its checks across values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from edged.core.errors import ConfigIssue
from edged.core.schema import at_least, between, check_name, setting

MAX_PIXELS = 100_000


def _check_region(points: list[list[float]]) -> str | None:
    if len(points) < 2:
        return f"a region is a box [[x1, y1], [x2, y2]] or a polygon of 3 points or more, " \
               f"got {len(points)} points"
    for i, point in enumerate(points):
        if len(point) != 2:
            return f"point {i} must be [x, y], got {point}"
        if not all(math.isfinite(v) and 0 <= v <= MAX_PIXELS for v in point):
            return f"point {i} {point} is outside the frame (negative or beyond {MAX_PIXELS})"
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    if max(xs) <= min(xs) or max(ys) <= min(ys):
        return "the region has no area"
    return None


@dataclass(frozen=True)
class StateConfig:
    """One classified region of a stream (`streams[].states[]`)."""

    name: str = setting(help="the state's name (a topic level)", check=check_name)
    model: str = setting(help="a classify model: its top label is the state",
                         check=check_name)
    region: list[list[float]] = setting(
        help="[[x1, y1], [x2, y2]] (a box) or [[x, y], ...] (a polygon: its bounding box is "
             "cropped) in frame pixels, or in fractions of the frame's width and height with "
             "units: fractions", check=_check_region)
    units: Literal["pixels", "fractions"] = setting("pixels", "what the region's numbers are")
    interval_s: float = setting(10.0, "the region is read at least this often (seconds of "
                                      "capture time)", check=at_least(0.1))
    on_change: bool = setting(True, "read the region sooner when its picture changed (the "
                                    "change gate's measure, on the region only)")
    change_threshold: float = setting(0.01, "on_change: share of the region's thumbnail that "
                                            "must change for a read", check=between(0, 1))
    debounce: int = setting(2, "reads in a row that must agree before the state changes",
                            check=between(1, 100))
    min_score: float = setting(0.0, "reads scoring below this do not count towards a change",
                               check=between(0, 1))


def check_states(parsed: Any, path: str, states: list[StateConfig],
                 size: list[int] | None) -> list[ConfigIssue]:
    """Names unique; a fractions region within 0..1; a pixel region inside the stream's
    `size:` where it has one (`path`: the stream's key path)."""
    issues = []
    names = [s.name for s in states]
    for j, state in enumerate(states):
        key = f"{path}.states[{j}]"
        if state.name in names[:j]:
            issues.append(parsed.issue(f"{key}.name", f"duplicate state name {state.name!r}"))
        bound = (1.0, 1.0) if state.units == "fractions" else \
            (float(size[0]), float(size[1])) if size else None
        if bound is not None and any(x > bound[0] or y > bound[1] for x, y in state.region):
            what = "fractions of the frame (0..1)" if state.units == "fractions" else \
                f"the stream's size {size[0]}x{size[1]}" if size else ""
            issues.append(parsed.issue(f"{key}.region", f"the region {state.region} is "
                                                        f"outside {what}"))
    return issues
