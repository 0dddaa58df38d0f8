"""tools/gpu_selftest.py runs everywhere: without a GPU every GPU section is skipped with its
reason and the self-test passes; on doubles of a GPU and TensorRT its checks really run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gpu_selftest
import pytest
from doubles import fake_cudart, fake_tensorrt
from doubles.fake_cudart import DISCRETE, FakeCudart

from edged import backends


def run(tmp_path: Path, *flags: str) -> tuple[int, dict[str, dict[str, str]]]:
    out = tmp_path / "selftest.json"
    code = gpu_selftest.main(["--models", "tiny", "--quick", "--out", str(out), *flags])
    rows = json.loads(out.read_text())["rows"]
    return code, {f"{r['section']} {r['check']}": r for r in rows}


def test_selftest_without_gpu_skips_each_gpu_section_with_its_reason(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    code, rows = run(tmp_path)
    assert code == 0
    assert "cudaErrorInsufficientDriver" in rows["memory pinned"]["detail"]
    assert rows["tensorrt tiny_cls fp16"]["status"] == "skip"
    assert "TensorRT is not installed" in rows["tensorrt tiny_cls int8"]["detail"]
    assert rows["pool tiny_cls managed"]["status"] == "skip"
    assert "cudaErrorInsufficientDriver" in rows["pool tiny_cls pinned"]["detail"]
    assert rows["timing tiny_cls b16"]["status"] == "pass"  # ORT-CPU still measured
    assert run(tmp_path, "--require-gpu")[0] == 1


def test_selftest_on_doubles_of_a_gpu_and_tensorrt_runs_every_check(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    fake_tensorrt.install(monkeypatch)
    monkeypatch.setattr(backends, "_instances", {})
    code, rows = run(tmp_path)
    assert code == 0, [r for r in rows.values() if r["status"] == "FAIL"]
    assert {rows[f"memory {k}"]["status"] for k in ("mapped", "managed", "pinned")} == {"pass"}
    assert rows["tensorrt tiny_cnn fp16"]["status"] == "pass"
    for kind in ("mapped", "managed", "pinned"):  # in place, 2 instances, 2 threads
        assert rows[f"pool tiny_cls {kind}"]["status"] == "pass", rows[f"pool tiny_cls {kind}"]
        assert rows[f"pool tiny_cls {kind}"]["data"]["batches"] == 2 * 3 * 2  # 1 and 16 rows
    assert "engine built in" in rows["tensorrt tiny_cls fp16"]["detail"]
    assert "TensorRT fp16" in rows["timing tiny_cls b16"]["data"]["p50_ms"]
    assert "edged quantize" in rows["tensorrt tiny_cls int8"]["detail"]  # no variant: skipped
