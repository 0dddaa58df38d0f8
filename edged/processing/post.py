"""Outputs → results a subscriber can use: top-k classes with labels, detections (the head's
candidates decoded by `decode.py`, per-class NMS where the head needs it, boxes mapped back to
frame pixels; a segment or pose task's masks and keypoints as columns beside them, decoded by
`edged.tasks` for the kept detections only), or raw tensors (small ones in full, larger ones
summarised: a result message must not carry a 640x640 map)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edged.core.errors import InvalidModel
from edged.model.config import PostprocessConfig
from edged.model.heads import Head, choose_head
from edged.model.tensor import TensorSpec
from edged.processing.boxes import nms, to_frame
from edged.processing.decode import decode, extra_values
from edged.processing.detections import Detections
from edged.processing.pre import Geometry
from edged.tasks.embed import summary as embedding_summary
from edged.tasks.keypoints import keypoints, point_names
from edged.tasks.recognise import layout
from edged.tasks.segment import check_proto, mask_polygons
from edged.tasks.semantic import class_ids, segments
from edged.tasks.text import ctc_decode

Results = dict[str, Any]


def load_labels(path: Path) -> list[str]:
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise InvalidModel(f"labels file {path}: {exc.strerror}") from exc


class Postprocessor:
    """One model's post-processing, with its labels read once: `names` (from model.yaml or
    the ONNX metadata), else the labels file. A detector's `head` comes with its version; a
    Postprocessor made without one tells it from the first outputs it sees."""

    def __init__(self, cfg: PostprocessConfig | None, model_dir: Path,
                 head: Head | None = None) -> None:
        self.cfg = cfg or PostprocessConfig()
        if self.cfg.names is not None:
            self.labels = list(self.cfg.names)
        else:
            self.labels = load_labels(model_dir / self.cfg.labels) if self.cfg.labels else []
        self.head = head

    def __call__(self, outputs: Mapping[str, np.ndarray], geometry: Geometry | None) -> Results:
        if self.cfg.kind == "classify":
            return {"classes": classify(self._first(outputs), self.cfg.top_k, self.labels)}
        if self.cfg.kind == "semantic":
            return {"segments": segments(class_ids(self._first(outputs)), self.labels,
                                         geometry, self.cfg.mask_points)}
        if self.cfg.kind == "text":
            text, score = ctc_decode(self._first(outputs), self.labels)[0]
            return {"text": {"text": text, "score": round(score, 5)}}
        if self.cfg.kind == "embed":  # the vector stays on the device (galleries)
            return {"embedding": embedding_summary(self._first(outputs))}
        if self.cfg.kind in ("detect", "segment", "pose"):
            if self.head is None:
                self.head = head_of(outputs, self.cfg)
            return {"detections": detect(outputs, self.cfg, geometry, self.labels, self.head)}
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


def head_of(outputs: Mapping[str, np.ndarray], cfg: PostprocessConfig) -> Head:
    """The head told from the arrays' shapes and `cfg` (a segment or pose task's table with
    its extra columns), for post-processing made without the model's version."""
    specs = specs_of(outputs)
    if cfg.kind == "segment" or (cfg.kind == "pose" and len(specs) == 1):
        parts = layout(cfg.kind, specs, False, proto=cfg.proto, kpt_shape=cfg.kpt_shape)
        table = tuple(spec for spec in specs if spec.name == parts.table)
        return choose_head(table, None, cfg, extra=parts.extra)
    return choose_head(specs, None, cfg)


