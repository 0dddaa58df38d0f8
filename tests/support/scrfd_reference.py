"""SCRFD's published decoding, written out from InsightFace's `model_zoo/scrfd.py` (its
`SCRFD.detect` and `forward`, `distance2bbox`, `distance2kps`, `nms`) with numpy and OpenCV,
to hold edged's `scrfd` head to: the image resized (ratio kept, int() sizes) into the input's
top-left corner over zeros, `cv2.dnn.blobFromImage(1/128, mean 127.5, swapRB)`, per stride the
anchor centres (cell corner x stride, repeated per anchor), boxes as distances, points as
offsets, both times the stride, scores >= threshold, everything divided by the resize scale,
NMS with the legacy +1 areas at 0.4."""

from __future__ import annotations

import cv2
import numpy as np
import onnxruntime as ort


def detect(session: ort.InferenceSession, image: np.ndarray, threshold: float = 0.5,
           strides: tuple[int, ...] = (8, 16, 32), anchors: int = 2
           ) -> tuple[np.ndarray, np.ndarray]:
    """(detections [K, 5] x1, y1, x2, y2, score; points [K, 5, 2]) in image pixels."""
    spec = session.get_inputs()[0]
    in_h, in_w = spec.shape[2], spec.shape[3]
    ratio = image.shape[0] / image.shape[1]
    if ratio > in_h / in_w:
        new_h = in_h
        new_w = int(new_h / ratio)
    else:
        new_w = in_w
        new_h = int(new_w * ratio)
    scale = new_h / image.shape[0]
    canvas = np.zeros((in_h, in_w, 3), np.uint8)
    canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h))
    blob = cv2.dnn.blobFromImage(canvas, 1.0 / 128, (in_w, in_h), (127.5, 127.5, 127.5),
                                 swapRB=True)
    outs = session.run(None, {spec.name: blob})
    batched = outs[0].ndim == 3
    levels = len(strides)
    found_scores, found_boxes, found_points = [], [], []
    for k, stride in enumerate(strides):
        scores, boxes, points = (outs[k + levels * part] for part in range(3))
        if batched:
            scores, boxes, points = scores[0], boxes[0], points[0]
        rows, cols = in_h // stride, in_w // stride
        centres = np.stack(np.mgrid[:rows, :cols][::-1], axis=-1).astype(np.float32)
        centres = (centres * stride).reshape(-1, 2)
        centres = np.stack([centres] * anchors, axis=1).reshape(-1, 2)
        chosen = np.where(scores >= threshold)[0]
        distance, offset = boxes * stride, points * stride
        box = np.stack([centres[:, 0] - distance[:, 0], centres[:, 1] - distance[:, 1],
                        centres[:, 0] + distance[:, 2], centres[:, 1] + distance[:, 3]], -1)
        point = np.stack([centres[:, i % 2] + offset[:, i] if i % 2 == 0 else
                          centres[:, 1] + offset[:, i] for i in range(offset.shape[1])], -1)
        found_scores.append(scores[chosen])
        found_boxes.append(box[chosen])
        found_points.append(point.reshape(len(point), -1, 2)[chosen])
    scores = np.vstack(found_scores)
    order = scores.ravel().argsort()[::-1]
    dets = np.hstack((np.vstack(found_boxes) / scale, scores)).astype(np.float32)[order]
    points = (np.vstack(found_points) / scale)[order]
    keep = _nms(dets, 0.4)
    return dets[keep], points[keep]


def _nms(dets: np.ndarray, threshold: float) -> list[int]:
    x1, y1, x2, y2, scores = dets.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = scores.argsort()[::-1]
    keep = []
    while order.size:
        i = order[0]
        keep.append(int(i))
        w = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]])
                       + 1)
        h = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]])
                       + 1)
        overlap = w * h / (areas[i] + areas[order[1:]] - w * h)
        order = order[np.where(overlap <= threshold)[0] + 1]
    return keep
