"""Which detection head a model has, told from its output shapes, its ONNX metadata and what
model.yaml says, once, when the version is read: YOLOv5 rows with objectness, YOLOv8's
transposed table, end-to-end rows (x1, y1, x2, y2, score, class), SSD's boxes plus scores, and
DETR's queries. A head that fits none, or more than one, is an InvalidModel at load naming the
shapes and the `postprocess:` keys that would settle it: never boxes read the wrong way.

The evidence, strongest first: `postprocess.format` and the keys that pin a layout
(`objectness`, `transposed`); the metadata (`end2end`, an RT-DETR description, the class count
from `names`); the anchor grid of the input size (YOLOv8 has one candidate per cell of the
stride 8/16/32 maps, YOLOv5 three); the output names and the ops that compute them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from edged.core.errors import InvalidModel
from edged.model.config import PostprocessConfig
from edged.model.metadata import ExportMetadata
from edged.model.tensor import TensorSpec

Format = Literal["yolov5", "yolov8", "end2end", "ssd", "detr"]
Box = Literal["cxcywh", "xyxy", "yxyx"]
MAX_QUERIES = 1000  # DETR-style heads have 100-900 queries; anchor grids have thousands
MAX_CLASSES = 2000
_STRIDES = ((8, 16, 32), (8, 16, 32, 64))  # P5 and P6 models
_PROBABILITIES = {"Sigmoid", "Softmax"}


@dataclass(frozen=True)
class Head:
    """How to read one model's detection outputs. Output names say where each part is; `table`
    for the one-tensor heads, `boxes`/`scores`/`classes`/`count` for SSD and two-output DETR."""

    format: Format
    reason: str  # one line: why this head
    table: str | None = None
    transposed: bool = False  # the table is [4+C, N] (YOLOv8)
    objectness: bool = False  # YOLOv5: column 4 scales the class scores
    boxes: str | None = None
    scores: str | None = None
    classes: str | None = None
    count: str | None = None  # TF-style num_detections: only the first rows are real
    box: Box = "cxcywh"
    normalized: bool | None = False  # None: told per frame by the boxes' range
    background: bool = False  # SSD: scores column 0 is the background class
    activation: Literal["none", "sigmoid", "auto"] = "none"  # auto: sigmoid when outside 0..1
    nms: bool = True  # end-to-end and DETR heads are NMS-free

    def describe(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class _Evidence:
    cfg: PostprocessConfig
    said: frozenset[str]
    metadata: ExportMetadata
    classes: int | None  # from postprocess.names or the metadata's names
    anchors: frozenset[int]  # YOLOv8 candidates per image for the input size; empty: unknown
    producers: Mapping[str, str]
    batched: bool

    def told(self, key: str) -> bool:
        return key in self.said


def choose_head(outputs: Sequence[TensorSpec], metadata: ExportMetadata | None,
                cfg: PostprocessConfig, *, said: Collection[str] | None = None,
                input_size: tuple[int, int] | None = None,
                producers: Mapping[str, str] | None = None, batched: bool = False) -> Head:
    """The head of a detector with these outputs (batch dim included when `batched`).

    `said` names the postprocess keys model.yaml gave; None counts every key whose value is
    not the default (a config built in code). `input_size` is the tensor's (width, height)
    when known: it gives the anchor grid."""
    metadata = metadata or ExportMetadata()
    names = cfg.names if cfg.names is not None else metadata.names
    evidence = _Evidence(cfg, frozenset(_non_default(cfg) if said is None else said), metadata,
                         len(names) if names else None, _anchor_counts(input_size),
                         producers or {}, batched)
    if not outputs:
        raise InvalidModel("postprocess: the model has no outputs to read detections from")
    if cfg.output is not None:
        chosen = [o for o in outputs if o.name == cfg.output]
        if not chosen:
            raise InvalidModel(f"postprocess.output {cfg.output!r} is not an output "
                               f"({', '.join(o.name for o in outputs)})")
        return _table_head(chosen[0], evidence)
    if cfg.format == "ssd" or (cfg.format in ("auto", "detr") and len(outputs) > 1):
        head = _box_set_head(outputs, evidence)
        if head is not None:
            return head
    return _table_head(outputs[0], evidence)


def _non_default(cfg: PostprocessConfig) -> set[str]:
    return {f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) != f.default}


def _anchor_counts(size: tuple[int, int] | None) -> frozenset[int]:
    if size is None or min(size) <= 0:
        return frozenset()
    width, height = size
    return frozenset(sum(math.ceil(height / s) * math.ceil(width / s) for s in strides)
                     for strides in _STRIDES)


def _dims(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    """The dims of one image's part: without the batch dim (or a leading 1)."""
    shape = spec.shape
    return shape[1:] if shape and (batched or (len(shape) >= 2 and shape[0] == 1)) else shape


