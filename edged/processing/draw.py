"""What a person sees of a stream: a frame with the model's boxes (label, score, object id,
sub_label), a segment model's masks (tinted, outlined) and a pose model's keypoints (points
and, for COCO's 17, the skeleton), the zones and lines as configured, and the stream's state
in a corner, drawn onto a scaled copy (the frame itself is never written to: the pipeline may
still be reading it).

Pure functions over plain data: the live view (`edged/streams/live.py`) calls them when
someone asks for a picture, never per processed frame."""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edged.tasks.keypoints import COCO_KEYPOINTS, COCO_SKELETON

Point = Sequence[float]

# BGR. Bright colours that are none of the pure primaries, so a box stays visible around a
# red, green or blue object (the demo's squares) and a test can tell box from object.
PALETTE = (
    (0, 215, 255),  # amber
    (255, 0, 255),  # magenta
    (255, 255, 0),  # cyan
    (0, 140, 255),  # orange
    (180, 105, 255),  # pink
    (50, 205, 154),  # yellow-green
    (238, 130, 238),  # violet
    (0, 255, 255),  # yellow
)
ZONE_COLOUR = (255, 191, 0)  # deep sky blue: fill and outline
LINE_COLOUR = (60, 20, 220)  # crimson
TEXT_COLOUR = (255, 255, 255)
PANEL_COLOUR = (0, 0, 0)
ZONE_FILL_ALPHA = 0.18
MASK_FILL_ALPHA = 0.4
KEYPOINT_MIN_SCORE = 0.5  # Ultralytics draws the points it is at least this sure of
JPEG_QUALITY = 80


@dataclass(frozen=True)
class Box:
    """One detection or tracked object, in frame pixels."""

    box: tuple[float, float, float, float]  # x1, y1, x2, y2
    label: str
    score: float
    object_id: str | None = None  # the tracked object's id, once it is announced
    sub_label: str | None = None


@dataclass(frozen=True)
class Overlay:
    """Everything drawn over one frame. `zones`/`lines`: (name, points) in frame pixels;
    `corner`: lines of text for the top-left corner (stream, fps, state; a classifier's
    answer)."""

    boxes: Sequence[Box] = ()
    zones: Sequence[tuple[str, Sequence[Point]]] = ()
    lines: Sequence[tuple[str, Sequence[Point]]] = ()
    corner: Sequence[str] = field(default_factory=tuple)
    # (label, polygon in frame pixels) per mask; (label, {name: [x, y(, score)]}) per pose
    masks: Sequence[tuple[str, Sequence[Point]]] = ()
    poses: Sequence[tuple[str, Mapping[str, Sequence[float]]]] = ()


def colour_of(label: str) -> tuple[int, int, int]:
    """A label's box colour (BGR): the same label the same colour, in every view and run."""
    return PALETTE[zlib.crc32(label.encode()) % len(PALETTE)]


def short_id(object_id: str) -> str:
    """`1718000000.123-door-17` → `#17`: what fits on a box."""
    return "#" + object_id.rsplit("-", 1)[-1]


def scaled(frame: np.ndarray, height: int | None) -> tuple[np.ndarray, float]:
    """A copy of `frame` at most `height` pixels high (never enlarged), and its scale."""
    import cv2

    if height is None or height >= frame.shape[0]:
        return frame.copy(), 1.0
    scale = height / frame.shape[0]
    width = max(1, round(frame.shape[1] * scale))
    return cv2.resize(frame, (width, height), interpolation=cv2.INTER_AREA), scale


def annotate(frame: np.ndarray, overlay: Overlay, height: int | None = None) -> np.ndarray:
    """A scaled copy of a BGR frame with `overlay` drawn on it. Drawn after scaling, so lines
    and text keep their size in the picture a person sees."""
    out, scale = scaled(frame, height)
    thickness = max(1, round(min(out.shape[:2]) / 160))
    font = max(0.35, min(out.shape[:2]) / 640)
    if overlay.zones:
        _zones(out, overlay.zones, scale, thickness, font)
    if overlay.masks:
        _masks(out, overlay.masks, scale, thickness)
    for name, points in overlay.lines:
        _line(out, name, points, scale, thickness, font)
    for label, named in overlay.poses:
        _pose(out, label, named, scale, thickness)
    for box in overlay.boxes:
        _box(out, box, scale, thickness, font)
    if overlay.corner:
        _panel(out, list(overlay.corner), (4, 4), font)
    return out


def encode_jpeg(image: np.ndarray, quality: int = JPEG_QUALITY) -> bytes:
    import cv2

    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ValueError(f"OpenCV could not encode a {image.shape} picture as JPEG")
    return data.tobytes()


def box_text(box: Box) -> str:
    text = f"{box.label} {box.score:.2f}"
    if box.object_id is not None:
        text += " " + short_id(box.object_id)
    if box.sub_label:
        text += f" {box.sub_label}"
    return text


def _pixels(points: Sequence[Point], scale: float) -> np.ndarray:
    return np.round(np.asarray(points, np.float64) * scale).astype(np.int32).reshape(-1, 1, 2)


def _zones(out: np.ndarray, zones: Sequence[tuple[str, Sequence[Point]]], scale: float,
           thickness: int, font: float) -> None:
    import cv2

    polygons = [_pixels(points, scale) for _, points in zones]
    tinted = out.copy()
    cv2.fillPoly(tinted, polygons, ZONE_COLOUR)
    cv2.addWeighted(tinted, ZONE_FILL_ALPHA, out, 1 - ZONE_FILL_ALPHA, 0, dst=out)
    for (name, _), polygon in zip(zones, polygons, strict=True):
        cv2.polylines(out, [polygon], True, ZONE_COLOUR, thickness, cv2.LINE_AA)
        # Its name at its bottom left, clear of the corner panel at the picture's top left.
        x, y = polygon.reshape(-1, 2).min(axis=0)[0], polygon.reshape(-1, 2).max(axis=0)[1]
        _label(out, f"zone {name}", (int(x) + thickness, int(y) - thickness), ZONE_COLOUR,
               font, below=False)


