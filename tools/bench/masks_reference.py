"""edged's instance-mask path as it was before the one-pass rewrite (`edged/tasks/segment.py`
at af4a336, copied unchanged): a call chain per detection, each building its window's bitmap,
contour, points in frame pixels and Python floats on its own. Kept as the path the rewrite is
held to, polygon for polygon (`tests/unit/tasks/test_segment_differential.py`), and timed beside
it by `python -m tools.bench masks` (the "before" rows); and its RLE (`edged/tasks/rle.py` at
af4a336: the polygon drawn over the whole frame, its runs, a Python loop a count for the
string)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from edged.tasks.placement import Placement, to_frame_points
from edged.tasks.rle import raster, runs
from edged.tasks.segment import PROTO_STRIDE, simplify

Polygon = list[list[float]]


def mask_polygons(proto: np.ndarray, coefficients: np.ndarray, boxes: np.ndarray,
                  geometry: Placement | None, threshold: float, max_points: int
                  ) -> list[Polygon]:
    """One polygon per detection: `proto` [M, mh, mw] from `check_proto`, `coefficients`
    [K, M], `boxes` [K, 4] x1, y1, x2, y2 in input-tensor pixels. Polygons are in frame
    pixels (input pixels without a geometry); an empty list where the mask is empty."""
    _, mh, mw = proto.shape
    if geometry is not None and geometry.tensor_size is not None:
        width, height = geometry.tensor_size
    else:
        width, height = mw * PROTO_STRIDE, mh * PROTO_STRIDE
    return [_polygon(proto, coefficients[k], boxes[k], (width, height), threshold, geometry,
                     max_points) for k in range(len(boxes))]


def mask_bitmap(proto: np.ndarray, coefficients: np.ndarray, box: np.ndarray,
                size: tuple[int, int], threshold: float) -> tuple[np.ndarray, int, int]:
    """One detection's mask over its window, in input pixels: (bitmap uint8 0/1, x0, y0)
    where (x0, y0) is the window's top-left input pixel."""
    _, mh, mw = proto.shape
    width, height = size
    sx, sy = mw / width, mh / height
    # Ultralytics' crop_mask keeps cell c where x1 <= c < x2 (boxes scaled to cells)
    c0, c1 = max(0, math.ceil(box[0] * sx)), min(mw, math.ceil(box[2] * sx))
    r0, r1 = max(0, math.ceil(box[1] * sy)), min(mh, math.ceil(box[3] * sy))
    if c1 <= c0 or r1 <= r0:
        return np.zeros((0, 0), np.uint8), 0, 0
    w0, w1, h0, h1 = max(0, c0 - 1), min(mw, c1 + 1), max(0, r0 - 1), min(mh, r1 + 1)
    window = proto[:, r0:r1, c0:c1].reshape(len(proto), -1)  # one copy of the window
    logits = np.zeros((h1 - h0, w1 - w0), np.float32)
    logits[r0 - h0:r1 - h0, c0 - w0:c1 - w0] = (coefficients @ window).reshape(r1 - r0,
                                                                                c1 - c0)
    up_x, up_y = width / mw, height / mh
    size_out = (round((w1 - w0) * up_x), round((h1 - h0) * up_y))
    upsampled = cv2.resize(logits, size_out, interpolation=cv2.INTER_LINEAR)
    return (upsampled > _logit(threshold)).astype(np.uint8), round(w0 * up_x), round(h0 * up_y)


def _polygon(proto: np.ndarray, coefficients: np.ndarray, box: np.ndarray,
             size: tuple[int, int], threshold: float, geometry: Placement | None,
             max_points: int) -> Polygon:
    bitmap, x0, y0 = mask_bitmap(proto, coefficients, box, size, threshold)
    if not bitmap.size or not bitmap.any():
        return []
    contours, _ = cv2.findContours(bitmap, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    outer = max(contours, key=cv2.contourArea)
    outer = simplify(outer, max_points)
    points = outer.reshape(-1, 2).astype(np.float64) + np.array([x0, y0], np.float64)
    if geometry is not None:
        points = to_frame_points(points, geometry)
    return np.round(points, 1).tolist()


def _logit(p: float) -> float:
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return math.log(p / (1 - p))


def rle_encode(polygon: Sequence[Sequence[float]], height: int, width: int) -> dict[str, Any]:
    """A mask polygon as COCO RLE at frame size, the whole frame drawn."""
    return {"size": [height, width], "counts": counts_string_scalar(runs(raster(polygon, height,
                                                                           width)))}


def counts_string_scalar(counts: Sequence[int]) -> str:
    """pycocotools' rleToString (maskApi.c) a count at a time, as edged first wrote it."""
    out = []
    for i, count in enumerate(counts):
        x = int(count) - int(counts[i - 2]) if i > 2 else int(count)
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = not (((c & 0x10) == 0 and x == 0) or ((c & 0x10) != 0 and x == -1))
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)
