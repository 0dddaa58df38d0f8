"""Semantic segmentation: a class map ([C, H, W] scores, or [H, W] class ids) read as regions
per class: for each class present (a background class, by name, left out), its share of the
frame and its regions' outer contours as polygons in frame pixels, simplified to a bounded
point count. The map is at the input's resolution or a fraction of it (DeepLab, SegFormer:
a quarter); its cells are scaled to input pixels, then into the frame through the letterbox.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from edged.core.errors import InvalidModel
from edged.tasks.placement import Placement, to_frame_points
from edged.tasks.segment import simplify

BACKGROUND = {"background", "__background__", "bg", "_background_", "???"}
MIN_CELLS = 4  # regions of fewer map cells are noise, not published
MAX_REGIONS = 16  # per class, the largest first


def class_ids(scores: np.ndarray) -> np.ndarray:
    """[H, W] int32 class ids of one image's map: argmax over [C, H, W] scores (C = 1: a
    probability, class 1 where it reaches 0.5), or the ids of an integer map ([H, W], with
    leading dims of 1)."""
    array = np.asarray(scores)
    integer = array.dtype.kind in "iu"
    while array.ndim > (2 if integer else 3) and array.shape[0] == 1:
        array = array[0]
    if array.ndim == 2:
        return array.astype(np.int32)
    if array.ndim != 3:
        raise InvalidModel(f"semantic: expected a class map [C, H, W] or [H, W], got "
                           f"{list(np.shape(scores))}")
    if array.shape[0] == 1:
        return (array[0] >= 0.5).astype(np.int32)
    return np.argmax(array, axis=0).astype(np.int32)


def segments(ids: np.ndarray, labels: Sequence[str], placement: Placement | None,
             max_points: int) -> list[dict[str, Any]]:
    """Per class present (background left out), best covered first: `class`, `label`, `area`
    (its share of the frame, 0..1) and `polygons` ([[x, y], ...] each, frame pixels)."""
    if placement is not None and placement.tensor_size is not None \
            and placement.tensor_size != ids.shape[::-1]:
        # a map at a fraction of the input (DeepLab's, SegFormer's quarter): its cells drawn
        # at the input's size, so that regions keep their outer edge, not their cells' centres
        ids = cv2.resize(ids.astype(np.float32), placement.tensor_size,
                         interpolation=cv2.INTER_NEAREST).astype(np.int32)
    scale_x = scale_y = 1.0
    seen = _frame_cells(ids.shape, placement, scale_x, scale_y)
    total = max(int(seen.sum()), 1)
    found = []
    for c in np.unique(ids[seen]).tolist():
        label = labels[c] if 0 <= c < len(labels) else str(c)
        if label.strip().lower() in BACKGROUND:
            continue
        bitmap = ((ids == c) & seen).astype(np.uint8)
        area = int(bitmap.sum())
        contours, _ = cv2.findContours(bitmap, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        regions = sorted((r for r in contours if cv2.contourArea(r) >= MIN_CELLS or
                          len(r) >= MIN_CELLS), key=cv2.contourArea, reverse=True)
        polygons = []
        for region in regions[:MAX_REGIONS]:
            points = simplify(region, max_points).reshape(-1, 2).astype(np.float64)
            points = (points + 0.5) * (scale_x, scale_y)  # a cell's centre, in input pixels
            if placement is not None:
                points = to_frame_points(points, placement)
            polygons.append(np.round(points, 1).tolist())
        found.append({"class": c, "label": label, "area": round(area / total, 5),
                      "polygons": polygons})
    found.sort(key=lambda s: -s["area"])
    return found


def _frame_cells(shape: tuple[int, int], placement: Placement | None, scale_x: float,
                 scale_y: float) -> np.ndarray:
    """The map cells that show the frame (not the letterbox's bars)."""
    seen = np.ones(shape, bool)
    if placement is None:
        return seen
    x0 = placement.pad_x / scale_x
    y0 = placement.pad_y / scale_y
    x1 = (placement.pad_x + placement.frame_size[0] * placement.scale_x) / scale_x
    y1 = (placement.pad_y + placement.frame_size[1] * placement.scale_y) / scale_y
    cols = np.arange(shape[1]) + 0.5
    rows = np.arange(shape[0]) + 0.5
    seen &= ((cols >= x0) & (cols <= x1))[None, :]
    seen &= ((rows >= y0) & (rows <= y1))[:, None]
    return seen
