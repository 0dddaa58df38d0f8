"""Instance segmentation (YOLO-seg): each kept detection's mask from its coefficients and the
prototypes output, as Ultralytics' `process_mask` makes it (sigmoid(coefficients @ protos),
cropped to the box in prototype cells, bilinearly upsampled to the input, over the threshold),
computed for the box's own window of prototype cells only, never the whole map; then the mask's
outer contour, simplified to a bounded point count, mapped into frame pixels.

The window has one cell of margin around the crop: the upsampled values inside it are then
exactly those of the whole map's upsampling (the cells beyond the crop are zero either way),
so a mask made here is pixel for pixel the one the exporter's own code makes.
"""

from __future__ import annotations

import math

import cv2
import numpy as np

from edged.core.errors import InvalidModel
from edged.tasks.placement import Placement, to_frame_points

Polygon = list[list[float]]
# Ultralytics' protos are a quarter of the input's size (stride 4); used where no geometry
# tells the input size (a tensor sent to `edged infer` without an image).
PROTO_STRIDE = 4


def check_proto(proto: np.ndarray, coefficients: int) -> np.ndarray:
    """The prototypes of one image, [M, H, W] float32; InvalidModel when M is not the head's
    coefficient count."""
    array = np.asarray(proto)
    while array.ndim > 3 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 3 or array.shape[0] != coefficients:
        raise InvalidModel(f"segment: mask prototypes {list(np.shape(proto))} do not match "
                           f"{coefficients} mask coefficients per detection")
    return np.asarray(array, np.float32)


