"""`python -m tools.bench masks`: instance-mask decoding per frame, edged's against Ultralytics'
own mask path on the same outputs.

A YOLO-seg frame: the table [1, 4+80+32, 8400] of a 640x640 input (a 1920x1080 frame
letterboxed into it), 20 objects each seen by a cluster of anchors, prototypes [1, 32, 160,
160] in which each object is an ellipse of its own. "Ultralytics" is its published path,
`process_mask(..., upsample=True)` (coefficients @ prototypes for the whole map, `crop_mask`,
bilinear upsampling of each whole mask to 640x640, `> 0`), `masks2segments` (external contours,
the largest) and `scale_coords`, ported with OpenCV doing the upsampling (the same
half-pixel bilinear as `F.interpolate(align_corners=False)`, in C as torch's is; torch is not
installed here). "edged" is `edged.tasks.segment.mask_polygons`: the same masks computed on
each box's window of prototype cells only. Both take the same kept detections; the polygons
must be equal within 1 px (with the point bound off: edged's default bound of 64 points then
simplifies them, timed in its own row). "whole frame" is `edged.processing.post.detect` from
the raw outputs: decode, NMS and the masks. "before" is edged's per-object path as it was
(`tools/bench/masks_reference.py`), its polygons asserted equal to the one-pass path's; the
RLE rows encode the frame's 20 polygons at 1920x1080 the old way (the whole frame drawn) and
the new (each polygon's bounding box), asserted equal. The paths take turns, call by call:
the median and the least time of each (on the shared 2-core VMs the least is the call nothing
preempted; Ultralytics' whole-map matmul runs on OpenBLAS' threads, whose median suffers most).

Then `tools.bench.plates.streams` (a segment stream against a detect stream on the same
outputs, CPU per frame outside decode and the model, and the segment stream with its masks
handed in) at 640x480 and 1920x1080; and, where valgrind is installed and the run is not
quick, the instructions per frame of the mask paths and the RLE (`tools/bench/masks_count.py`,
callgrind: repeatable where times are not).
"""

from __future__ import annotations

import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.model.config import PostprocessConfig
from edged.model.heads import choose_head
from edged.model.tensor import TensorSpec
from edged.processing.boxes import nms, to_frame
from edged.processing.decode import decode, extra_values
from edged.processing.post import detect
from edged.processing.pre import Geometry
from edged.tasks.rle import encode
from edged.tasks.segment import mask_polygons
from tools.bench import masks_reference

SIZE, CLASSES, MASKS, PROTO = 640, 80, 32, 160
FRAME = Geometry(1 / 3, 1 / 3, 0, 140, (1920, 1080), (SIZE, SIZE))  # 1080p letterboxed
OBJECTS = 20
LABELS = [f"class{i}" for i in range(CLASSES)]
CELLS = 8400