def detect(outputs: Mapping[str, np.ndarray], cfg: PostprocessConfig,
           geometry: Geometry | None, labels: Sequence[str],
           head: Head | None = None) -> Detections:
    """Detections of one frame: the head's candidates above the threshold, mapped into the
    frame, suppressed per class (NMS-free heads skip that), best first; with a segment or
    pose task's masks or keypoints. Without a `head` (as the model's version carries one) it
    is told from the arrays' shapes and `cfg`."""
    head = head or head_of(outputs, cfg)
    found = decode(head, outputs, cfg.score_threshold, cfg.pre_nms_top_k,
                   geometry.tensor_size if geometry is not None else None)
    boxes, scores, classes = found.boxes, found.scores, found.classes
    index, tensor_boxes, points = found.index, found.boxes, found.points
    if geometry is not None:
        boxes = to_frame(boxes, geometry, found.normalized)
    seen = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
    if not seen.all():  # boxes wholly in the letterbox bars (or inside out) show nothing
        boxes, scores, classes = boxes[seen], scores[seen], classes[seen]
        tensor_boxes = tensor_boxes[seen]
        index = index[seen] if index is not None else None
        points = points[seen] if points is not None else None
    if head.nms:
        chosen = nms(boxes, scores, classes, cfg.iou_threshold)[:cfg.max_detections]
    else:
        chosen = np.argsort(-scores, kind="stable")[:cfg.max_detections].tolist()
    # Python floats once for the lot: a numpy scalar at a time costs more than the NMS. Rounded
    # as published, so that every stage sees what subscribers see.
    found_classes = classes[chosen].tolist()
    base = _label_base(head, labels)
    detections = Detections.of([[round(v, 2) for v in box] for box in boxes[chosen].tolist()],
                               [round(score, 5) for score in scores[chosen].tolist()],
                               found_classes, [_label(labels, c - base) for c in found_classes])
    if points is not None and cfg.kind == "pose":  # a landmark head's points
        names = point_names(points.shape[1] // 2, cfg.keypoint_names)
        detections.keypoints = list(keypoints(points[chosen], (len(names), 2), names,
                                              geometry))
    elif head.extra and index is not None and cfg.kind in ("segment", "pose"):
        values = extra_values(head, outputs, index[chosen])
        if cfg.kind == "segment":
            proto = check_proto(_proto(outputs, cfg, head), head.extra)
            detections.masks = list(mask_polygons(proto, values, tensor_boxes[chosen], geometry,
                                                  cfg.mask_threshold, cfg.mask_points))
        else:
            shape = cfg.kpt_shape or []
            names = point_names(shape[0], cfg.keypoint_names) if shape else []
            detections.keypoints = list(keypoints(values, shape, names, geometry))
    return detections


def _proto(outputs: Mapping[str, np.ndarray], cfg: PostprocessConfig, head: Head) -> np.ndarray:
    """The segment task's prototypes: the output `cfg.proto` names, else the one beside the
    table."""
    if cfg.proto is not None:
        if cfg.proto not in outputs:
            raise InvalidModel(f"segment: output {cfg.proto!r} is missing (got "
                               f"{', '.join(outputs)})")
        return outputs[cfg.proto]
    rest = [a for name, a in outputs.items() if name != head.table]
    if len(rest) != 1:
        raise InvalidModel(f"segment: expected one prototypes output beside {head.table}, got "
                           f"{', '.join(outputs)}")
    return rest[0]


BACKGROUND = {"???", "background", "__background__", "bg"}


def _label_base(head: Head, labels: Sequence[str]) -> int:
    """Which class id the first label names. TF's ids count from 1 (a label map's first item),
    so its first label names id 1, unless the file gives id 0 a line of its own (`???`,
    `background`), as TF Lite's COCO labels do; the class id published stays the model's."""
    if head.class_base and labels and labels[0].strip().lower() not in BACKGROUND:
        return head.class_base
    return 0


def specs_of(outputs: Mapping[str, np.ndarray]) -> tuple[TensorSpec, ...]:
    """Arrays as the tensor specs a head is chosen from."""
    return tuple(TensorSpec(name, np.asarray(a).dtype, tuple(np.shape(a)))
                 for name, a in outputs.items())


def published(results: Mapping[str, Any]) -> Results:
    """A frame's results as they are published: detections as their rows."""
    found = results.get("detections")
    return {"detections": found.rows()} if isinstance(found, Detections) else dict(results)


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
