"""`python -m tools.bench post`: detection post-processing per frame, before and after.

The head is YOLOv8's [1, 84, 8400] for a 640x640 input (80 classes), filled the way a real one
is: low class scores everywhere, and around a dozen objects a cluster of anchors whose scores
fall off from the object's centre and whose boxes scatter around it, so a few hundred
candidates pass a 0.25 threshold. A 1280x720 frame was letterboxed into it. "Before" is the
numpy path edged had (copied below: decode every anchor, threshold, map, a Python NMS loop);
"after" is `edged.processing.post.detect` with the head chosen at load (vectorised decode with
the threshold first, OpenCV's batched NMS). Both must keep the same detections: the bench
asserts it. The threshold 0.01 case (mAP-style, thousands of candidates) shows what the
pre-NMS top-k cap buys; the end-to-end head [1, 300, 6] needs no NMS at all.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edged.model.config import PRE_NMS_TOP_K, PostprocessConfig
from edged.model.heads import Head, choose_head
from edged.model.tensor import TensorSpec
from edged.processing.post import detect
from edged.processing.pre import Geometry

SIZE, CLASSES = 640, 80
FRAME = Geometry(0.5, 0.5, 0, 140, (1280, 720))  # 1280x720 letterboxed into 640x640
LABELS = [f"class{i}" for i in range(CLASSES)]
# objects, their size range (pixels of the 640x640 input), and how fast the scores of the
# anchors that see one fall off from its centre
SCENES: dict[str, tuple[int, tuple[float, float], float]] = {
    "12 objects": (12, (24, 260), 60), "crowd of 100": (100, (16, 64), 20)}
TOP_K_SWEEP = (100, 300, 1000, 3000)
Detections = list[dict[str, Any]]


# -- "before": the numpy path as it was (edged/processing/post.py before heads.py) -------------

def numpy_detect(outputs: Mapping[str, np.ndarray], cfg: PostprocessConfig,
                 geometry: Geometry | None, labels: Sequence[str]) -> Detections:
    boxes, scores, classes = _numpy_yolo(outputs, cfg)
    keep = scores >= cfg.score_threshold
    boxes, scores, classes = _numpy_xyxy(boxes[keep]), scores[keep], classes[keep]
    if geometry is not None:
        boxes = _numpy_to_frame(boxes, geometry)
    chosen = numpy_nms(boxes, scores, classes, cfg.iou_threshold)[:cfg.max_detections]
    return [{"class": int(classes[i]), "label": labels[int(classes[i])],
             "score": round(float(scores[i]), 5),
             "box": [round(float(v), 2) for v in boxes[i]]} for i in chosen]


def _numpy_yolo(outputs: Mapping[str, np.ndarray],
                cfg: PostprocessConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    table = np.asarray(next(iter(outputs.values())), np.float32)
    rows, cols = table.shape[-2:]
    table = table.reshape(rows, cols)
    if rows < cols:  # YOLOv8's [4+C, N]
        table = table.T
    class_scores = table[:, 4:]
    classes = class_scores.argmax(axis=1)
    return table[:, :4], class_scores[np.arange(len(table)), classes], classes


def _numpy_xyxy(boxes: np.ndarray) -> np.ndarray:
    cx, cy, w, h = boxes.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)


def _numpy_to_frame(boxes: np.ndarray, g: Geometry) -> np.ndarray:
    out = boxes.astype(np.float32, copy=True)
    out[:, [0, 2]] = ((out[:, [0, 2]] - g.pad_x) / g.scale_x).clip(0, g.frame_size[0])
    out[:, [1, 3]] = ((out[:, [1, 3]] - g.pad_y) / g.scale_y).clip(0, g.frame_size[1])
    return out


def numpy_nms(boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray,
              iou_threshold: float) -> list[int]:
    """Greedy non-maximum suppression per class; indices best first (the reference)."""
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


# -- heads as a real model fills them ------------------------------------------------------------

def anchor_centres(size: int = SIZE) -> np.ndarray:
    """[N, 3]: x, y and stride of every YOLOv8 anchor (strides 8, 16, 32)."""
    cells = []
    for stride in (8, 16, 32):
        side = size // stride
        ys, xs = np.mgrid[0:side, 0:side]
        cells.append(np.stack([(xs.ravel() + 0.5) * stride, (ys.ravel() + 0.5) * stride,
                               np.full(side * side, stride)], axis=1))
    return np.concatenate(cells).astype(np.float32)


def yolov8_head(rng: np.random.Generator, objects: int = 12,
                sizes: tuple[float, float] = (24, 260), sharpness: float = 60) -> np.ndarray:
    """[1, 4+80, 8400]: background anchors under 0.05, clusters of candidates around objects."""
    anchors = anchor_centres()
    n = len(anchors)
    table = np.empty((4 + CLASSES, n), np.float32)
    table[0:2] = (anchors[:, :2] + rng.normal(0, 2, (n, 2))).T
    table[2:4] = (anchors[:, 2:3] * rng.uniform(1, 4, (n, 2))).T
    # Background: each anchor has some low level (0..0.05, most far under) spread over classes.
    level = rng.random(n, dtype=np.float32) ** 3 * 0.05
    table[4:] = rng.random((CLASSES, n), dtype=np.float32) * level
    top, bottom = FRAME.pad_y, SIZE - FRAME.pad_y  # objects are in the frame, not the bars
    for _ in range(objects):
        w, h = rng.uniform(*sizes), rng.uniform(sizes[0], min(sizes[1], bottom - top - 8))
        cx, cy = rng.uniform(w / 2, SIZE - w / 2), rng.uniform(top + h / 2, bottom - h / 2)
        # Anchors near the centre, on the strides that suit the object's size, see it.
        near = ((np.abs(anchors[:, 0] - cx) < w / 3) & (np.abs(anchors[:, 1] - cy) < h / 3)
                & (anchors[:, 2] * 3 < max(w, h)))
        idx = np.flatnonzero(near)
        spread = np.hypot((anchors[idx, 0] - cx) / w, (anchors[idx, 1] - cy) / h)
        table[4 + int(rng.integers(CLASSES)), idx] = (
            rng.uniform(0.55, 0.95) * np.exp(-sharpness * spread ** 2)
            * rng.uniform(0.8, 1, len(idx)))
        jitter = rng.normal(0, 0.06, (len(idx), 4)) * [w, h, w, h]
        table[0:4, idx] = (np.array([cx, cy, w, h]) + jitter).T
    return table[None]


def end2end_head(rng: np.random.Generator, objects: int = 20) -> np.ndarray:
    """[1, 300, 6]: the top 300 after the model's own selection, `objects` of them real."""
    rows = np.zeros((300, 6), np.float32)
    x1y1 = rng.uniform(0, SIZE - 200, (300, 2))
    rows[:, 0:2], rows[:, 2:4] = x1y1, x1y1 + rng.uniform(20, 200, (300, 2))
    rows[:, 4] = np.sort(np.concatenate([rng.uniform(0.3, 0.95, objects),
                                         rng.uniform(0, 0.1, 300 - objects)]))[::-1]
    rows[:, 5] = rng.integers(0, CLASSES, 300)
    return rows[None]


