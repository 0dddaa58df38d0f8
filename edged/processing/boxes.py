"""Box geometry shared by post-processing, tracking and agreement: input-tensor boxes mapped to
frame pixels, intersection over union, and per-class non-maximum suppression."""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from edged.processing.pre import Geometry


def to_frame(boxes: np.ndarray, g: Geometry, normalized: bool) -> np.ndarray:
    """Input-tensor coordinates → frame pixels: undo the padding and the scale, clip."""
    out = boxes.astype(np.float32, copy=True)
    if normalized:
        tensor_w = g.frame_size[0] * g.scale_x + 2 * g.pad_x
        tensor_h = g.frame_size[1] * g.scale_y + 2 * g.pad_y
        out[:, [0, 2]] *= tensor_w
        out[:, [1, 3]] *= tensor_h
    out[:, [0, 2]] = (out[:, [0, 2]] - g.pad_x) / g.scale_x
    out[:, [1, 3]] = (out[:, [1, 3]] - g.pad_y) / g.scale_y
    out[:, [0, 2]] = out[:, [0, 2]].clip(0, g.frame_size[0])
    out[:, [1, 3]] = out[:, [1, 3]].clip(0, g.frame_size[1])
    return out


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[N, 4] and [M, 4] boxes (x1, y1, x2, y2) → [N, M] intersection over union."""
    ix = np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0])
    iy = np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1])
    inter = ix.clip(0) * iy.clip(0)
    area_a = ((a[:, 2] - a[:, 0]).clip(0) * (a[:, 3] - a[:, 1]).clip(0))[:, None]
    area_b = ((b[:, 2] - b[:, 0]).clip(0) * (b[:, 3] - b[:, 1]).clip(0))[None, :]
    union = area_a + area_b - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
        iou_threshold: float) -> list[int]:
    """Greedy non-maximum suppression per class (OpenCV's batched NMS: a box goes when it
    overlaps a better one of its class by more than `iou_threshold`); indices best first."""
    if not len(boxes):
        return []
    rects = np.empty((len(boxes), 4), np.float64)  # OpenCV's boxes are x, y, width, height
    rects[:, :2] = boxes[:, :2]
    rects[:, 2:] = (boxes[:, 2:] - boxes[:, :2]).clip(0)
    # OpenCV keeps scores above its threshold, which must be >= 0: the caller has thresholded
    # already, so 0 with every score lifted above it (a score of 0 only where the threshold is).
    lifted = np.maximum(np.asarray(scores, np.float32), np.finfo(np.float32).tiny)
    batched_nms: Any = cv2.dnn.NMSBoxesBatched  # its stubs take lists; arrays go straight in
    kept = batched_nms(rects, lifted, np.asarray(classes, np.int32), 0.0, float(iou_threshold))
    return np.asarray(kept, np.int64).reshape(-1).tolist()
