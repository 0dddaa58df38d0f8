"""A numpy port of Ultralytics' published mask path (ultralytics/utils/ops.py, 8.3):
`process_mask(protos, masks_in, bboxes, shape, upsample=True)` (coefficients @ prototypes,
`crop_mask` to the box scaled to prototype cells, bilinear upsampling of the whole map to the
input with `align_corners=False`, `> 0`), `masks2segments` (the external contours) and
`scale_coords` (into the original image). Written from the published code, line by line, with
nothing of edged: the reference edged's masks are held to (no wheel ships a trained YOLO-seg
export, and torch is not installed here)."""

from __future__ import annotations

import cv2
import numpy as np


def crop_mask(masks: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    _, h, w = masks.shape
    x1, y1, x2, y2 = (boxes[:, i][:, None, None] for i in range(4))
    r = np.arange(w)[None, None, :]
    c = np.arange(h)[None, :, None]
    return masks * ((r >= x1) * (r < x2) * (c >= y1) * (c < y2))


def _interpolate_axis(values: np.ndarray, size: int, axis: int) -> np.ndarray:
    """F.interpolate(mode="bilinear", align_corners=False) along one axis."""
    n = values.shape[axis]
    src = (np.arange(size) + 0.5) * (n / size) - 0.5
    src = np.maximum(src, 0)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    lam = (src - lo).astype(np.float32)
    shape = [1] * values.ndim
    shape[axis] = size
    lam = lam.reshape(shape)
    return np.take(values, lo, axis=axis) * (1 - lam) + np.take(values, hi, axis=axis) * lam


def process_mask(protos: np.ndarray, masks_in: np.ndarray, bboxes: np.ndarray,
                 shape: tuple[int, int]) -> np.ndarray:
    """[N, ih, iw] bool masks in input pixels; `shape` is (ih, iw)."""
    c, mh, mw = protos.shape
    ih, iw = shape
    masks = (masks_in @ protos.reshape(c, -1)).reshape(-1, mh, mw)
    down = bboxes.astype(np.float64).copy()
    down[:, 0] *= mw / iw
    down[:, 2] *= mw / iw
    down[:, 3] *= mh / ih
    down[:, 1] *= mh / ih
    masks = crop_mask(masks, down)
    masks = _interpolate_axis(_interpolate_axis(masks, ih, 1), iw, 2)
    return masks > 0.0


def masks2segments(masks: np.ndarray) -> list[np.ndarray]:
    """Each mask's largest external contour ([K, 2] float32), Ultralytics' "largest"."""
    segments = []
    for x in masks.astype(np.uint8):
        c = cv2.findContours(x, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0]
        if c:
            c = np.array(c[np.array([len(x) for x in c]).argmax()]).reshape(-1, 2)
        else:
            c = np.zeros((0, 2))
        segments.append(c.astype(np.float32))
    return segments


def scale_coords(img1_shape: tuple[int, int], coords: np.ndarray,
                 img0_shape: tuple[int, int]) -> np.ndarray:
    """Input-pixel (x, y) → original-image pixels: (h, w) shapes, as Ultralytics maps them."""
    gain = min(img1_shape[0] / img0_shape[0], img1_shape[1] / img0_shape[1])
    pad = (round((img1_shape[1] - img0_shape[1] * gain) / 2 - 0.1),
           round((img1_shape[0] - img0_shape[0] * gain) / 2 - 0.1))
    out = coords.astype(np.float64).copy()
    out[..., 0] -= pad[0]
    out[..., 1] -= pad[1]
    out[..., 0] /= gain
    out[..., 1] /= gain
    out[..., 0] = out[..., 0].clip(0, img0_shape[1])
    out[..., 1] = out[..., 1].clip(0, img0_shape[0])
    return out


def raster(polygon: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """A polygon filled on a (width, height) canvas, for IoU."""
    canvas = np.zeros((size[1], size[0]), np.uint8)
    if len(polygon):
        cv2.fillPoly(canvas, [np.round(np.asarray(polygon)).astype(np.int32).reshape(-1, 1, 2)],
                     1)
    return canvas.astype(bool)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0
