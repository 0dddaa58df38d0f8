"""`edged quantize` end to end on this CPU: the real PP-OCR cls model calibrated on text lines
rendered by OpenCV (upright and rotated 180°, its real task) and gated on a held-out rendered
set; a gate that cannot pass; input errors; calibration frames from a video file."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.backends import options
from support.models import write_yaml

from edged.cli import main
from edged.core.errors import ModelLoadError
from edged.inference.cache import ModelCache
from edged.inference.precision import int8_variant
from edged.model.int8_report import ACCEPTED_FILE, REFUSED_FILE, read_report
from edged.model.repository import ModelRepository
from tools.assets import models as test_models
from tools.bench.textlines import PPOCR_CLS_PREPROCESS, write_set


def test_quantize_when_ppocr_cls_calibrated_on_rendered_lines_reports_accuracy_and_gate(
        ppocr_cls: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    yaml = ppocr_cls / "cls" / "model.yaml"
    yaml.write_text(yaml.read_text() + PPOCR_CLS_PREPROCESS + "\npostprocess: {kind: classify}\n")
    write_set(tmp_path / "calibration", 64, seed=1)
    write_set(tmp_path / "held-out", 128, seed=2)

    code = main(["quantize", "cls", "--models-dir", str(ppocr_cls), "--calibration",
                 str(tmp_path / "calibration"), "--held-out", str(tmp_path / "held-out")])

    version_dir = ppocr_cls / "cls" / "1"
    report = read_report(version_dir)
    assert report is not None
    m, lat = report.metrics, report.latency
    # The real model reads most rendered lines right: the renderer does the model's task.
    assert m["fp32_accuracy"] is not None and m["fp32_accuracy"] >= 0.8
    assert m["int8_accuracy"] is not None and m["int8_accuracy"] >= 0.7
    assert m["top1_agreement"] is not None and 0 <= m["top1_agreement"] <= 1
    assert lat["fp32_ms_p50"] > 0 and lat["int8_ms_p50"] > 0
    assert lat["ratio"] == pytest.approx(lat["int8_ms_p50"] / lat["fp32_ms_p50"])
    assert (report.calibration["samples"], report.calibration["held_out"]) == (64, 128)
    assert report.settings["opset"] == 17 and report.settings["per_channel"] is True
    # The decision follows the thresholds (default: top-1 agreement >= 0.98), whichever it is.
    assert [c.name for c in report.checks] == ["min_top1_agreement"]
    assert report.accepted == (m["top1_agreement"] >= 0.98)
    assert code == (0 if report.accepted else 1)
    assert (version_dir / report.file).is_file()
    assert report.file == (ACCEPTED_FILE if report.accepted else REFUSED_FILE)
    model = ModelRepository(ppocr_cls).resolve("cls")
    assert int8_variant(model) == (version_dir / ACCEPTED_FILE if report.accepted else None)
    out, err = capsys.readouterr()
    assert f"INT8 variant {report.decision.upper()}" in out and "FP32" in out
    assert "calibrating 64/64" in err and "comparing 128/128" in err


def test_quantize_when_the_gate_cannot_pass_exits_1_and_keeps_int8_disabled(
        repo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # INT8 outputs never equal FP32's exactly: a zero error bound refuses every variant.
    write_yaml(repo_dir, "tiny_cnn", test_models.MODEL_YAML["tiny_cnn"] +
               "precision: int8\nquantization: {max_mean_abs_error: 0}\n")
    rng = np.random.default_rng(0)
    np.save(tmp_path / "samples.npy", rng.standard_normal((24, 3, 8, 8)).astype(np.float32))

    code = main(["quantize", "tiny_cnn", "--models-dir", str(repo_dir), "--calibration",
                 str(tmp_path / "samples.npy"), "--seed", "3"])

    assert code == 1
    version_dir = repo_dir / "tiny_cnn" / "1"
    report = read_report(version_dir)
    assert report is not None and not report.accepted
    assert any(r.startswith("max_mean_abs_error:") for r in report.reasons)
    assert report.calibration["samples"] + report.calibration["held_out"] == 24
    assert not (version_dir / ACCEPTED_FILE).exists() and (version_dir / REFUSED_FILE).is_file()
    assert "REFUSED" in capsys.readouterr().out
    repo = ModelRepository(repo_dir)
    assert int8_variant(repo.resolve("tiny_cnn")) is None
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    try:
        with pytest.raises(ModelLoadError, match=r"refused.*model\.int8\.report\.json"):
            cache.load("tiny_cnn")
    finally:
        cache.close()

    # Looser thresholds: the same command accepts, and the refused file goes.
    write_yaml(repo_dir, "tiny_cnn", test_models.MODEL_YAML["tiny_cnn"] +
               "quantization: {min_top1_agreement: 0.5}\n")
    assert main(["quantize", "tiny_cnn", "--models-dir", str(repo_dir), "--calibration",
                 str(tmp_path / "samples.npy")]) == 0
    assert (version_dir / ACCEPTED_FILE).is_file() and not (version_dir / REFUSED_FILE).exists()
    assert json.loads((version_dir / "model.int8.report.json").read_text())["decision"] == \
        "accepted"


@pytest.mark.parametrize("args", [
    ["tiny_cls"],  # no calibration samples at all
    ["tiny_cls", "--calibration", "{tmp}/absent"],
    ["absent_model", "--calibration", "{tmp}"],
    ["tiny_cls", "--calibration", "{tmp}", "--frames", "0"],
])
def test_quantize_when_input_is_wrong_exits_2_and_writes_nothing(
        repo_dir: Path, tmp_path: Path, args: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "one.npy", np.zeros((3, 8, 8), np.float32))
    argv = ["quantize", *[a.format(tmp=tmp_path) for a in args], "--models-dir", str(repo_dir)]
    assert main(argv) == 2
    assert "edged quantize:" in capsys.readouterr().err
    assert not (repo_dir / "tiny_cls" / "1" / "model.int8.report.json").exists()


def test_quantize_when_calibrating_from_a_stream_reads_its_frames(
        repo_dir: Path, tmp_path: Path) -> None:
    video = tmp_path / "colors.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 25, (80, 60))
    rng = np.random.default_rng(0)
    for _ in range(40):
        writer.write(rng.integers(0, 256, (60, 80, 3), dtype=np.uint8))
    writer.release()

    code = main(["quantize", "colors", "--models-dir", str(repo_dir), "--calibration-stream",
                 f"file://{video}", "--frames", "16", "--frame-step", "2"])

    report = read_report(repo_dir / "colors" / "1")
    assert report is not None and code == (0 if report.accepted else 1)
    assert report.calibration["sources"] == [f"file://{video}"]
    assert report.calibration["samples"] + report.calibration["held_out"] == 16