def _shapes(outputs: Sequence[TensorSpec]) -> str:
    return ", ".join(f"{o.name} {list(o.shape)}" for o in outputs)


# -- one table: YOLOv5, YOLOv8, end-to-end, one-output DETR -----------------------------------

@dataclass(frozen=True)
class _Fit:
    format: Format
    transposed: bool
    why: str
    # 2: confirmed (anchor grid, metadata); 1: the class count or the shape's own mark (a
    # [K <= 1000, 6] table is end-to-end's); 0: a guess (more rows than columns)
    strength: int


def _table_head(spec: TensorSpec, ev: _Evidence) -> Head:
    dims = _dims(spec, ev.batched)
    if len(dims) != 2 or min(dims) == 0:
        raise InvalidModel(f"postprocess: output {spec.name} {list(spec.shape)} is not one "
                           f"table of candidates, so it fits no detection head; "
                           f"{_fix_for_none()}")
    rows, cols = dims
    if ev.cfg.format == "yolo" or (ev.cfg.format in ("auto", "yolov5", "yolov8")
                                   and ev.told("transposed")):
        return _said_yolo(spec, rows, cols, ev)
    fits = _filter(_fits(rows, cols, ev), ev)
    if fits:  # the best-supported layouts; a guess never outvotes evidence
        best = max(f.strength for f in fits)
        fits = [f for f in fits if f.strength == best]
    if {f.format for f in fits} == {"end2end", "detr"}:  # [K, 6]: or a 2-class DETR
        fits = [replace(f, why=f.why + " (a 2-class DETR would need postprocess.format: "
                        "detr)") for f in fits if f.format == "end2end"]
    if len(fits) == 1:
        return _table(spec, fits[0], ev)
    context = _context(ev)
    if not fits:
        raise InvalidModel(f"postprocess: output {spec.name} {list(spec.shape)} fits no "
                           f"detection head{context}; {_fix_for_none()}")
    listed = "; ".join(f"{f.format} ({f.why})" for f in fits)
    raise InvalidModel(f"postprocess: output {spec.name} {list(spec.shape)} fits more than one "
                       f"head: {listed}{context}; set {_settle(fits)}")


def _fits(rows: int, cols: int, ev: _Evidence) -> list[_Fit]:
    """Every layout the table's dims allow, with the evidence for it."""
    c = ev.classes
    v8, v5 = ev.anchors, frozenset(3 * n for n in ev.anchors)

    def width(n: int, extra: int) -> str | None:  # a class dim is never dynamic
        if n <= extra or (c is not None and n != extra + c):
            return None
        return f"{n} = {extra} + {n - extra} classes" + (" (names)" if c is not None else "")

    def anchors(n: int, other: int, grid: frozenset[int], per_cell: str) -> str | None:
        if grid:
            return f"{n} anchors = {per_cell} of the input's grid" if n in grid or n == -1 \
                else None
        return "more rows than columns (no anchor grid known)" if n == -1 or n > other else None

    fits: list[_Fit] = []
    if cols == 6 and rows != 0:
        mark = 2 if ev.metadata.end2end else 1 if 0 < rows <= MAX_QUERIES else 0
        fits.append(_Fit("end2end", False, f"[{rows}, 6]: x1, y1, x2, y2, score, class", mark))
    layouts: tuple[tuple[Format, bool, int, frozenset[int], str], ...] = (
        ("yolov8", True, 4, v8, "one per cell"), ("yolov8", False, 4, v8, "one per cell"),
        ("yolov5", False, 5, v5, "three per cell"), ("yolov5", True, 5, v5, "three per cell"))
    for fmt, transposed, extra, grid, per_cell in layouts:
        if fmt == "yolov5" and transposed and not (ev.cfg.format == "yolov5"
                                                   or ev.told("objectness")):
            continue  # YOLOv5 exports write rows; its transposed form only when said
        n, k = (cols, rows) if transposed else (rows, cols)
        why_width, why_anchors = width(k, extra), anchors(n, k, grid, per_cell)
        if why_width and why_anchors:
            shape = f"[{extra}+C, N]" if transposed else f"[N, {extra}+C]"
            mark = 2 if n in grid else 1 if c is not None else 0
            fits.append(_Fit(fmt, transposed, f"{shape}: {why_width}, {why_anchors}", mark))
    why_width = width(cols, 4)
    if why_width and 0 < rows <= MAX_QUERIES and cols - 4 <= MAX_CLASSES \
            and rows not in v8 | v5:
        mark = 2 if ev.metadata.rtdetr else 1 if c is not None or v8 else 0
        fits.append(_Fit("detr", False, f"[Q, 4+C]: {rows} queries, {why_width}", mark))
    return fits


