"""The GPU suite's parts that only a GPU host runs for real, exercised here where they can be:
the copies through edged's buffers on the CUDA runtime's double (every buffer given back), the
YOLO-sized detector read by edged as the YOLOv8 export it imitates, and the tables and the
results record drawn from a GPU run's JSON (the shape a real run writes), so the one prepared
run on a GPU host cannot end in a formatting error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from doubles import fake_cudart
from doubles.fake_cudart import DISCRETE, FakeCudart

from edged.model.repository import ModelRepository
from tools.bench import gpu as bench_gpu
from tools.bench.gpu_copies import bandwidths
from tools.bench.gpu_models import YOLO_YAML, yolo_sized
from tools.gpu_check import results

GPU_RUN = {
    "device": "NVIDIA H100 80GB HBM3", "dry_run": None, "imgsz": 640,
    "providers": ["cuda", "cpu"], "yolo_gflops": 5.4, "window_s": 1.0, "rounds": 2,
    "copies": {"size_mb": 64, "repeats": 10, "pinned_over_pageable": 2.5,
               "gb_per_s": {"pinned_h2d": 50.0, "pageable_h2d": 20.0, "pinned_d2h": 50.0,
                            "mapped_read": 40.0},
               "cuda_ep_reads": {"size_mb": 64, **{k: {"ms": 1.0, "gb_per_s": 60.0,
                                                       "sum_ok": True}
                                                   for k in ("device", "mapped", "pinned_copy",
                                                             "numpy")}}},
    "cuda_vs_cpu": [{"model": m, "batch": b, "cuda_p50_ms": 1.0, "cpu_p50_ms": 20.0,
                     "speedup": 20.0, "runs_on": "CUDAExecutionProvider"}
                    for m in ("cls", "yolo") for b in (1, 8)],
    "batching": [{"model": m, "clients": c, "on_per_s": 900.0, "off_per_s": 300.0,
                  "gain": 3.0, "mean_batch_on": 6.0, "direct_b16_per_s": 1200.0 if c == 16
                  else None} for m in ("cls", "yolo") for c in (1, 8, 16)],
    "edged_vs_direct": [{"model": m, "clients": c, "edged_per_s": 500.0, "direct_per_s": 600.0,
                         "ratio": 0.83, "edged_p50_ms": 1.5,
                         "runs_on": "CUDAExecutionProvider"}
                        for m in ("cls", "yolo") for c in (1, 8)],
    "pipeline": [{"model_on": p, "frames": 120, "fps": 30.0, "offered_fps": 30.0,
                  "cpu_ms_per_frame": 6.0, "cores_busy": 0.18}
                 for p in ("CUDAExecutionProvider", "CPUExecutionProvider")],
}


def test_bandwidths_on_the_runtime_double_measure_each_copy_and_give_every_buffer_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fake = fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    result = bandwidths(size_mb=1, repeats=2)
    assert set(result["gb_per_s"]) == {"pinned_h2d", "pageable_h2d", "pinned_d2h",
                                       "mapped_read"}
    assert all(v > 0 for v in result["gb_per_s"].values())
    assert "CPU build" in result["cuda_ep_reads"]["skipped"]  # onnxruntime here has no CUDA EP
    assert fake.live() == 0 and not fake.streams


def test_yolo_sized_detector_when_served_is_read_as_a_yolov8_export(tmp_path: Path) -> None:
    model, gflops = yolo_sized(160)
    assert 0.2 < gflops < 1.0  # 640x640 is 16x that: the size of a small real detector
    (tmp_path / "yolo" / "1").mkdir(parents=True)
    onnx.save(model, str(tmp_path / "yolo" / "1" / "model.onnx"))
    (tmp_path / "yolo" / "model.yaml").write_text(YOLO_YAML.format(batch=16))
    version = ModelRepository(tmp_path).resolve("yolo")
    assert version.max_batch_size == 16
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"images": np.zeros((2, 3, 160, 160), np.float32)})
    assert out.shape == (2, 84, 20 * 20 + 10 * 10 + 5 * 5)


def test_gpu_tables_and_results_when_drawn_from_a_gpu_run_name_every_measurement(
        tmp_path: Path) -> None:
    table = bench_gpu.format_table(GPU_RUN)
    assert "DRY RUN" not in table and "NVIDIA H100" in table
    for words in ("pinned / pageable | 2.50x", "in mapped host memory, in place",
                  "| yolo | 8 | 1.000 | 20.00 | 20.0x |", "| cls | 16 | 900 (6.0) | 300 | 3.00x",
                  "| yolo (CUDAExecutionProvider) | 8 |", "| CPUExecutionProvider | 30.0 |"):
        assert words in table, words
    (tmp_path / "gpu.json").write_text(json.dumps(GPU_RUN))
    (tmp_path / "selftest.json").write_text(json.dumps({
        "ok": True, "counts": {"pass": 1, "FAIL": 0, "skip": 1},
        "machine": {"device": {"name": "NVIDIA H100 80GB HBM3"}, "driver": "580.1",
                    "cuda": {"runtime": "13.0", "driver": "13.0"}, "onnxruntime": "1.31.1",
                    "python": "3.12.3"},
        "rows": [{"section": "env", "check": "CUDA device", "status": "pass",
                  "detail": "NVIDIA H100 | sm 9.0"},
                 {"section": "tensorrt", "check": "tiny_cls fp16", "status": "skip",
                  "detail": "not runnable here: TensorRT libraries are not on PyPI"}]}))
    (tmp_path / "pytest-gpu.txt").write_text("...\n==== 7 passed, 2 skipped in 9.1s ====\n")
    assert results.main(["results.py", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "gpu-results.json").read_text())
    assert doc["device"] == "NVIDIA H100 80GB HBM3" and doc["pytest_gpu"] == \
        "7 passed, 2 skipped in 9.1s"
    summary = (tmp_path / "summary.md").read_text()
    assert "driver 580.1, CUDA runtime 13.0" in summary
    assert "| env | 1 | 0 | 0 |" in summary and "| tensorrt | 0 | 0 | 1 |" in summary
    assert "NVIDIA H100 / sm 9.0" in summary  # a | in a detail does not break the table
    assert "| cls | 16 | 900 (6.0) | 300 | 3.00x" in summary