def mask_polygons(proto: np.ndarray, coefficients: np.ndarray, boxes: np.ndarray,
                  geometry: Placement | None, threshold: float, max_points: int
                  ) -> list[Polygon]:
    """One polygon per detection: `proto` [M, mh, mw] from `check_proto`, `coefficients`
    [K, M], `boxes` [K, 4] x1, y1, x2, y2 in input-tensor pixels. Polygons are in frame
    pixels (input pixels without a geometry); an empty list where the mask is empty.

    One pass for the frame: the windows are found for every box at once, each window's
    contour is taken, and every kept point is mapped, rounded and made Python floats in one
    array, so that what runs per object is only what is the object's own (its window's
    logits, upsampling, contour and simplification)."""
    _, mh, mw = proto.shape
    if geometry is not None and geometry.tensor_size is not None:
        width, height = geometry.tensor_size
    else:
        width, height = mw * PROTO_STRIDE, mh * PROTO_STRIDE
    cut = _logit(threshold)
    chosen: list[np.ndarray] = []  # the kept contours, [n, 1, 2] int32 in window pixels
    owners: list[int] = []
    origins: list[tuple[int, int]] = []
    for k, window in enumerate(_windows(boxes, (mw, mh), (width, height))):
        if window is None:
            continue
        bitmap, x0, y0 = _window_bitmap(proto, coefficients[k], window, (width, height), cut)
        contours, _ = cv2.findContours(bitmap, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        if not contours:  # an empty mask
            continue
        outer = contours[0] if len(contours) == 1 else max(contours, key=cv2.contourArea)
        chosen.append(simplify(outer, max_points))
        owners.append(k)
        origins.append((x0, y0))
    polygons: list[Polygon] = [[] for _ in range(len(boxes))]
    if not chosen:
        return polygons
    counts = [len(contour) for contour in chosen]
    points = np.concatenate(chosen).reshape(-1, 2).astype(np.float64)
    points += np.repeat(np.array(origins, np.float64), counts, axis=0)
    if geometry is not None:
        points = to_frame_points(points, geometry)
    rounded = np.round(points, 1)
    # Integral points are written as integers: the same numbers, but JSON writes an int in
    # half the time of a float and a byte or two shorter. They are integral whenever the
    # frame is a whole multiple of the input (640x480, 1280x720, 1920x1080 into 640: the
    # contour's pixels times the scale, less the pad), which is most cameras.
    integral = rounded.astype(np.int64)
    flat = integral.tolist() if np.array_equal(integral, rounded) else rounded.tolist()
    start = 0
    for k, count in zip(owners, counts, strict=True):
        polygons[k] = flat[start:start + count]
        start += count
    return polygons


def mask_bitmap(proto: np.ndarray, coefficients: np.ndarray, box: np.ndarray,
                size: tuple[int, int], threshold: float) -> tuple[np.ndarray, int, int]:
    """One detection's mask over its window, in input pixels: (bitmap uint8 0/1, x0, y0)
    where (x0, y0) is the window's top-left input pixel."""
    _, mh, mw = proto.shape
    window = _windows(np.asarray(box)[None], (mw, mh), size)[0]
    if window is None:
        return np.zeros((0, 0), np.uint8), 0, 0
    return _window_bitmap(proto, coefficients, window, size, _logit(threshold))


Window = tuple[int, int, int, int]  # the box's prototype cells: c0, c1, r0, r1 (ends excluded)


def _windows(boxes: np.ndarray, cells: tuple[int, int], size: tuple[int, int]
             ) -> list[Window | None]:
    """Each box's cells as Ultralytics' crop_mask keeps them (x1 <= c < x2 with the box
    scaled to cells), for every box at once; None where the box keeps no cell."""
    mw, mh = cells
    width, height = size
    if not len(boxes):
        return []
    boxes = np.asarray(boxes)
    # the same float arithmetic as a box at a time (box[i] * (mw / width), then ceil)
    cols = np.ceil(boxes[:, [0, 2]] * (mw / width)).clip(0, mw).astype(np.int64).tolist()
    rows = np.ceil(boxes[:, [1, 3]] * (mh / height)).clip(0, mh).astype(np.int64).tolist()
    return [(c0, c1, r0, r1) if c1 > c0 and r1 > r0 else None
            for (c0, c1), (r0, r1) in zip(cols, rows, strict=True)]


def _window_bitmap(proto: np.ndarray, coefficients: np.ndarray, window: Window,
                   size: tuple[int, int], cut: float) -> tuple[np.ndarray, int, int]:
    """The window's logits (coefficients @ its cells, zero in one cell of margin around the
    crop), upsampled with OpenCV's half-pixel bilinear, over `cut` (the threshold's logit:
    sigmoid(x) > p is x > logit(p), so no exp); uint8 0/1 and its top-left input pixel."""
    m, mh, mw = proto.shape
    width, height = size
    c0, c1, r0, r1 = window
    w0, w1, h0, h1 = max(0, c0 - 1), min(mw, c1 + 1), max(0, r0 - 1), min(mh, r1 + 1)
    cells = proto[:, r0:r1, c0:c1].reshape(m, -1)  # one copy of the window
    logits = np.zeros((h1 - h0, w1 - w0), np.float32)
    logits[r0 - h0:r1 - h0, c0 - w0:c1 - w0] = (coefficients @ cells).reshape(r1 - r0, c1 - c0)
    up_x, up_y = width / mw, height / mh
    upsampled = cv2.resize(logits, (round((w1 - w0) * up_x), round((h1 - h0) * up_y)),
                           interpolation=cv2.INTER_LINEAR)
    return np.greater(upsampled, cut).view(np.uint8), round(w0 * up_x), round(h0 * up_y)


def simplify(contour: np.ndarray, max_points: int) -> np.ndarray:
    """The contour as it is when it has at most `max_points` points, else simplified
    (Douglas-Peucker) with the smallest tolerance, doubling from half a pixel, that fits."""
    if len(contour) <= max_points:
        return contour
    epsilon = 0.5
    simplified = contour
    while len(simplified) > max_points:
        simplified = cv2.approxPolyDP(contour, epsilon, True)
        epsilon *= 2
    return simplified


def _logit(p: float) -> float:
    if p <= 0:
        return -math.inf
    if p >= 1:
        return math.inf
    return math.log(p / (1 - p))