def _filter(fits: list[_Fit], ev: _Evidence) -> list[_Fit]:
    """Keep what model.yaml and the metadata allow."""
    fmt = ev.cfg.format
    if fmt in ("yolov5", "yolov8", "end2end", "detr"):
        fits = [f for f in fits if f.format == fmt]
    if ev.told("objectness"):
        keep = ev.cfg.objectness
        fits = [f for f in fits if (f.format == "yolov5") == keep]
    if ev.metadata.end2end is not None:
        fits = [f for f in fits if (f.format == "end2end") == ev.metadata.end2end]
    if ev.metadata.rtdetr:
        fits = [f for f in fits if f.format == "detr"]
    return fits


def _said_yolo(spec: TensorSpec, rows: int, cols: int, ev: _Evidence) -> Head:
    """`format: yolo` (or `transposed` given): the layout model.yaml names, as it names it."""
    cfg = ev.cfg
    v5 = cfg.format == "yolov5" or (cfg.format != "yolov8" and cfg.objectness)
    extra = 5 if v5 else 4
    transposed = cfg.transposed if cfg.transposed is not None else rows < cols
    width = rows if transposed else cols
    if width <= extra:
        raise InvalidModel(f"detect/yolo: expected [N, {extra}+classes], got {spec.name} "
                           f"{list(spec.shape)}")
    said = "transposed and objectness" if cfg.transposed is not None else "objectness; " \
        "transposed guessed: fewer rows than columns"
    fmt: Format = "yolov5" if v5 else "yolov8"
    return Head(fmt, f"{fmt}: {spec.name} {list(spec.shape)}, postprocess.format: "
                f"{cfg.format} with {said}", table=spec.name, transposed=transposed,
                objectness=v5, box=cfg.box, normalized=cfg.normalized)


def _table(spec: TensorSpec, fit: _Fit, ev: _Evidence) -> Head:
    cfg = ev.cfg
    told = [k for k in ("format", "objectness") if ev.told(k)]
    hints = [f"postprocess.{k}" for k in told]
    if ev.metadata.end2end is not None:
        hints.append(f"metadata end2end {ev.metadata.end2end}")
    if ev.metadata.rtdetr:
        hints.append("metadata: an RT-DETR export")
    reason = f"{fit.format}: {spec.name} {list(spec.shape)} is {fit.why}" + (
        f"; {', '.join(hints)}" if hints else "")
    if fit.format in ("yolov5", "yolov8"):
        return Head(fit.format, reason, table=spec.name, transposed=fit.transposed,
                    objectness=fit.format == "yolov5", box=cfg.box, normalized=cfg.normalized)
    if fit.format == "end2end":
        return Head("end2end", reason, table=spec.name, box=_box(ev, "xyxy"),
                    normalized=cfg.normalized if ev.told("normalized") else False, nms=False)
    return Head("detr", reason, table=spec.name, box=_box(ev, "cxcywh"),
                normalized=cfg.normalized if ev.told("normalized") else True,
                activation=_activation(spec.name, ev), nms=False)


def _box(ev: _Evidence, native: Box) -> Box:
    return ev.cfg.box if ev.told("box") else native


