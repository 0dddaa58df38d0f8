"""A detector's outputs → candidate boxes, in the layout its `Head` names (chosen when the model
was read), vectorised: the score threshold and the pre-NMS top-k cut the candidates before
anything looks at one box at a time.

Boxes come back as x1, y1, x2, y2 in input-tensor pixels, or 0..1 of the input when the head's
boxes are normalised (`Candidates.normalized`); `post._to_frame` maps them into the frame.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edged.core.errors import InvalidModel
from edged.model.heads import Head, yolox_strides

# A box in pixels is more than a pixel and a half from the corner; 0..1 boxes never are.
NORMALIZED_LIMIT = 1.5


@dataclass(frozen=True)
class Candidates:
    boxes: np.ndarray  # [K, 4] float32 x1, y1, x2, y2
    scores: np.ndarray  # [K] float32, all >= the threshold
    classes: np.ndarray  # [K] int64
    normalized: bool  # boxes are 0..1 of the input tensor
    # [K] the candidates' rows in a YOLO table (where a head's `extra` columns are read);
    # None for other heads
    index: np.ndarray | None = None
    # [K, 2P] a landmark head's points (x, y in input pixels), decoded against its priors
    points: np.ndarray | None = None


def decode(head: Head, outputs: Mapping[str, np.ndarray], score_threshold: float,
           top_k: int, size: tuple[int, int] | None = None) -> Candidates:
    """The candidates of one image (a batch of one) scoring at least `score_threshold`, at most
    `top_k` of them (the best). `size`: the input tensor's (width, height), which a head over
    prior boxes needs when its input size is not fixed."""
    index = points = None
    if head.format == "priorbox":
        boxes, scores, classes, points = _priorbox(head, outputs, score_threshold, top_k,
                                                   size or head.grid)
    elif head.format == "yunet":
        boxes, scores, classes, points = _yunet(head, outputs, score_threshold, top_k,
                                                size or head.grid)
    elif head.format == "scrfd":
        boxes, scores, classes, points = _scrfd(head, outputs, score_threshold, top_k,
                                                size or head.grid)
    elif head.format == "yolov8":
        boxes, scores, classes, index = _yolov8(_table(head, outputs), head, score_threshold,
                                                top_k)
    elif head.format == "yolov5":
        boxes, scores, classes, index = _yolov5(_table(head, outputs), head, score_threshold,
                                                top_k)
    elif head.format == "yolox":
        boxes, scores, classes = _yolox(_table(head, outputs), head, score_threshold, top_k)
    elif head.format == "end2end":
        boxes, scores, classes = _end2end(_table(head, outputs), score_threshold, top_k)
    elif head.format == "detr":
        boxes, scores, classes = _detr(head, outputs, score_threshold, top_k)
    else:  # ssd, yolonas: boxes beside scores
        boxes, scores, classes = _ssd(head, outputs, score_threshold, top_k)
    boxes = _to_xyxy(boxes.astype(np.float32, copy=False), head.box)
    normalized = head.normalized
    if normalized is None:  # the head does not say: 0..1 boxes stay within the unit square
        normalized = not boxes.size or float(np.abs(boxes).max()) <= NORMALIZED_LIMIT
    return Candidates(boxes, scores.astype(np.float32, copy=False),
                      classes.astype(np.int64, copy=False), normalized, index, points)


Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # boxes as encoded, scores, classes


def extra_values(head: Head, outputs: Mapping[str, np.ndarray],
                 index: np.ndarray) -> np.ndarray:
    """[K, head.extra]: the values after the class scores (mask coefficients, keypoints) of
    the YOLO table's candidates at `index` (`Candidates.index`), float32."""
    if not head.extra:
        return np.zeros((len(index), 0), np.float32)
    table = _table(head, outputs)
    if head.transposed:
        return np.ascontiguousarray(table[-head.extra:, index].T)
    return np.ascontiguousarray(table[index, -head.extra:])


def _output(outputs: Mapping[str, np.ndarray], name: str | None) -> np.ndarray:
    if name is None or name not in outputs:
        raise InvalidModel(f"detect: output {name!r} is missing (got {', '.join(outputs)})")
    return np.asarray(outputs[name])