# -- measuring -----------------------------------------------------------------------------------

def median_ms(run: Callable[[], object], repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    return round(statistics.median(times), 3)


def head_for(outputs: Mapping[str, np.ndarray], cfg: PostprocessConfig) -> Head:
    specs = tuple(TensorSpec(k, v.dtype, v.shape) for k, v in outputs.items())
    return choose_head(specs, None, cfg, input_size=(SIZE, SIZE))


def yolov8_case(rng: np.random.Generator, scene: str, threshold: float, repeats: int,
                frames: int) -> dict[str, Any]:
    cfg = PostprocessConfig(kind="detect", score_threshold=threshold)
    uncapped = replace(cfg, pre_nms_top_k=8400)
    heads = [{"output0": yolov8_head(rng, *SCENES[scene])} for _ in range(frames)]
    head = head_for(heads[0], cfg)
    candidates, kept, references = [], [], []
    for outputs in heads:
        # edged now drops boxes that fall wholly in the letterbox bars (zero area in the
        # frame); the old path reported them. The detections that show something must match.
        everything = numpy_detect(outputs, replace(cfg, max_detections=8400), FRAME, LABELS)
        references.append([d for d in everything if d["box"][2] > d["box"][0]
                           and d["box"][3] > d["box"][1]][:cfg.max_detections])
        candidates.append(int((outputs["output0"][0][4:].max(axis=0) >= threshold).sum()))
        kept.append(len(references[-1]))
    same = all(detect(o, uncapped, FRAME, LABELS, head).rows() == r
               for o, r in zip(heads, references, strict=True))
    assert same, "the new path kept other detections than the numpy reference"
    cycle = iter(range(1 << 30))

    def pick() -> Mapping[str, np.ndarray]:
        return heads[next(cycle) % frames]

    def timed(top_k: int) -> dict[str, Any]:
        capped = replace(cfg, pre_nms_top_k=top_k)
        return {"ms": median_ms(lambda: detect(pick(), capped, FRAME, LABELS, head), repeats),
                "same_kept": all(detect(o, capped, FRAME, LABELS, head).rows() == r
                                 for o, r in zip(heads, references, strict=True))}

    before_ms = median_ms(lambda: numpy_detect(pick(), cfg, FRAME, LABELS), repeats)
    after = timed(cfg.pre_nms_top_k)
    sweep = {str(k): timed(k) for k in TOP_K_SWEEP if k < max(candidates)}
    sweep["none"] = timed(8400)
    return {"scene": scene, "head": "yolov8 [1, 84, 8400]", "score_threshold": threshold,
            "candidates": round(statistics.mean(candidates)),
            "kept": round(statistics.mean(kept), 1), "before_ms": before_ms,
            "after_ms": after["ms"], "speedup": round(before_ms / after["ms"], 1),
            "same_kept": same and after["same_kept"], "pre_nms_top_k": sweep}


def nms_case(rng: np.random.Generator, repeats: int) -> dict[str, Any]:
    """NMS alone on the candidates of a crowd at 0.25, in frame pixels."""
    from edged.processing.boxes import nms

    table = yolov8_head(rng, *SCENES["crowd of 100"])[0].T
    scores = table[:, 4:].max(axis=1)
    keep = scores >= 0.25
    boxes = _numpy_to_frame(_numpy_xyxy(table[keep, :4]), FRAME)
    classes, scores = table[keep, 4:].argmax(axis=1), scores[keep]
    kept = numpy_nms(boxes, scores, classes, 0.45)
    same = nms(boxes, scores, classes, 0.45) == kept
    assert same, "OpenCV's NMS kept other boxes than the numpy reference"
    before = median_ms(lambda: numpy_nms(boxes, scores, classes, 0.45), repeats)
    after = median_ms(lambda: nms(boxes, scores, classes, 0.45), repeats)
    return {"boxes": int(keep.sum()), "kept": len(kept), "before_ms": before,
            "after_ms": after, "speedup": round(before / after, 1), "same_kept": same}


def end2end_case(rng: np.random.Generator, repeats: int) -> dict[str, Any]:
    cfg = PostprocessConfig(kind="detect")
    outputs = {"output0": end2end_head(rng)}
    head = head_for(outputs, cfg)
    found = detect(outputs, cfg, FRAME, LABELS, head)
    return {"head": f"{head.format} [1, 300, 6]", "kept": len(found),
            "after_ms": median_ms(lambda: detect(outputs, cfg, FRAME, LABELS, head), repeats)}


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    del workdir  # nothing on disk
    rng = np.random.default_rng(7)
    repeats, frames = (10, 3) if quick else (200, 16)
    return {"frame": "1280x720 letterboxed into 640x640", "pre_nms_top_k": PRE_NMS_TOP_K,
            "yolov8": [yolov8_case(rng, "12 objects", 0.25, repeats, frames),
                       yolov8_case(rng, "crowd of 100", 0.25, repeats, frames),
                       yolov8_case(rng, "12 objects", 0.01, max(5, repeats // 4), frames)],
            "nms": nms_case(rng, repeats), "end2end": end2end_case(rng, repeats)}


def format_table(results: dict[str, Any]) -> str:
    lines = [f"detection post-processing per frame, median ms ({results['frame']}, "
             f"pre_nms_top_k {results['pre_nms_top_k']})",
             f"{'case':<40}{'cand.':>7}{'kept':>7}{'before':>9}{'after':>9}{'speed-up':>10}"
             f"{'same kept':>11}"]
    for case in results["yolov8"]:
        name = f"yolov8 8400x80, {case['scene']}, >= {case['score_threshold']}"
        lines.append(f"{name:<40}{case['candidates']:>7}{case['kept']:>7}"
                     f"{case['before_ms']:>9}{case['after_ms']:>9}"
                     f"{str(case['speedup']) + 'x':>10}{_yes(case['same_kept']):>11}")
        if case["candidates"] > results["pre_nms_top_k"]:
            for k, row in case["pre_nms_top_k"].items():
                lines.append(f"{'  pre_nms_top_k ' + k:<40}{'':>7}{'':>7}{'':>9}"
                             f"{row['ms']:>9}{'':>10}{_yes(row['same_kept']):>11}")
    nms = results["nms"]
    lines.append(f"{'NMS alone, crowd (numpy loop vs OpenCV)':<40}{nms['boxes']:>7}"
                 f"{nms['kept']:>7}{nms['before_ms']:>9}{nms['after_ms']:>9}"
                 f"{str(nms['speedup']) + 'x':>10}{_yes(nms['same_kept']):>11}")
    e2e = results["end2end"]
    lines.append(f"{e2e['head'] + ' (no NMS)':<40}{300:>7}{e2e['kept']:>7}{'misread':>9}"
                 f"{e2e['after_ms']:>9}")
    return "\n".join(lines)


def _yes(same: bool) -> str:
    return "yes" if same else "NO"