def seg_outputs(rng: np.random.Generator, objects: int = OBJECTS
                ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The raw outputs of one frame with `objects` objects, and their true boxes (input
    pixels)."""
    table = np.zeros((4 + CLASSES + MASKS, CELLS), np.float32)
    table[4:4 + CLASSES] = rng.uniform(0, 0.02, (CLASSES, CELLS))
    table[:4] = rng.uniform(0, SIZE, (4, CELLS)) * [[1], [1], [0.05], [0.05]]
    protos = rng.normal(0, 0.3, (MASKS, PROTO, PROTO)).astype(np.float32)
    boxes = []
    cells = rng.permutation(CELLS)
    ys, xs = np.mgrid[0:PROTO, 0:PROTO] + 0.5
    for k in range(objects):
        w, h = rng.uniform(40, 200, 2)
        cx, cy = rng.uniform(w / 2, SIZE - w / 2), rng.uniform(140 + h / 2, 500 - h / 2)
        boxes.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
        inside = ((xs * 4 - cx) / (w / 2)) ** 2 + ((ys * 4 - cy) / (h / 2)) ** 2 <= 0.9
        protos[k % MASKS][inside] += 6.0
        protos[k % MASKS][~inside] -= 3.0
        coefficients = np.zeros(MASKS, np.float32)
        coefficients[k % MASKS] = 1.0
        cluster = cells[k * 12:(k + 1) * 12]
        jitter = rng.normal(0, 2, (4, len(cluster)))
        table[:4, cluster] = np.array([[cx], [cy], [w], [h]]) + jitter
        table[4 + k % CLASSES, cluster] = np.linspace(0.9, 0.5, len(cluster))
        table[4 + CLASSES:, cluster] = coefficients[:, None] + rng.normal(0, 0.02,
                                                                          (MASKS, len(cluster)))
    return {"output0": table[None], "output1": protos[None]}, np.array(boxes)


def ultralytics_polygons(protos: np.ndarray, coefficients: np.ndarray, boxes: np.ndarray
                         ) -> list[np.ndarray]:
    """Ultralytics' process_mask (upsample=True) + masks2segments ("largest") + scale_coords,
    OpenCV upsampling the whole maps."""
    c, mh, mw = protos.shape
    masks = (coefficients @ protos.reshape(c, -1)).reshape(-1, mh, mw)
    down = boxes * [mw / SIZE, mh / SIZE, mw / SIZE, mh / SIZE]
    r, col = np.arange(mw)[None, None, :], np.arange(mh)[None, :, None]
    x1, y1, x2, y2 = (down[:, i][:, None, None] for i in range(4))
    masks = masks * ((r >= x1) * (r < x2) * (col >= y1) * (col < y2))
    segments = []
    for mask in masks:
        up = cv2.resize(mask, (SIZE, SIZE), interpolation=cv2.INTER_LINEAR) > 0.0
        found = cv2.findContours(up.astype(np.uint8), cv2.RETR_EXTERNAL,
                                 cv2.CHAIN_APPROX_SIMPLE)[0]
        points = np.array(found[np.array([len(x) for x in found]).argmax()]).reshape(-1, 2) \
            if found else np.zeros((0, 2))
        gain = min(SIZE / 1080, SIZE / 1920)
        pad = (round((SIZE - 1920 * gain) / 2 - 0.1), round((SIZE - 1080 * gain) / 2 - 0.1))
        points = (points.astype(np.float64) - pad) / gain
        points[:, 0] = points[:, 0].clip(0, 1920)
        points[:, 1] = points[:, 1].clip(0, 1080)
        segments.append(points)
    return segments


def kept(rng: np.random.Generator | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The frame's kept detections as decode and NMS leave them: (prototypes, coefficients,
    boxes in input pixels, the default point bound)."""
    outputs, _ = seg_outputs(rng or np.random.default_rng(11))
    cfg = PostprocessConfig(kind="segment", names=LABELS, proto="output1")
    specs = (TensorSpec("output0", np.dtype(np.float32), outputs["output0"].shape),)
    head = choose_head(specs, None, cfg, input_size=(SIZE, SIZE), extra=MASKS)
    found = decode(head, outputs, cfg.score_threshold, cfg.pre_nms_top_k)
    chosen = nms(to_frame(found.boxes, FRAME, False), found.scores, found.classes,
                 cfg.iou_threshold)
    assert found.index is not None
    return (outputs["output1"][0], extra_values(head, outputs, found.index[chosen]),
            found.boxes[chosen], cfg.mask_points)


def paired_ms(runs: dict[str, Callable[[], object]], repeats: int
              ) -> tuple[dict[str, float], dict[str, float]]:
    """Median and least ms of each, their calls taken in turn (a load that comes and goes on
    the shared machine falls on all of them alike; the least is the call nothing preempted)."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1000)
    return ({name: round(statistics.median(values), 3) for name, values in times.items()},
            {name: round(min(values), 3) for name, values in times.items()})


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    rng = np.random.default_rng(11)
    repeats = 10 if quick else 200
    outputs, _ = seg_outputs(rng)
    cfg = PostprocessConfig(kind="segment", names=LABELS, proto="output1")
    specs = (TensorSpec("output0", np.dtype(np.float32), outputs["output0"].shape),)
    head = choose_head(specs, None, cfg, input_size=(SIZE, SIZE), extra=MASKS)
    protos, coefficients, boxes, _ = kept()

    def edged(points: int) -> list[list[list[float]]]:
        return mask_polygons(protos, coefficients, boxes, FRAME, 0.5, points)

    def before(points: int) -> list[list[list[float]]]:
        return masks_reference.mask_polygons(protos, coefficients, boxes, FRAME, 0.5, points)

    theirs = ultralytics_polygons(protos, coefficients, boxes)
    ours = edged(1 << 16)
    equal = len(ours) == len(theirs) and all(
        len(a) == len(b) and (not len(a) or float(np.abs(np.array(a) - b).max()) <= 1.0)
        for a, b in zip(ours, theirs, strict=True))
    assert equal, "edged's polygons differ from Ultralytics' by more than 1 px"
    bounded = edged(cfg.mask_points)
    same_as_before = ours == before(1 << 16) and bounded == before(cfg.mask_points)
    assert same_as_before, "the one-pass polygons differ from the per-object path's"
    width, height = FRAME.frame_size
    rle_same = all(encode(p, height, width) == masks_reference.rle_encode(p, height, width)
                   for p in bounded)
    assert rle_same, "the bounding-box RLE differs from the whole frame's"
    box_only = replace(cfg, kind="detect")
    from tools.bench import plates  # its stream harness reads this module's frame
    ms, least = paired_ms({
        "ultralytics": lambda: ultralytics_polygons(protos, coefficients, boxes),
        "before": lambda: before(1 << 16), "edged": lambda: edged(1 << 16),
        "before_bounded": lambda: before(cfg.mask_points),
        "bounded": lambda: edged(cfg.mask_points),
        "frame": lambda: detect(outputs, cfg, FRAME, LABELS, head),
        "boxes": lambda: detect(outputs, box_only, FRAME, LABELS, head)}, repeats)
    rle_ms, rle_least = paired_ms({
        "before": lambda: [masks_reference.rle_encode(p, height, width) for p in bounded],
        "now": lambda: [encode(p, height, width) for p in bounded]}, max(3, repeats // 20))
    results: dict[str, Any] = {
        "frame": "1920x1080 letterboxed into 640x640; protos 32x160x160; 8400 candidates",
        "kept": len(boxes), "ultralytics_ms": ms["ultralytics"], "before_ms": ms["before"],
        "edged_ms": ms["edged"], "speedup": round(ms["ultralytics"] / ms["edged"], 1),
        "speedup_least": round(least["ultralytics"] / least["edged"], 1),
        "polygons_equal_1px": equal, "same_as_before": same_as_before,
        "points_max": max(len(p) for p in ours), "before_bounded_ms": ms["before_bounded"],
        "bounded_ms": ms["bounded"], "bounded_points_max": max(len(p) for p in bounded),
        "mask_points": cfg.mask_points, "frame_ms": ms["frame"], "boxes_only_ms": ms["boxes"],
        "rle_before_ms": rle_ms["before"], "rle_ms": rle_ms["now"], "rle_same": rle_same,
        "least_ms": {**least, "rle_before": rle_least["before"], "rle": rle_least["now"]},
        "streams": {"640x480": plates.streams(workdir / "s480", 20 if quick else 200),
                    "1920x1080": plates.streams(workdir / "s1080", 10 if quick else 100,
                                                size=(1920, 1080)),
                    # a street's few objects rather than a crowd's
                    "640x480, 5 objects": plates.streams(workdir / "s480f", 20 if quick else 200,
                                                         objects=5),
                    "1920x1080, 5 objects": plates.streams(
                        workdir / "s1080f", 10 if quick else 100, size=(1920, 1080),
                        objects=5)}}
    if not quick and shutil.which("valgrind") and shutil.which("callgrind_control"):
        from tools.bench import masks_count  # imports this module
        results["instructions"] = masks_count.count(workdir, 20)
    return results


def format_table(results: dict[str, Any]) -> str:
    r = results
    least = r["least_ms"]
    bound = str(r["mask_points"])

    def row(path: str, key: str, least_key: str, points: object = "") -> str:
        return f"{path:<60}{r[key]:>8}{points!s:>8}{least[least_key]:>8}"

    rows = [
        f"instance masks per frame, median ms ({r['frame']}; {r['kept']} objects kept)",
        f"{'path':<60}{'ms':>8}{'points':>8}{'least':>8}",
        row("Ultralytics process_mask + masks2segments (whole maps)", "ultralytics_ms",
            "ultralytics", r["points_max"]),
        row("edged before (af4a336: a call chain per object), no bound", "before_ms", "before",
            r["points_max"]),
        row("edged mask_polygons (one pass, box windows), no point bound", "edged_ms", "edged",
            r["points_max"]),
        row("edged before, mask_points " + bound, "before_bounded_ms", "before_bounded",
            r["bounded_points_max"]),
        row("edged mask_polygons, mask_points " + bound, "bounded_ms", "bounded",
            r["bounded_points_max"]),
        row("edged detect: decode + NMS + masks, whole frame", "frame_ms", "frame"),
        row("edged detect: decode + NMS, boxes only (same outputs)", "boxes_only_ms", "boxes"),
        row("RLE of the 20 polygons at 1920x1080, before (whole frame)", "rle_before_ms",
            "rle_before"),
        row("RLE of the 20 polygons, now (bounding boxes)", "rle_ms", "rle"),
        f"speed-up (masks, vs Ultralytics): {r['speedup']}x (medians), {r['speedup_least']}x "
        f"(least); polygons equal within 1 px: "
        f"{'yes' if r['polygons_equal_1px'] else 'NO'}; equal to before: "
        f"{'yes' if r['same_as_before'] else 'NO'}; RLE equal: {'yes' if r['rle_same'] else 'NO'}",
        "",
        "stream CPU per frame outside decode and the model (20 objects unless said; bound 1.5x)",
        f"{'frame':<22}{'detect ms':>12}{'segment ms':>12}{'ratio':>8}"
        f"{'masks handed in':>16}{'ratio':>8}"]
    for size, s in r["streams"].items():
        rows.append(f"{size:<22}{s['det']['cpu_ms_per_frame']:>12}"
                    f"{s['seg']['cpu_ms_per_frame']:>12}{s['seg_over_det']:>7}x"
                    f"{s['seg_premasked']['cpu_ms_per_frame']:>16}{s['premasked_over_det']:>7}x")
    rows.append("the result message's JSON alone (ms, bytes): " + "; ".join(
        f"{size} detect {s['det']['json_ms']} ({s['det']['message_bytes']}), segment "
        f"{s['seg']['json_ms']} ({s['seg']['message_bytes']})"
        for size, s in r["streams"].items()))
    rows.append("room the 1.5x bound leaves for decoding the masks (1.5 x detect - segment "
                "with masks handed in): " + "; ".join(
                    f"{size} {s['room_for_masks_ms']} ms" for size, s in r["streams"].items())
                + f" (20 masks alone: {r['bounded_ms']} ms median, {least['bounded']} least)")
    counted = r.get("instructions")
    if counted:
        rows += ["", f"instructions per frame (callgrind, {counted['frames']} frames; "
                 "repeatable where ms are not)",
                 f"{'mask_polygons, mask_points 64, before':<60}{counted['before']:>14,}",
                 f"{'mask_polygons, mask_points 64, now':<60}{counted['now']:>14,}",
                 f"{'RLE of the 20 polygons, before':<60}{counted['rle_before']:>14,}",
                 f"{'RLE of the 20 polygons, now':<60}{counted['rle_now']:>14,}"]
    return "\n".join(rows)