def _activation(name: str, ev: _Evidence) -> Literal["none", "sigmoid", "auto"]:
    if ev.producers.get(name) in _PROBABILITIES:
        return "none"
    return "sigmoid" if "logit" in name.lower() else "auto"


def _context(ev: _Evidence) -> str:
    missing = []
    if ev.classes is None:
        missing.append("no class count (postprocess.names or the metadata's names would give "
                       "it)")
    if not ev.anchors:
        missing.append("no anchor grid (the input size is dynamic: preprocess.resize would "
                       "give it)")
    return f" [{'; '.join(missing)}]" if missing else ""


def _settle(fits: Sequence[_Fit]) -> str:
    formats = list(dict.fromkeys(f.format for f in fits))
    if len(formats) == 1 and formats[0] in ("yolov5", "yolov8"):
        width = "5+C" if formats[0] == "yolov5" else "4+C"
        return (f"postprocess.format: {formats[0]} with transposed: true ([{width}, N]) or "
                f"false ([N, {width}])")
    text = "postprocess.format: " + " or ".join(formats)
    if "yolov5" in formats:
        text += " (yolov5 with objectness: true)"
    return text


def _fix_for_none() -> str:
    return ("set postprocess.format (yolov5 [N, 5+C], yolov8 [4+C, N], end2end [K, 6], ssd "
            "boxes [N, 4] + scores, detr [Q, 4+C]) if the outputs are one of these, or "
            "postprocess.kind: raw")


# -- boxes beside scores: SSD and two-output DETR ----------------------------------------------

def _box_set_head(outputs: Sequence[TensorSpec], ev: _Evidence) -> Head | None:
    dims = {o.name: _dims(o, ev.batched) for o in outputs}
    boxes = [o for o in outputs if len(dims[o.name]) == 2 and dims[o.name][1] == 4]
    boxes.sort(key=lambda o: not any(k in o.name.lower() for k in ("box", "loc")))
    fmt = ev.cfg.format
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
        return _ssd(box_spec, scores, None, count, shapes, ev)
    if fmt == "detr":
        raise InvalidModel(f"detect/detr: expected class scores [Q, C] beside the boxes, "
                           f"got {shapes}")
    if len(vectors) < 2:
        raise InvalidModel(f"detect/ssd: expected scores [N, C], or scores [N] and classes "
                           f"[N] beside the boxes, got {shapes}; {_fix_for_none()}")
    vectors.sort(key=lambda o: (o.dtype.kind in "iu" or any(
        k in o.name.lower() for k in ("class", "label"))))
    return _ssd(box_spec, vectors[0], vectors[1], count, shapes, ev)


def _looks_detr(boxes: TensorSpec, scores: TensorSpec, ev: _Evidence) -> bool:
    """DETR's boxes come out of a Sigmoid (0..1 cx, cy, w, h), its scores are called logits."""
    return ("logit" in scores.name.lower() or ev.producers.get(boxes.name) == "Sigmoid"
            or ev.metadata.rtdetr)


def _detr_pair(boxes: TensorSpec, scores: TensorSpec, shapes: str, ev: _Evidence) -> Head:
    cfg = ev.cfg
    why = "postprocess.format: detr" if ev.told("format") else (
        f"{scores.name} named as logits" if "logit" in scores.name.lower() else
        f"{boxes.name} comes out of a Sigmoid" if ev.producers.get(boxes.name) == "Sigmoid"
        else "metadata: an RT-DETR export")
    return Head("detr", f"detr: boxes [Q, 4] + class scores [Q, C] ({shapes}); {why}",
                boxes=boxes.name, scores=scores.name, box=_box(ev, "cxcywh"),
                normalized=cfg.normalized if ev.told("normalized") else True,
                activation=_activation(scores.name, ev), nms=False)


def _ssd(boxes: TensorSpec, scores: TensorSpec, classes: TensorSpec | None,
         count: TensorSpec | None, shapes: str, ev: _Evidence) -> Head:
    cfg = ev.cfg
    tf_style = boxes.name.lower().startswith("detection_boxes")
    if ev.told("format"):  # model.yaml's `format: ssd` keeps its keys' defaults, as it always did
        box: Box = cfg.box
        normalized: bool | None = cfg.normalized
    else:
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
                background=background, nms=count is None)
