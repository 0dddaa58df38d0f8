"""Outputs → results a subscriber can use: top-k classes with labels, detections (score
threshold, per-class NMS, boxes mapped back to frame pixels), or raw tensors (small ones in
full, larger ones summarised: a result message must not carry a 640x640 map)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edged.errors import InvalidModel
from edged.model.config import PostprocessConfig
from edged.processing.pre import Geometry

Results = dict[str, Any]


def load_labels(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise InvalidModel(f"labels file {path}: {exc.strerror}") from exc


class Postprocessor:
    """One model's post-processing, with its labels read once."""

    def __init__(self, cfg: PostprocessConfig | None, model_dir: Path) -> None:
        self.cfg = cfg or PostprocessConfig()
        self.labels = load_labels(model_dir / self.cfg.labels) if self.cfg.labels else []

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None) -> Results:
        if self.cfg.kind == "classify":
            return {"classes": classify(self._first(outputs), self.cfg.top_k, self.labels)}
        if self.cfg.kind == "detect":
            return {"detections": detect(outputs, self.cfg, geometry, self.labels)}
        return {"outputs": raw(outputs, self.cfg.max_values)}

    def _first(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        if self.cfg.output is not None:
            if self.cfg.output not in outputs:
                raise InvalidModel(f"postprocess.output {self.cfg.output!r} is not an output "
                                   f"({', '.join(outputs)})")
            return outputs[self.cfg.output]
        return next(iter(outputs.values()))


def _label(labels: Sequence[str], index: int) -> str:
    return labels[index] if 0 <= index < len(labels) else str(index)


def classify(scores: np.ndarray, top_k: int, labels: Sequence[str]) -> list[dict[str, Any]]:
    """The top-k of one row of class scores (a batch of one is flattened)."""
    row = np.asarray(scores, np.float32).reshape(-1)
    k = min(top_k, row.size)
    best = np.argpartition(-row, k - 1)[:k]
    best = best[np.argsort(-row[best], kind="stable")]
    return [{"index": int(i), "label": _label(labels, int(i)), "score": float(row[i])}
            for i in best]


def detect(outputs: Mapping[str, np.ndarray], cfg: PostprocessConfig,
           geometry: Geometry | None, labels: Sequence[str]) -> list[dict[str, Any]]:
    boxes, scores, classes = (_yolo(outputs, cfg) if cfg.format == "yolo"
                              else _ssd(outputs, cfg))
    keep = scores >= cfg.score_threshold
    boxes, scores, classes = _to_xyxy(boxes[keep], cfg.box), scores[keep], classes[keep]
    if geometry is not None:
        boxes = _to_frame(boxes, geometry, cfg.normalized)
    chosen = nms(boxes, scores, classes, cfg.iou_threshold)[:cfg.max_detections]
    return [{"class": int(classes[i]), "label": _label(labels, int(classes[i])),
             "score": round(float(scores[i]), 5),
             "box": [round(float(v), 2) for v in boxes[i]]} for i in chosen]


def _yolo(outputs: Mapping[str, np.ndarray],
          cfg: PostprocessConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One tensor of rows (box, [objectness], class scores): [1, N, K] or, as YOLOv8 writes
    it, [1, K, N] with K much smaller than N."""
    table = np.asarray(next(iter(outputs.values())), np.float32)
    table = table.reshape(table.shape[-2:]) if table.ndim == 3 else table
    extra = 5 if cfg.objectness else 4
    if table.ndim != 2:
        raise InvalidModel(f"detect/yolo: expected [N, {extra}+classes], got {table.shape}")
    transposed = cfg.transposed
    if transposed is None:  # candidates (thousands) outnumber the columns
        transposed = table.shape[0] < table.shape[1]
    if transposed:
        table = table.T
    if table.shape[1] <= extra:
        raise InvalidModel(f"detect/yolo: expected [N, {extra}+classes], got {table.shape}")
    class_scores = table[:, extra:]
    if cfg.objectness:
        class_scores = class_scores * table[:, 4:5]
    classes = class_scores.argmax(axis=1)
    return table[:, :4], class_scores[np.arange(len(table)), classes], classes


def _ssd(outputs: Mapping[str, np.ndarray],
         cfg: PostprocessConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Boxes [N, 4] and either scores [N, C] or scores [N] plus classes [N]."""
    arrays = [np.asarray(a) for a in outputs.values()]
    arrays = [a.reshape(a.shape[1:]) if a.ndim >= 2 and a.shape[0] == 1 else a for a in arrays]
    boxes = next((a for a in arrays if a.ndim == 2 and a.shape[1] == 4), None)
    if boxes is None:
        raise InvalidModel("detect/ssd: no [N, 4] boxes output")
    rest = [a for a in arrays if a is not boxes]
    matrix = next((a for a in rest if a.ndim == 2 and a.shape[0] == len(boxes)), None)
    if matrix is not None:
        classes = matrix.argmax(axis=1)
        return boxes.astype(np.float32), matrix[np.arange(len(boxes)), classes], classes
    vectors = [a.reshape(-1) for a in rest if a.size == len(boxes)]
    if len(vectors) < 2:
        raise InvalidModel("detect/ssd: expected scores [N, C], or scores [N] and classes [N]")
    scores, classes = vectors[0].astype(np.float32), vectors[1].astype(np.int64)
    return boxes.astype(np.float32), scores, classes


def _to_xyxy(boxes: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "cxcywh":
        cx, cy, w, h = boxes.T
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    if encoding == "yxyx":
        return boxes[:, [1, 0, 3, 2]]
    return boxes


def _to_frame(boxes: np.ndarray, g: Geometry, normalized: bool) -> np.ndarray:
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


def nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
        iou_threshold: float) -> list[int]:
    """Greedy non-maximum suppression per class; indices best first."""
    order = np.argsort(-scores, kind="stable")
    kept: list[int] = []
    areas = (boxes[:, 2] - boxes[:, 0]).clip(0) * (boxes[:, 3] - boxes[:, 1]).clip(0)
    suppressed = np.zeros(len(boxes), bool)
    for position, i in enumerate(order):
        if suppressed[i]:
            continue
        kept.append(int(i))
        rest = order[position + 1:]
        rest = rest[(classes[rest] == classes[i]) & ~suppressed[rest]]
        if not len(rest):
            continue
        x1 = np.maximum(boxes[i, 0], boxes[rest, 0])
        y1 = np.maximum(boxes[i, 1], boxes[rest, 1])
        x2 = np.minimum(boxes[i, 2], boxes[rest, 2])
        y2 = np.minimum(boxes[i, 3], boxes[rest, 3])
        overlap = (x2 - x1).clip(0) * (y2 - y1).clip(0)
        iou = overlap / np.maximum(areas[i] + areas[rest] - overlap, 1e-9)
        suppressed[rest[iou > iou_threshold]] = True
    return kept


def raw(outputs: Mapping[str, np.ndarray], max_values: int) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, array in outputs.items():
        entry: dict[str, Any] = {"shape": list(array.shape), "dtype": str(array.dtype)}
        if array.size <= max_values:
            entry["data"] = np.asarray(array).reshape(-1).tolist()
        elif array.size and array.dtype.kind in "fiub":
            entry.update(min=float(array.min()), max=float(array.max()),
                         mean=float(array.mean(dtype=np.float64)))
        result[name] = entry
    return result
