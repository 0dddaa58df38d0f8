"""Which detection head a model has, told from its output shapes, its ONNX metadata, its graph
and what model.yaml says, once, when the version is read: YOLOv5 rows with objectness, YOLOv8's
transposed table, YOLOX's raw grid rows, end-to-end rows (x1, y1, x2, y2, score, class), and
(`edged.model.boxsets`) boxes beside scores: SSD, TF Object Detection API, YOLO-NAS, DETR,
RF-DETR, D-FINE. A head that fits none, or more than one, is an InvalidModel at load naming the
shapes and only those `postprocess:` keys that would read them right: never boxes read the
wrong way. A table whose row count is not the input's anchor grid at a head's strides is not
taken for that head, however its columns add up.

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

Format = Literal["yolov5", "yolov8", "yolox", "end2end", "ssd", "yolonas", "detr", "priorbox",
                 "scrfd", "yunet"]
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
    grid: tuple[int, int] | None = None  # YOLOX raw: the input (width, height) of its grid
    class_base: int = 0  # TF's detection_classes count from 1 (a label map's first id)
    # Per-candidate columns after the class scores that are not scores: a segmentation
    # head's mask coefficients, a pose head's keypoints (edged.tasks reads them)
    extra: int = 0
    # priorbox (RetinaFace-style): the landmarks output [N, 2K] and the priors the boxes and
    # landmarks are encoded against (sizes per step, steps, variances)
    landmarks: str | None = None
    prior_sizes: tuple[tuple[float, ...], ...] = ()
    prior_steps: tuple[int, ...] = ()
    variance: tuple[float, float] = (0.1, 0.2)
    # scrfd and yunet (edged.model.scrfd): per level (stride, scores, boxes, landmarks or
    # None, objectness or None: YuNet's), and the anchors a cell
    levels: tuple[tuple[int, str, str, str | None, str | None], ...] = ()
    anchors: int = 1

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
    marks: frozenset[str] = frozenset()  # Signature.marks
    size: tuple[int, int] | None = None  # the input's (width, height) when known
    extra: int = 0  # columns after the class scores (mask coefficients, keypoints)

    def told(self, key: str) -> bool:
        return key in self.said


def choose_head(outputs: Sequence[TensorSpec], metadata: ExportMetadata | None,
                cfg: PostprocessConfig, *, said: Collection[str] | None = None,
                input_size: tuple[int, int] | None = None,
                producers: Mapping[str, str] | None = None, batched: bool = False,
                marks: Collection[str] = (), extra: int = 0) -> Head:
    """The head of a detector with these outputs (batch dim included when `batched`).

    `said` names the postprocess keys model.yaml gave; None counts every key whose value is
    not the default (a config built in code). `input_size` is the tensor's (width, height)
    when known: it gives the anchor grid. `extra`: the columns each candidate has after its
    class scores (a segment or pose task's; only YOLO tables carry them)."""
    metadata = metadata or ExportMetadata()
    names = cfg.names if cfg.names is not None else metadata.names
    evidence = _Evidence(cfg, frozenset(_non_default(cfg) if said is None else said), metadata,
                         len(names) if names else None, _anchor_counts(input_size),
                         producers or {}, batched, frozenset(marks), input_size, extra)
    if not outputs:
        raise InvalidModel("postprocess: the model has no outputs to read detections from")
    if cfg.output is not None:
        chosen = [o for o in outputs if o.name == cfg.output]
        if not chosen:
            raise InvalidModel(f"postprocess.output {cfg.output!r} is not an output "
                               f"({', '.join(o.name for o in outputs)})")
        return _table_head(chosen[0], evidence)
    if not extra and (cfg.format in ("ssd", "yolonas", "priorbox", "scrfd", "yunet")
                      or (cfg.format in ("auto", "detr") and len(outputs) > 1)):
        from edged.model.boxsets import box_set_head

        head = box_set_head(outputs, evidence)
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


def yolox_strides(size: tuple[int, int], rows: int) -> tuple[int, ...] | None:
    """YOLOX's strides for an input (width, height) whose grid has `rows` cells (its grid
    floors: `hsize = height // stride`), or None when neither P5 nor P6 gives that count."""
    width, height = size
    for strides in _STRIDES:
        if sum((height // s) * (width // s) for s in strides) == rows:
            return strides
    return None


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
        if "yolox" in ev.marks and ev.size is None:
            raise InvalidModel(f"postprocess: output {spec.name} {list(spec.shape)} is a YOLOX "
                               f"head (its graph), but its grid needs the input size: set "
                               f"preprocess.resize [width, height]")
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
        extra += ev.extra
        if n <= extra or (c is not None and n != extra + c):
            return None
        more = f" + {ev.extra} per-candidate values" if ev.extra else ""
        return f"{n} = {extra - ev.extra} + {n - extra} classes{more}" + (
            " (names)" if c is not None else "")

    def anchors(n: int, other: int, grid: frozenset[int], per_cell: str) -> str | None:
        if grid:
            if n == -1:
                return f"N dynamic (the input's grid has {per_cell})"
            return f"{n} anchors = {per_cell} of the input's grid" if n in grid else None
        return "more rows than columns (no anchor grid known)" if n == -1 or n > other else None

    fits: list[_Fit] = []
    # End-to-end exports keep 100-300 rows; thousands of 6-wide rows are an anchor table.
    # (only YOLO tables carry mask coefficients or keypoints: `extra` rules the rest out)
    if not ev.extra and cols == 6 and rows != 0 and (rows <= MAX_QUERIES or ev.metadata.end2end):
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
    why_width = width(cols, 5)
    if why_width and not ev.extra and ev.size is not None and rows > 0 \
            and yolox_strides(ev.size, rows):
        said = "; its graph: Conv + Sigmoid + Sigmoid per level" if "yolox" in ev.marks else ""
        fits.append(_Fit("yolox", False, f"[N, 5+C]: {why_width}, {rows} rows = one per cell "
                         f"of the input's grid{said}", 3 if said else 2))
    why_width = width(cols, 4)
    if why_width and not ev.extra and 0 < rows <= MAX_QUERIES and cols - 4 <= MAX_CLASSES \
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
    if ev.metadata.ultralytics:  # Ultralytics writes no YOLOX
        fits = [f for f in fits if f.format != "yolox"]
    if fmt == "yolox" or "yolox" in ev.marks:
        fits = [f for f in fits if f.format == "yolox"]
    return fits


def _said_yolo(spec: TensorSpec, rows: int, cols: int, ev: _Evidence) -> Head:
    """`format: yolo` (or `transposed` given): the layout model.yaml names, as it names it."""
    cfg = ev.cfg
    v5 = cfg.format == "yolov5" or (cfg.format != "yolov8" and cfg.objectness)
    extra = 5 if v5 else 4
    transposed = cfg.transposed if cfg.transposed is not None else rows < cols
    width = rows if transposed else cols
    if width <= extra + ev.extra:
        raise InvalidModel(f"detect/yolo: expected [N, {extra}+classes], got {spec.name} "
                           f"{list(spec.shape)}")
    said = "transposed and objectness" if cfg.transposed is not None else "objectness; " \
        "transposed guessed: fewer rows than columns"
    fmt: Format = "yolov5" if v5 else "yolov8"
    return Head(fmt, f"{fmt}: {spec.name} {list(spec.shape)}, postprocess.format: "
                f"{cfg.format} with {said}", table=spec.name, transposed=transposed,
                objectness=v5, box=cfg.box, normalized=cfg.normalized, extra=ev.extra)


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
    if fit.format == "yolox":
        decoded = "yolox_decoded" in ev.marks
        return Head("yolox", reason + ("; boxes decoded in the graph" if decoded else
                                       "; raw grid offsets, decoded here"),
                    table=spec.name, objectness=True, box="cxcywh", normalized=False,
                    grid=None if decoded else ev.size)
    if fit.format in ("yolov5", "yolov8"):
        return Head(fit.format, reason, table=spec.name, transposed=fit.transposed,
                    objectness=fit.format == "yolov5", box=cfg.box, normalized=cfg.normalized,
                    extra=ev.extra)
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
    if "yolov8" in formats and "yolox" in formats:
        text += " (yolox: raw grid offsets with objectness, as YOLOX exports them)"
    if "yolov5" in formats:
        text += " (yolov5 with objectness: true)"
    return text


def _fix_for_none() -> str:
    return ("it is none of the heads edged reads (yolov5 [N, 5+C] and yolox [N, 5+C] with N "
            "the input's anchor grid, yolov8 [4+C, N], end2end [K, 6], detr [Q, 4+C], boxes "
            "[N, 4] beside scores); serve it with postprocess.kind: raw")
