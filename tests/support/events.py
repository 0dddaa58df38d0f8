"""For the events room's tests: a stream's config as an operator writes it, detections as
post-processing makes them, boxes moving across frames, and frames with coloured boxes."""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np

from edged.config import parse_config
from edged.streams.config import StreamConfig

Box = tuple[float, float, float, float]
BGR = {"red": (0, 0, 255), "green": (0, 255, 0), "blue": (255, 0, 0), "white": (255, 255, 255)}
T0 = 1_700_000_000.0  # capture times are Unix seconds


def stream(keys: str = "") -> StreamConfig:
    """The stream `door` with these extra keys (YAML, as written under the stream)."""
    text = ("streams:\n  - name: door\n    source: 'file:///x.avi'\n    model: det\n"
            + textwrap.indent(textwrap.dedent(keys).lstrip("\n"), "    "))
    return parse_config(text).streams[0]


def det(box: Box, label: str = "person", score: float = 0.9, **extra: Any) -> dict[str, Any]:
    return {"class": 0, "label": label, "score": score, "box": [float(v) for v in box], **extra}


def moved(box: Box, dx: float = 0.0, dy: float = 0.0) -> Box:
    x1, y1, x2, y2 = box
    return (x1 + dx, y1 + dy, x2 + dx, y2 + dy)


def path(start: Box, step: tuple[float, float], frames: int) -> list[Box]:
    """A box moving by `step` pixels a frame."""
    return [moved(start, step[0] * i, step[1] * i) for i in range(frames)]


def frame(size: tuple[int, int] = (480, 640), **boxes: Box) -> np.ndarray:
    """A black BGR frame (height, width) with a filled box of each named colour."""
    out = np.zeros((*size, 3), np.uint8)
    for colour, (x1, y1, x2, y2) in boxes.items():
        out[int(y1):int(y2), int(x1):int(x2)] = BGR[colour]
    return out
