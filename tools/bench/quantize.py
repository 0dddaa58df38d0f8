"""`edged bench quantize`: the PP-OCR models quantized to INT8 by `edged quantize`'s own code,
calibrated on images rendered by OpenCV, and gated on a held-out rendered set.

cls (text direction) is calibrated and judged on text lines, upright or rotated 180° (its real
task), so the table shows each precision's accuracy against the rendered labels as well as
their top-1 agreement; det (text regions, 640x640) on pages of such lines, judged by the
cosine similarity of its probability maps. Latency is p50 at batch 1 on real ONNX Runtime
sessions, the two files interleaved in one run. "auto on CPU" is what `precision: auto` would
load here: INT8 only when the gate accepted it and it is faster by `auto_min_speedup`.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.backends import BackendOptions
from edged.model.repository import ModelRepository
from edged.ops.quantize.command import gather
from edged.ops.quantize.quantize import quantize
from tools.bench.assets import PPOCR_CLS, PPOCR_DET, ppocr_model
from tools.bench.textlines import PPOCR_CLS_PREPROCESS, render_line, write_set

CLS_YAML = ("max_batch_size: 8\ninputs: [{name: x, shape: [3, 48, 192]}]\n"
            f"{PPOCR_CLS_PREPROCESS}\npostprocess: {{kind: classify}}\n")
DET_YAML = ("max_batch_size: 1\ninputs: [{name: x, shape: [3, 640, 640]}]\n"
            "preprocess: {resize: [640, 640], color: bgr, mean: [0.485, 0.456, 0.406], "
            "std: [0.229, 0.224, 0.225]}\n")


def write_pages(folder: Path, count: int, seed: int, size: int = 640) -> Path:
    """Light pages holding a few rendered text lines each (det's input)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        page = np.full((size, size, 3), int(rng.integers(180, 256)), np.uint8)
        for _ in range(int(rng.integers(6, 16))):
            line = render_line(rng)
            h, w = line.shape[:2]
            if h < size and w < size:
                y, x = int(rng.integers(0, size - h)), int(rng.integers(0, size - w))
                page[y:y + h, x:x + w] = line
        cv2.imwrite(str(folder / f"page{i:03d}.png"), page)
    return folder


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    models = workdir / "models"
    plans = [("cls", PPOCR_CLS, CLS_YAML, (32, 64) if quick else (256, 512))]
    if not quick:
        # ONNX Runtime 1.31's calibrator keeps every activation of every sample (~70 MB per
        # 640x640 page here), so det gets few of them.
        plans.append(("det", PPOCR_DET, DET_YAML, (24, 8)))
    results: dict[str, Any] = {"models": {}}
    for name, filename, yaml, (n_cal, n_held) in plans:
        (models / name / "1").mkdir(parents=True)
        shutil.copyfile(ppocr_model(filename), models / name / "1" / "model.onnx")
        (models / name / "model.yaml").write_text(yaml)
        data = workdir / "data" / name
        if name == "cls":
            write_set(data / "calibration", n_cal, seed=1)
            write_set(data / "held-out", n_held, seed=2)
        else:
            write_pages(data / "calibration", n_cal, seed=1)
            write_pages(data / "held-out", n_held, seed=2)
        model = ModelRepository(models).resolve(name)
        calibration, held_out, details = gather(model, [data / "calibration"],
                                                [data / "held-out"], samples=n_cal, seed=0)
        options = BackendOptions(providers=("cpu",), intra_op_threads=2,
                                 cache_dir=workdir / "cache")
        report = quantize(model, calibration, held_out, options=options, details=details,
                          latency_rounds=4 if quick else 10)
        speedup = 1 / report.latency["ratio"]
        auto = "int8" if report.accepted and speedup >= \
            model.config.quantization.auto_min_speedup else "fp32"
        shape = "x".join(str(d) for d in model.inputs[0].shape[1:])
        results["models"][name] = {"input": f"1x{shape}", "decision": report.decision,
                                   "reasons": report.reasons, "metrics": report.metrics,
                                   "latency": report.latency, "calibration": report.calibration,
                                   "settings": report.settings, "auto_on_cpu": auto,
                                   "checks": [c.__dict__ for c in report.checks]}
    return results


def format_table(r: dict[str, Any]) -> str:
    def num(value: float | None, digits: int = 3) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    lines = ["| model | calibration / held-out | FP32 acc | INT8 acc | top-1 agreement | cosine "
             "| FP32 p50 (ms) | INT8 p50 (ms) | INT8/FP32 | gate | auto on CPU |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, row in r["models"].items():
        m, lat = row["metrics"], row["latency"]
        gate = row["decision"] + (f" ({'; '.join(row['reasons'])})" if row["reasons"] else "")
        lines.append(
            f"| PP-OCR {name} {row['input']} | {row['calibration']['samples']} / "
            f"{row['calibration']['held_out']} | {num(m['fp32_accuracy'])} | "
            f"{num(m['int8_accuracy'])} | {num(m['top1_agreement'], 4)} | {num(m['cosine'], 4)} | "
            f"{lat['fp32_ms_p50']:.2f} | {lat['int8_ms_p50']:.2f} | {lat['ratio']:.2f} | "
            f"{gate} | {row['auto_on_cpu']} |")
    return "\n".join(lines)
