"""A mask as COCO's run-length encoding, for subscribers that want the pixels rather than the
outline: `{"size": [height, width], "counts": "<string>"}`, the compressed form pycocotools'
`maskUtils.encode` writes and COCO's results files carry. The bitmap is the polygon drawn at
frame size (OpenCV's `fillPoly`, the pixels whose centres it covers), read in column-major
order (Fortran, as pycocotools reads its masks); runs alternate 0s and 1s starting with 0s;
each run is written as pycocotools' `rleToString` writes it (from the fourth run on, the
difference from the run two before; 5 bits a character, offset by 48, with a continuation
bit).

The polygon is drawn only over its bounding box (plus a margin, within the frame) and the runs
are found there: a 1080p frame is 2 million pixels and a mask a few thousand, and OpenCV's fill
moved by whole pixels sets the same pixels, so the runs are the whole frame's
(`tests/unit/tasks/test_rle.py` holds them to `runs(raster(...))`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from edged.core.errors import InvalidInput


def raster(polygon: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    """The polygon (frame pixels, 0.1 px as published) drawn as a bool [height, width] bitmap:
    OpenCV's fill with 4 fractional bits, so a tenth of a pixel counts."""
    bitmap = np.zeros((height, width), np.uint8)
    points = np.asarray(polygon, np.float64).reshape(-1, 2)
    if len(points) >= 3:
        fixed = np.round(points * 16).astype(np.int32)
        cv2.fillPoly(bitmap, [fixed], 1, lineType=cv2.LINE_8, shift=4)
    return bitmap.astype(bool)


def runs(bitmap: np.ndarray) -> list[int]:
    """Column-major runs of 0s and 1s, starting with 0s (a bitmap that starts with a 1 has a
    first run of 0)."""
    flat = np.asarray(bitmap, bool).ravel(order="F")
    if flat.size == 0:
        return []
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate(([0], edges, [flat.size]))
    counts = np.diff(bounds).tolist()
    return [0, *counts] if flat[0] else counts


def counts_string(counts: Sequence[int]) -> str:
    """pycocotools' `rleToString`: LEB128-like, 5 bits a character + 48, deltas from the fourth.
    Every run at once: a round of 5 bits for all values still writing (at most 13 for 64-bit
    counts), then each value's characters in order."""
    values = np.asarray(counts, np.int64).reshape(-1)
    if not len(values):
        return ""
    x = values.copy()
    x[3:] -= values[1:-2]  # from the fourth on, the difference from the run two before
    rounds = []
    writing = np.ones(len(x), bool)
    while writing.any():
        c = x & 0x1F
        x >>= 5  # arithmetic: a negative difference ends in -1
        more = writing & ~(((c & 0x10) == 0) & (x == 0) | ((c & 0x10) != 0) & (x == -1))
        rounds.append(np.where(writing, (c | (more << 5)) + 48, 0))
        writing = more
    chars = np.stack(rounds, axis=1).astype(np.uint8).ravel()  # value by value, round by round
    return chars[chars != 0].tobytes().decode("ascii")


def string_counts(text: str) -> list[int]:
    """pycocotools' `rleFrString`: the runs back from their string."""
    counts: list[int] = []
    position = 0
    while position < len(text):
        x, shift, more = 0, 0, True
        while more:
            c = ord(text[position]) - 48
            x |= (c & 0x1F) << (5 * shift)
            more = bool(c & 0x20)
            position += 1
            shift += 1
            if not more and c & 0x10:
                x |= -1 << (5 * shift)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def encode(polygon: Sequence[Sequence[float]], height: int, width: int) -> dict[str, Any]:
    """A mask polygon as COCO RLE at frame size."""
    return {"size": [height, width], "counts": counts_string(polygon_runs(polygon, height,
                                                                          width))}


def polygon_runs(polygon: Sequence[Sequence[float]], height: int, width: int) -> list[int]:
    """`runs(raster(polygon, height, width))`, drawing only the polygon's bounding box."""
    points = np.asarray(polygon, np.float64).reshape(-1, 2)
    if len(points) < 3 or height <= 0 or width <= 0:
        return runs(np.zeros((height, width), bool))
    fixed = np.round(points * 16).astype(np.int64)
    # every pixel the fill can set, with a margin of two (the fill rounds to pixel centres)
    left, top = (max(0, int(v) // 16 - 2) for v in fixed.min(axis=0))
    right, bottom = (min(limit - 1, int(v) // 16 + 2)
                     for v, limit in zip(fixed.max(axis=0), (width, height), strict=True))
    if right < left or bottom < top:  # wholly outside the frame
        return [height * width]
    box = np.zeros((bottom - top + 1, right - left + 1), np.uint8)
    moved = (fixed - np.array([left * 16, top * 16], np.int64)).astype(np.int32)
    cv2.fillPoly(box, [moved], 1, lineType=cv2.LINE_8, shift=4)
    return _box_runs(box, top, left, height, width)


def _box_runs(box: np.ndarray, top: int, left: int, height: int, width: int) -> list[int]:
    """The frame's column-major runs when only `box` (at top, left) may be set."""
    rows, cols = box.shape
    padded = np.zeros((cols, rows + 2), np.uint8)  # a column a row, a zero above and below
    padded[:, 1:-1] = box.T
    flat = padded.ravel()
    # where a run starts or ends: the first pixel of the new value, in the frame's order
    at = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    col, row = np.divmod(at, rows + 2)
    bounds = (col + left) * height + top + row - 1
    # a run to the bottom of one column that goes on at the top of the next is one run
    joined = np.flatnonzero(bounds[1:] == bounds[:-1])
    if len(joined):
        bounds = np.delete(bounds, np.concatenate((joined, joined + 1)))
    total = height * width
    edges = [0, *bounds.tolist()]
    if edges[-1] != total:
        edges.append(total)
    return np.diff(edges).tolist() if len(edges) > 1 else []


def decode(rle: dict[str, Any]) -> np.ndarray:
    """A COCO RLE (string or list counts) back to its bool [height, width] bitmap;
    InvalidInput when its runs do not fill its size."""
    height, width = (int(v) for v in rle["size"])
    counts = rle["counts"]
    values = string_counts(counts) if isinstance(counts, str) else [int(c) for c in counts]
    if sum(values) != height * width or any(v < 0 for v in values):
        raise InvalidInput(f"RLE runs sum to {sum(values)}, not {height} x {width}")
    flat = np.repeat(np.arange(len(values)) % 2 == 1, values)
    return flat.reshape((height, width), order="F")


def encode_safely(polygon: Any, height: int, width: int) -> dict[str, Any] | None:
    """`encode`, for a mask that may be degenerate: an empty list, fewer than 3 points or no
    area is the RLE of an empty mask (one run of 0s); a polygon that is not [x, y] numbers,
    or not finite, is None (no mask to show)."""
    try:
        points = np.asarray(polygon, np.float64).reshape(-1, 2)
    except (TypeError, ValueError):
        return None
    if not np.isfinite(points).all():
        return None
    return encode(points.tolist(), height, width)


def encode_rows(rows: list[dict[str, Any]], width: int, height: int) -> None:
    """Each published detection row's `mask` polygon replaced by its RLE, in place."""
    for row in rows:
        mask = row.get("mask")
        if mask is not None:
            row["mask"] = encode(mask, height, width)
