"""`python -m tools.bench classify`: what an Ultralytics classifier's pre-processing costs a
frame, the whole `edged.processing.pre.preprocess` into a 224 x 224 float32 tensor.

"squash" is what edged did before (decision 041's addendum): the whole frame resized to
224 x 224 with OpenCV's INTER_AREA, RGB, 1/255. "crop" is what it does now,
ClassificationPredictor's `classify_transforms(224)`: the short side to 224 with Pillow's
antialiased bilinear (`edged.processing.resample`, ported to the bit), the middle 224 x 224
cut out, computed for that window only. "crop, whole resize" resizes the whole frame the same
way and cuts after (the path without the window): its tensor is asserted equal to the crop's,
frame by frame, so the window buys no different answer. The paths take turns, call by call;
median and least ms of each (on the shared VMs the least is the call nothing preempted).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edged.model.config import PreprocessConfig
from edged.model.tensor import TensorSpec
from edged.model.ultralytics import ULTRALYTICS_CLASSIFY, classify_crop
from edged.processing import resample
from edged.processing.pre import preprocess

SIZE = 224
FRAMES = ((640, 480), (1280, 720), (1920, 1080), (3840, 2160))
SPEC = TensorSpec("images", np.dtype(np.float32), (1, 3, SIZE, SIZE))
CROP = PreprocessConfig(**{**ULTRALYTICS_CLASSIFY, **classify_crop((SIZE, SIZE)),
                           "resize": [SIZE, SIZE]})
SQUASH = PreprocessConfig(resize=[SIZE, SIZE], interpolation="area", color="rgb",
                          scale=1 / 255)


def whole_then_cut(frame: np.ndarray) -> np.ndarray:
    """The crop's tensor with the whole frame resized first (no window)."""
    height, width = frame.shape[:2]
    short = min(width, height)
    new_w, new_h = width * SIZE // short, height * SIZE // short
    left, top = round((new_w - SIZE) / 2.0), round((new_h - SIZE) / 2.0)
    cut = resample.resize(frame, new_w, new_h)[top:top + SIZE, left:left + SIZE]
    tensor = cut[:, :, ::-1].transpose(2, 0, 1).astype(np.float32)
    return (tensor * np.float32(1 / 255))[None]


def _call(function: Callable[..., object], *args: object) -> Callable[[], object]:
    return lambda: function(*args)


def time_turns(paths: dict[str, Callable[[], object]], repeats: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(repeats):
        for name, run in paths.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: {"median_ms": round(statistics.median(t), 3), "min_ms": round(min(t), 3)}
            for name, t in times.items()}


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    del workdir  # nothing on disk
    rng = np.random.default_rng(5)
    repeats = 3 if quick else 30
    cases = []
    for width, height in FRAMES[:2] if quick else FRAMES:
        frame = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        out = np.empty(SPEC.shape, np.float32)
        crop, _ = preprocess(frame, CROP, SPEC)
        same = bool(np.allclose(crop, whole_then_cut(frame), rtol=0, atol=2.0 ** -24))
        timed = time_turns({"squash": _call(preprocess, frame, SQUASH, SPEC, out),
                            "crop": _call(preprocess, frame, CROP, SPEC, out),
                            "crop, whole resize": _call(whole_then_cut, frame)}, repeats)
        cases.append({"frame": f"{width}x{height}", "same_tensor": same, **timed})
    return {"tensor": f"{SIZE}x{SIZE} float32", "repeats": repeats, "cases": cases}


def format_table(results: dict[str, Any]) -> str:
    paths = ("squash", "crop", "crop, whole resize")
    lines = [f"Ultralytics classifier pre-processing per frame into {results['tensor']}, ms "
             f"(median / least of {results['repeats']})",
             f"{'frame':<12}" + "".join(f"{p:>22}" for p in paths) + f"{'same tensor':>13}"]
    for case in results["cases"]:
        cells = "".join(f"{case[p]['median_ms']:>13.2f} / {case[p]['min_ms']:<6.2f}"
                        for p in paths)
        lines.append(f"{case['frame']:<12}{cells}{'yes' if case['same_tensor'] else 'NO':>13}")
    return "\n".join(lines)