def _masks(out: np.ndarray, masks: Sequence[tuple[str, Sequence[Point]]], scale: float,
           thickness: int) -> None:
    """Each mask tinted in its label's colour, and outlined."""
    import cv2

    drawn = [(label, _pixels(points, scale)) for label, points in masks if len(points) >= 3]
    if not drawn:
        return
    tinted = out.copy()
    for label, polygon in drawn:
        cv2.fillPoly(tinted, [polygon], colour_of(label))
    cv2.addWeighted(tinted, MASK_FILL_ALPHA, out, 1 - MASK_FILL_ALPHA, 0, dst=out)
    for label, polygon in drawn:
        cv2.polylines(out, [polygon], True, colour_of(label), max(1, thickness - 1),
                      cv2.LINE_AA)


def _pose(out: np.ndarray, label: str, points: Mapping[str, Sequence[float]], scale: float,
          thickness: int) -> None:
    """The points a model is sure of as dots; COCO's skeleton between them."""
    import cv2

    colour = colour_of(label)
    sure = {name: (round(p[0] * scale), round(p[1] * scale)) for name, p in points.items()
            if len(p) < 3 or p[2] >= KEYPOINT_MIN_SCORE}
    if tuple(points) == COCO_KEYPOINTS:
        for a, b in COCO_SKELETON:
            ends = sure.get(COCO_KEYPOINTS[a]), sure.get(COCO_KEYPOINTS[b])
            if ends[0] is not None and ends[1] is not None:
                cv2.line(out, ends[0], ends[1], colour, thickness, cv2.LINE_AA)
    for at in sure.values():
        cv2.circle(out, at, thickness + 2, LINE_COLOUR, cv2.FILLED, cv2.LINE_AA)


def _line(out: np.ndarray, name: str, points: Sequence[Point], scale: float, thickness: int,
          font: float) -> None:
    """The line p1→p2 and an arrow from its middle to the side a crossing counts as `in`
    (left to right of p1→p2: the image's y axis points down, so that is the normal
    (-dy, dx))."""
    import cv2

    (x1, y1), (x2, y2) = (np.asarray(p, np.float64) * scale for p in points[:2])
    cv2.line(out, (round(x1), round(y1)), (round(x2), round(y2)), LINE_COLOUR,
             thickness + 1, cv2.LINE_AA)
    dx, dy = x2 - x1, y2 - y1
    length = float(np.hypot(dx, dy)) or 1.0
    reach = min(max(12.0, 0.08 * min(out.shape[:2])), length / 2)
    mx, my = (x1 + x2) / 2, (y1 + y2) / 2
    tip = (round(mx - dy / length * reach), round(my + dx / length * reach))
    cv2.arrowedLine(out, (round(mx), round(my)), tip, LINE_COLOUR, thickness + 1,
                    cv2.LINE_AA, tipLength=0.35)
    _label(out, f"line {name} (in)", (tip[0] + 2, tip[1]), LINE_COLOUR, font, below=True)


def _box(out: np.ndarray, box: Box, scale: float, thickness: int, font: float) -> None:
    import cv2

    colour = colour_of(box.label)
    x1, y1, x2, y2 = (round(v * scale) for v in box.box)
    cv2.rectangle(out, (x1, y1), (x2, y2), colour, thickness + 1)
    _label(out, box_text(box), (x1, y1), colour, font, below=False)


def _label(out: np.ndarray, text: str, at: tuple[int, int], colour: tuple[int, int, int],
           font: float, *, below: bool) -> None:
    """Text on a filled tag of `colour`, above the point (a box's tag) or below it, kept
    inside the picture."""
    import cv2

    (width, height), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, font, 1)
    pad = 2
    x = min(max(0, at[0]), max(0, out.shape[1] - width - 2 * pad))
    top = at[1] if below else at[1] - height - base - 2 * pad
    top = min(max(0, top), max(0, out.shape[0] - height - base - 2 * pad))
    cv2.rectangle(out, (x, top), (x + width + 2 * pad, top + height + base + 2 * pad), colour,
                  cv2.FILLED)
    ink = (0, 0, 0) if sum(colour) > 380 else TEXT_COLOUR
    cv2.putText(out, text, (x + pad, top + pad + height), cv2.FONT_HERSHEY_SIMPLEX, font, ink,
                1, cv2.LINE_AA)


def _panel(out: np.ndarray, lines: list[str], at: tuple[int, int], font: float) -> None:
    """Lines of white text on a dark, half-transparent panel."""
    import cv2

    sizes = [cv2.getTextSize(t, cv2.FONT_HERSHEY_SIMPLEX, font, 1) for t in lines]
    step = max(h + b for (_, h), b in sizes) + 3
    width = max(w for (w, _), _ in sizes) + 8
    x, y = at
    x2, y2 = min(out.shape[1], x + width), min(out.shape[0], y + step * len(lines) + 4)
    region = out[y:y2, x:x2]
    region[:] = (region * 0.45).astype(np.uint8)  # darkened, not hidden: a view, not a mask
    for i, text in enumerate(lines):
        cv2.putText(out, text, (x + 4, y + step * (i + 1) - 2), cv2.FONT_HERSHEY_SIMPLEX, font,
                    TEXT_COLOUR, 1, cv2.LINE_AA)
