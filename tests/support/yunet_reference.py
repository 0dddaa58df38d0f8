"""YuNet's published decoding, written out from OpenCV's `FaceDetectorYNImpl::postProcess`
(modules/objdetect/src/face_detect.cpp, YuNet 2023): per stride 8, 16, 32 over the input
padded up to a multiple of 32, each cell's score sqrt(clamp(cls) * clamp(obj)); its box's
centre (col + bbox[0], row + bbox[1]) * stride and size exp(bbox[2:4]) * stride; its points
(kps + (col, row)) * stride; scores below the threshold dropped, then `cv2.dnn.NMSBoxes`
over (x, y, w, h) boxes (0.3 by default). The detector takes the image at the input's size:
here it is placed top-left, ratio kept, as edged feeds it, and mapped back by the scale."""

from __future__ import annotations

import cv2
import numpy as np
import onnxruntime as ort


def detect(session: ort.InferenceSession, image: np.ndarray, threshold: float = 0.9,
           nms: float = 0.3) -> tuple[np.ndarray, np.ndarray]:
    """(faces [K, 5] x1, y1, x2, y2, score; points [K, 5, 2]) in image pixels."""
    spec = session.get_inputs()[0]
    in_h, in_w = spec.shape[2], spec.shape[3]
    scale = min(in_w / image.shape[1], in_h / image.shape[0])
    new_w, new_h = int(image.shape[1] * scale), int(image.shape[0] * scale)
    canvas = np.zeros((in_h, in_w, 3), np.uint8)
    canvas[:new_h, :new_w] = cv2.resize(image, (new_w, new_h))
    blob = cv2.dnn.blobFromImage(canvas)  # BGR, as it is
    outs = dict(zip([o.name for o in session.get_outputs()],
                    session.run(None, {spec.name: blob}), strict=True))
    pad_w, pad_h = (in_w - 1) // 32 * 32 + 32, (in_h - 1) // 32 * 32 + 32
    rects, scores, marks = [], [], []
    for stride in (8, 16, 32):
        cls, obj = outs[f"cls_{stride}"].reshape(-1), outs[f"obj_{stride}"].reshape(-1)
        bbox, kps = outs[f"bbox_{stride}"].reshape(-1, 4), outs[f"kps_{stride}"].reshape(-1, 10)
        cols, rows = pad_w // stride, pad_h // stride
        for r in range(rows):
            for c in range(cols):
                idx = r * cols + c
                score = float(np.sqrt(np.clip(cls[idx], 0, 1) * np.clip(obj[idx], 0, 1)))
                if score < threshold:
                    continue
                cx, cy = (c + bbox[idx, 0]) * stride, (r + bbox[idx, 1]) * stride
                w, h = np.exp(bbox[idx, 2]) * stride, np.exp(bbox[idx, 3]) * stride
                rects.append([cx - w / 2, cy - h / 2, w, h])
                scores.append(score)
                marks.append([((kps[idx, 2 * n] + c) * stride, (kps[idx, 2 * n + 1] + r) * stride)
                              for n in range(5)])
    keep = cv2.dnn.NMSBoxes(rects, scores, threshold, nms) if rects else []
    keep = np.array(keep, int).reshape(-1)
    boxes = np.array(rects, np.float32).reshape(-1, 4)[keep]
    boxes[:, 2:] += boxes[:, :2]
    return (np.hstack([boxes / scale, np.array(scores, np.float32)[keep, None]]),
            np.array(marks, np.float32).reshape(-1, 5, 2)[keep] / scale)