def _table(head: Head, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
    table = _output(outputs, head.table)
    while table.ndim > 2:  # the batch of one
        table = table[0]
    if table.ndim != 2:
        raise InvalidModel(f"detect/{head.format}: {head.table} has shape {table.shape}")
    return np.asarray(table, np.float32)


def _best(keep: np.ndarray, scores: np.ndarray, top_k: int) -> np.ndarray:
    """Positions in `keep` of the top_k best scores, still in index order (NMS breaks ties by
    it)."""
    if len(keep) <= top_k:
        return keep
    best = keep[np.argpartition(-scores[keep], top_k - 1)[:top_k]]
    best.sort()
    return best


def _yolov8(table: np.ndarray, head: Head, threshold: float, top_k: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[4+C(+E), N] (transposed) or [N, 4+C(+E)]: box, then class scores (then the head's
    `extra` values: not scores); no objectness. Also the kept candidates' indices."""
    width = table.shape[0] if head.transposed else table.shape[1]
    end = width - head.extra
    if end <= 4:
        raise InvalidModel(f"detect/yolov8: expected [4+classes{'+' if head.extra else ''}"
                           f"{head.extra or ''}, N], got {table.shape}")
    if head.transposed:  # reduce over the class rows: contiguous, no transposed copy
        class_scores = table[4:end]
        best = class_scores.max(axis=0)
        keep = _best(np.flatnonzero(best >= threshold), best, top_k)
        return table[:4, keep].T, best[keep], class_scores[:, keep].argmax(axis=0), keep
    class_scores = table[:, 4:end]
    best = class_scores.max(axis=1)
    keep = _best(np.flatnonzero(best >= threshold), best, top_k)
    return table[keep, :4], best[keep], class_scores[keep].argmax(axis=1), keep


def _yolov5(table: np.ndarray, head: Head, threshold: float, top_k: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """[N, 5+C(+E)]: box, objectness, class scores (then `extra` values); the score is
    objectness x class score."""
    rows = table.T if head.transposed else table
    if rows.shape[1] - head.extra <= 5:
        raise InvalidModel(f"detect/yolov5: expected [N, 5+classes], got {table.shape}")
    keep, scores, classes = _objectness_rows(rows, threshold, top_k, head.extra)
    return rows[keep, :4], scores, classes, keep


def _objectness_rows(rows: np.ndarray, threshold: float, top_k: int, extra: int = 0
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices, scores and classes of the rows whose objectness x class score reaches the
    threshold (the top_k best). Rows whose objectness is under it cannot (class scores are
    <= 1): they are never multiplied out."""
    likely = np.flatnonzero(rows[:, 4] >= threshold)
    class_scores = rows[likely, 5:rows.shape[1] - extra] * rows[likely, 4:5]
    classes = class_scores.argmax(axis=1)
    scores = class_scores[np.arange(len(likely)), classes]
    keep = _best(np.flatnonzero(scores >= threshold), scores, top_k)
    return likely[keep], scores[keep], classes[keep]


def _yolox(table: np.ndarray, head: Head, threshold: float, top_k: int) -> Decoded:
    """YOLOX rows [N, 5+C]: raw grid offsets (x, y from the cell, log w, h), objectness, class
    scores, one row per cell of the stride 8/16/32(/64) grids in order; decoded as YOLOX's
    `demo_postprocess` does: xy = (offset + cell) * stride, wh = exp(log wh) * stride. Only
    rows that score at least the threshold are decoded."""
    if table.shape[1] <= 5:
        raise InvalidModel(f"detect/yolox: expected [N, 5+classes], got {table.shape}")
    keep, scores, classes = _objectness_rows(table, threshold, top_k)
    boxes = table[keep, :4].copy()
    if head.grid is not None:  # else the export decoded its grid itself
        cells, strides = _yolox_grid(head.grid, table.shape[0])
        boxes[:, :2] = (boxes[:, :2] + cells[keep]) * strides[keep]
        boxes[:, 2:4] = np.exp(boxes[:, 2:4]) * strides[keep]
    return boxes, scores, classes


_GRIDS: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray]] = {}


def _yolox_grid(size: tuple[int, int], rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's cell (x, y) and stride, for an input (width, height); cached per size."""
    key = (*size, rows)
    if key not in _GRIDS:
        strides = yolox_strides(size, rows)
        if strides is None:
            raise InvalidModel(f"detect/yolox: {rows} rows are not the grid of a "
                               f"{size[0]}x{size[1]} input")
        cells, steps = [], []
        for s in strides:
            ys, xs = np.mgrid[0:size[1] // s, 0:size[0] // s]
            cells.append(np.stack([xs.ravel(), ys.ravel()], axis=1))
            steps.append(np.full((xs.size, 1), s))
        _GRIDS[key] = (np.concatenate(cells).astype(np.float32),
                       np.concatenate(steps).astype(np.float32))
    return _GRIDS[key]


def _end2end(table: np.ndarray, threshold: float, top_k: int) -> Decoded:
    """[K, 6]: x1, y1, x2, y2, score, class, already suppressed."""
    if table.shape[1] < 6:
        raise InvalidModel(f"detect/end2end: expected [K, 6], got {table.shape}")
    keep = _best(np.flatnonzero(table[:, 4] >= threshold), table[:, 4], top_k)
    return table[keep, :4], table[keep, 4], np.rint(table[keep, 5])


def _detr(head: Head, outputs: Mapping[str, np.ndarray], threshold: float,
          top_k: int) -> Decoded:
    """[Q, 4+C], or boxes [Q, 4] + class scores [Q, C]: one box per query, no NMS."""
    if head.classes is not None:  # D-FINE: the top queries' labels, boxes and scores
        boxes = _output(outputs, head.boxes).reshape(-1, 4)
        scores = _output(outputs, head.scores).reshape(-1).astype(np.float32, copy=False)
        classes = np.rint(_output(outputs, head.classes).reshape(-1)).astype(np.int64)
        if not len(boxes) == len(scores) == len(classes):
            raise InvalidModel(f"detect/detr: {len(boxes)} boxes but {len(scores)} scores and "
                               f"{len(classes)} labels")
        keep = _best(np.flatnonzero(scores >= threshold), scores, top_k)
        return boxes[keep], scores[keep], classes[keep]
    if head.table is not None:
        table = _table(head, outputs)
        boxes, logits = table[:, :4], table[:, 4:]
    else:
        boxes = _output(outputs, head.boxes).reshape(-1, 4)
        logits = _output(outputs, head.scores)
        logits = np.asarray(logits.reshape(len(boxes), -1), np.float32)
    if logits.shape[1] < 1:
        raise InvalidModel(f"detect/detr: no class scores beside the boxes ({logits.shape})")
    classes = logits.argmax(axis=1)
    scores = logits[np.arange(len(logits)), classes]
    sigmoid = head.activation == "sigmoid" or (
        head.activation == "auto" and logits.size and (logits.min() < 0 or logits.max() > 1))
    if sigmoid:  # monotonic: the best logit is the best probability
        scores = 1 / (1 + np.exp(-scores))
    keep = _best(np.flatnonzero(scores >= threshold), scores, top_k)
    return boxes[keep], scores[keep], classes[keep]


def _ssd(head: Head, outputs: Mapping[str, np.ndarray], threshold: float,
         top_k: int) -> Decoded:
    """Boxes [N, 4] and either scores [N, C] (maybe with a background column 0) or scores [N]
    plus classes [N]; a TF-style count says how many rows are real."""
    boxes = _output(outputs, head.boxes).reshape(-1, 4)
    raw_scores = _output(outputs, head.scores)
    if head.classes is not None:
        scores = raw_scores.reshape(-1).astype(np.float32, copy=False)
        classes = np.rint(_output(outputs, head.classes).reshape(-1))
    else:
        matrix = raw_scores.reshape(len(boxes), -1)
        if head.background:
            matrix = matrix[:, 1:]
        if matrix.shape[1] < 1:
            raise InvalidModel(f"detect/ssd: no class columns in {head.scores} "
                               f"{raw_scores.shape}")
        classes = matrix.argmax(axis=1)
        scores = matrix[np.arange(len(matrix)), classes]
    if len(scores) != len(boxes) or len(classes) != len(boxes):
        raise InvalidModel(f"detect/ssd: {len(boxes)} boxes but {len(scores)} scores and "
                           f"{len(classes)} classes")
    if head.count is not None:
        real = int(np.asarray(outputs.get(head.count, len(boxes))).reshape(-1)[0])
        boxes, scores, classes = (a[:max(0, real)] for a in (boxes, scores, classes))
    keep = _best(np.flatnonzero(scores >= threshold), scores, top_k)
    return boxes[keep], scores[keep], classes[keep]


def _priorbox(head: Head, outputs: Mapping[str, np.ndarray], threshold: float, top_k: int,
              size: tuple[int, int] | None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """RetinaFace's decode (Pytorch_Retinaface's `decode`, `decode_landm`): the centre moved by
    loc * variance[0] * the prior's size, the size scaled by exp(loc * variance[1]); each
    landmark moved from the prior's centre likewise; the score is conf[:, 1]. Boxes x1, y1,
    x2, y2 and points in input pixels."""
    if size is None:
        raise InvalidModel("detect/priorbox: its prior boxes need the input's size, and the "
                           "input has no fixed one: set preprocess.resize, or send an image")
    loc = _output(outputs, head.boxes).reshape(-1, 4).astype(np.float32, copy=False)
    conf = _output(outputs, head.scores).reshape(len(loc), -1)
    marks = _output(outputs, head.landmarks).reshape(len(loc), -1)
    priors = prior_boxes(size, head.prior_sizes, head.prior_steps)
    if len(priors) != len(loc):
        raise InvalidModel(f"detect/priorbox: {len(loc)} rows, but a {size[0]}x{size[1]} input "
                           f"has {len(priors)} priors at steps {list(head.prior_steps)}")
    scores = conf[:, 1].astype(np.float32, copy=False)
    keep = _best(np.flatnonzero(scores >= threshold), scores, top_k)
    prior = priors[keep]
    near, far = head.variance
    scale = np.array(size, np.float32)
    centre = prior[:, :2] + loc[keep, :2] * near * prior[:, 2:]
    half = prior[:, 2:] * np.exp(loc[keep, 2:] * far) / 2
    boxes = np.concatenate([centre - half, centre + half], axis=1) * np.tile(scale, 2)
    points = marks[keep].reshape(len(keep), marks.shape[1] // 2, 2).astype(np.float32)
    points = (prior[:, None, :2] + points * near * prior[:, None, 2:]) * scale
    return (boxes, scores[keep], np.zeros(len(keep), np.int64),
            points.reshape(len(keep), marks.shape[1]))


def _scrfd(head: Head, outputs: Mapping[str, np.ndarray], threshold: float, top_k: int,
           size: tuple[int, int] | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """InsightFace's `SCRFD.forward`: per level, each anchor's centre is its cell's top-left
    corner times the stride (`anchors` a cell); boxes are x1 = cx - d0 * stride, y1 = cy - d1 *
    stride, x2 = cx + d2 * stride, y2 = cy + d3 * stride (`distance2bbox`), points cx + dx *
    stride, cy + dy * stride (`distance2kps`); the scores are probabilities already."""
    if size is None:
        raise InvalidModel("detect/scrfd: its anchors need the input's size, and the input "
                           "has no fixed one: set preprocess.resize, or send an image")
    width, height = size
    boxes, scores, points = [], [], []
    for stride, score_name, box_name, point_name, _ in head.levels:
        score = _output(outputs, score_name).reshape(-1)
        ys, xs = np.mgrid[0:height // stride, 0:width // stride]
        centres = np.repeat(np.stack([xs, ys], axis=-1).reshape(-1, 2) * stride,
                            head.anchors, axis=0).astype(np.float32)
        if len(centres) != len(score):
            raise InvalidModel(f"detect/scrfd: {score_name} has {len(score)} rows, but a "
                               f"{width}x{height} input has {len(centres)} anchors at stride "
                               f"{stride}")
        keep = np.flatnonzero(score >= threshold)
        centre = centres[keep]
        distance = _output(outputs, box_name).reshape(-1, 4)[keep] * stride
        boxes.append(np.concatenate([centre - distance[:, :2], centre + distance[:, 2:]], 1))
        scores.append(score[keep])
        if point_name is not None:
            offsets = _output(outputs, point_name).reshape(len(score), -1)[keep] * stride
            points.append((offsets.reshape(len(keep), -1, 2) + centre[:, None])
                          .reshape(len(keep), -1))
    all_scores = np.concatenate(scores).astype(np.float32, copy=False)
    best = _best(np.arange(len(all_scores)), all_scores, top_k)
    found = np.concatenate(points)[best] if points else None
    return (np.concatenate(boxes)[best], all_scores[best], np.zeros(len(best), np.int64),
            found)


def _yunet(head: Head, outputs: Mapping[str, np.ndarray], threshold: float, top_k: int,
           size: tuple[int, int] | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """OpenCV's `FaceDetectorYNImpl::postProcess` (YuNet 2023): per stride, the input padded
    up to a multiple of 32; each cell's score sqrt(clip(cls) * clip(obj)), box centre (cell +
    bbox[0:2]) * stride and size exp(bbox[2:4]) * stride, points (cell + kps) * stride."""
    if size is None:
        raise InvalidModel("detect/yunet: its cells need the input's size, and the input has "
                           "no fixed one: set preprocess.resize, or send an image")
    width, height = (-(-v // 32) * 32 for v in size)
    boxes, scores, points = [], [], []
    for stride, cls_name, box_name, point_name, obj_name in head.levels:
        cls = np.clip(_output(outputs, cls_name).reshape(-1), 0, 1)
        obj = np.clip(_output(outputs, str(obj_name)).reshape(-1), 0, 1)
        ys, xs = np.mgrid[0:height // stride, 0:width // stride]
        cells = np.stack([xs, ys], axis=-1).reshape(-1, 2).astype(np.float32)
        if len(cells) != len(cls):
            raise InvalidModel(f"detect/yunet: {cls_name} has {len(cls)} rows, but a "
                               f"{width}x{height} input has {len(cells)} cells at stride "
                               f"{stride}")
        score = np.sqrt(cls * obj)
        keep = np.flatnonzero(score >= threshold)
        cell = cells[keep]
        raw = _output(outputs, box_name).reshape(-1, 4)[keep]
        centre = (cell + raw[:, :2]) * stride
        half = np.exp(raw[:, 2:]) * stride / 2
        boxes.append(np.concatenate([centre - half, centre + half], 1))
        scores.append(score[keep])
        marks = _output(outputs, str(point_name)).reshape(len(cls), -1)[keep]
        points.append(((marks.reshape(len(keep), -1, 2) + cell[:, None]) * stride)
                      .reshape(len(keep), -1))
    all_scores = np.concatenate(scores).astype(np.float32, copy=False)
    best = _best(np.arange(len(all_scores)), all_scores, top_k)
    return (np.concatenate(boxes)[best], all_scores[best], np.zeros(len(best), np.int64),
            np.concatenate(points)[best])


_PRIORS: dict[tuple[object, ...], np.ndarray] = {}


def prior_boxes(size: tuple[int, int], sizes: Sequence[Sequence[float]],
                steps: Sequence[int]) -> np.ndarray:
    """[N, 4] cx, cy, w, h (0..1 of the input) of RetinaFace's PriorBox for an input (width,
    height): per step, per cell row by row, per size; cached per input size."""
    key = (*size, tuple(map(tuple, sizes)), tuple(steps))
    if key not in _PRIORS:
        width, height = size
        levels = []
        for step, level_sizes in zip(steps, sizes, strict=True):
            rows, cols = -(-height // step), -(-width // step)
            ys, xs = np.mgrid[0:rows, 0:cols]
            cells = np.stack([(xs + 0.5) * step / width, (ys + 0.5) * step / height],
                             axis=-1).reshape(-1, 1, 2)
            wh = np.array([[s / width, s / height] for s in level_sizes])[None]
            levels.append(np.concatenate(np.broadcast_arrays(cells, wh), axis=-1)
                          .reshape(-1, 4))
        if len(_PRIORS) > 16:  # a camera has one size; a caller sending many is bounded
            _PRIORS.clear()
        _PRIORS[key] = np.concatenate(levels).astype(np.float32)
    return _PRIORS[key]


def _to_xyxy(boxes: np.ndarray, encoding: str) -> np.ndarray:
    if encoding == "cxcywh":
        cx, cy, w, h = boxes.T
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    if encoding == "yxyx":
        return boxes[:, [1, 0, 3, 2]]
    return boxes
