"""The anchor-free face heads: SCRFD's and YuNet's.

SCRFD's head (InsightFace's face detector: `scrfd_*_bnkps.onnx`, and the exports built on
it): per stride of 8, 16, 32 (and 64, 128 for five-level models) a score output [N, 1], a box
output [N, 4] and, with keypoints, a landmarks output [N, 10]; N = the level's cells times its
anchors a cell (2 for three levels, 1 for five, as InsightFace's `SCRFD` has them). Boxes are
distances from each anchor's centre (the cell's top-left corner times the stride) to the box's
sides, in strides; points are offsets from it likewise (`distance2bbox`, `distance2kps`).
The levels are told by the outputs' widths (1, 4, 10) and their row counts (largest first:
stride 8), or by InsightFace's output order (scores, boxes, points) where the rows are dynamic.

YuNet's head (OpenCV's `FaceDetectorYN`, `face_detection_yunet_2023mar.onnx`): per stride 8,
16, 32 the outputs `cls_<s>` [N, 1], `obj_<s>` [N, 1], `bbox_<s>` [N, 4], `kps_<s>` [N, 10],
one anchor a cell (N = cells); the score is sqrt(cls * obj) (each clipped to 0..1), the box's
centre (cell + bbox[0:2]) * stride and size exp(bbox[2:4]) * stride, each point (cell + kps)
* stride: OpenCV's `FaceDetectorYNImpl::postProcess`. Told by those names.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from edged.core.errors import InvalidModel
from edged.model.heads import Head, _dims, _Evidence, _shapes
from edged.model.tensor import TensorSpec

LEVELS = {6: (3, False), 9: (3, True), 10: (5, False), 15: (5, True)}  # outputs: levels, points
STRIDES = {3: (8, 16, 32), 5: (8, 16, 32, 64, 128)}


Level = tuple[int, str, str, "str | None", "str | None"]
YUNET = re.compile(r"(cls|obj|bbox|kps)_(8|16|32)$")


def yunet_levels(outputs: Sequence[TensorSpec], batched: bool) -> list[Level] | None:
    """(stride, cls, bbox, kps, obj) per stride 8, 16, 32, or None: YuNet's twelve outputs by
    their names, each [N, 1], [N, 1], [N, 4], [N, 10] where the widths are fixed."""
    if len(outputs) != 12:
        return None
    named = {}
    for o in outputs:
        found = YUNET.match(o.name)
        if found is None:
            return None
        width = _dims(o, batched)[-1:] if _dims(o, batched) else ()
        want = {"cls": 1, "obj": 1, "bbox": 4, "kps": 10}[found.group(1)]
        if width and width[0] not in (want, -1):
            return None
        named[(found.group(1), int(found.group(2)))] = o.name
    if len(named) != 12:
        return None
    return [(s, named[("cls", s)], named[("bbox", s)], named[("kps", s)], named[("obj", s)])
            for s in (8, 16, 32)]


def yunet_head(outputs: Sequence[TensorSpec], ev: _Evidence) -> Head | None:
    levels = yunet_levels(outputs, ev.batched)
    if levels is None:
        if ev.cfg.format == "yunet":
            raise InvalidModel(f"detect/yunet: expected YuNet's cls_, obj_, bbox_ and kps_ "
                               f"outputs at strides 8, 16 and 32, got {_shapes(outputs)}")
        return None
    return Head("yunet", f"yunet: cls, obj, bbox and kps at strides 8, 16, 32 "
                f"({_shapes(outputs)}): OpenCV's FaceDetectorYN, score sqrt(cls * obj), boxes "
                f"and points from each cell, in strides",
                boxes=",".join(lv[2] for lv in levels), scores=",".join(lv[1] for lv in levels),
                landmarks=",".join(str(lv[3]) for lv in levels), box="xyxy",
                normalized=False, extra=10, grid=ev.size, nms=True, levels=tuple(levels),
                anchors=1)


def scrfd_levels(outputs: Sequence[TensorSpec], batched: bool) -> list[Level] | None:
    """(stride, scores, boxes, points or None) per level, or None when the outputs are not
    SCRFD's: 6, 9, 10 or 15 outputs, each [N, 1], [N, 4] or [N, 10], as many of each width
    as there are levels, with equal row counts per level."""
    if len(outputs) not in LEVELS:
        return None
    count, with_points = LEVELS[len(outputs)]
    dims = [_dims(o, batched) for o in outputs]
    if any(len(d) != 2 for d in dims):
        return None
    by_width: dict[int, list[tuple[int, TensorSpec]]] = {1: [], 4: [], 10: []}
    for i, (o, d) in enumerate(zip(outputs, dims, strict=True)):
        if d[1] not in by_width:
            return None
        by_width[d[1]].append((i, o))
    if len(by_width[1]) != count or len(by_width[4]) != count or \
            len(by_width[10]) != (count if with_points else 0):
        return None
    rows = [[_dims(o, batched)[0] for _, o in by_width[w]] for w in (1, 4, 10) if by_width[w]]
    if all(n > 0 for part in rows for n in part):
        # each part ordered by rows, largest first (stride 8); the parts must agree
        ordered = {w: sorted(by_width[w], key=lambda p: -_dims(p[1], batched)[0])
                   for w in by_width}
        sizes = [[_dims(o, batched)[0] for _, o in ordered[w]] for w in (1, 4, 10)
                 if ordered[w]]
        if any(s != sizes[0] for s in sizes) or len(set(sizes[0])) != count:
            return None
    else:  # dynamic rows: InsightFace's order (as its SCRFD reads them)
        ordered = by_width
    strides = STRIDES[count]
    return [(strides[k], ordered[1][k][1].name, ordered[4][k][1].name,
             ordered[10][k][1].name if with_points else None, None) for k in range(count)]


def scrfd_head(outputs: Sequence[TensorSpec], ev: _Evidence) -> Head | None:
    """SCRFD's head, or None when the outputs are not its (format auto); with `format:
    scrfd` an InvalidModel saying what does not fit."""
    levels = scrfd_levels(outputs, ev.batched)
    if levels is None:
        if ev.cfg.format == "scrfd":
            raise InvalidModel(f"detect/scrfd: expected per stride scores [N, 1], boxes [N, 4] "
                               f"(and landmarks [N, 10]): 6, 9, 10 or 15 outputs, got "
                               f"{_shapes(outputs)}")
        return None
    anchors = 2 if len(levels) == 3 else 1
    rows = _dims(next(o for o in outputs if o.name == levels[0][1]), ev.batched)[0]
    if ev.size is not None and rows > 0:
        width, height = ev.size
        cells = (height // levels[0][0]) * (width // levels[0][0])
        if cells <= 0 or rows % cells:
            raise InvalidModel(f"detect/scrfd: {rows} rows at stride {levels[0][0]} are no "
                               f"whole number of anchors a cell of a {width}x{height} input "
                               f"({cells} cells): {_shapes(outputs)}")
        anchors = rows // cells
    points = levels[0][3] is not None
    return Head("scrfd", f"scrfd: scores, boxes{' and landmarks' if points else ''} at strides "
                f"{[lv[0] for lv in levels]}, {anchors} anchors a cell ({_shapes(outputs)}): "
                f"distances from each anchor's centre, in strides",
                boxes=",".join(lv[2] for lv in levels), scores=",".join(lv[1] for lv in levels),
                landmarks=",".join(str(lv[3]) for lv in levels) if points else None,
                box="xyxy", normalized=False, extra=10 if points else 0, grid=ev.size,
                nms=True, levels=tuple(levels), anchors=anchors)
