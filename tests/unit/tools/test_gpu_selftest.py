"""tools/gpu_selftest.py runs everywhere: without a GPU every GPU section is skipped with its
reason (TensorRT's rows saying it cannot be had from PyPI) and the self-test passes; on doubles
of a GPU and TensorRT its checks really run, the daemon's pools included; its JSON goes under
the repository's git-ignored results folder unless told otherwise, never into the current
directory."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from doubles import fake_cudart, fake_tensorrt
from doubles.fake_cudart import DISCRETE, FakeCudart

from edged import backends
from edged.hardware import host
from tools import gpu_selftest
from tools.gpu_check.report import NOT_ON_PYPI

# The daemon end to end has a test of its own (tests/integration/test_gpu_check.py).
NO_DAEMON = ",".join(s for s in gpu_selftest.SECTIONS if s != "daemon")


def run(tmp_path: Path, *flags: str) -> tuple[int, dict[str, dict[str, str]]]:
    out = tmp_path / "selftest.json"
    code = gpu_selftest.main(["--models", "tiny", "--quick", "--sections", NO_DAEMON,
                              "--out", str(out), *flags])
    rows = json.loads(out.read_text())["rows"]
    return code, {f"{r['section']} {r['check']}": r for r in rows}


def test_selftest_without_gpu_skips_each_gpu_section_with_its_reason(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    code, rows = run(tmp_path)
    assert code == 0
    assert "cudaErrorInsufficientDriver" in rows["memory pinned"]["detail"]
    for key in ("tensorrt tiny_cls fp16", "tensorrt tiny_cls int8", "env tensorrt",
                "pool tiny_cls mapped tensorrt", "timing tiny_cls TensorRT fp16"):
        assert rows[key]["status"] == "skip", key
    assert rows["tensorrt tiny_cls int8"]["detail"].startswith(NOT_ON_PYPI)
    assert rows["env tensorrt"]["detail"].startswith(NOT_ON_PYPI)
    assert "CPU build" in rows["chain tiny_cls"]["detail"]  # CPU onnxruntime: no CUDA EP
    assert "CPU build" in rows["int8 tiny_cnn"]["detail"]
    assert "cudaErrorInsufficientDriver" in rows["pool tiny_cls pinned tensorrt"]["detail"]
    # The daemon's own path runs on the CPU EP where no CUDA is, saying so.
    pool = rows["daemon-pool tiny_cls memory=pinned"]
    assert pool["status"] == "pass" and "CPU fallback" in pool["detail"]
    assert rows["timing tiny_cls b16"]["status"] == "pass"  # ORT-CPU still measured
    assert run(tmp_path, "--require-gpu")[0] == 1


def test_selftest_when_cuda_sees_a_gpu_that_nvml_does_not_fails_the_nvml_row(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    monkeypatch.setattr(host, "gpus", list)
    code, rows = run(tmp_path)
    assert code == 1 and rows["env NVML"]["status"] == "FAIL"
    assert "/metrics" in rows["env NVML"]["detail"]


def test_selftest_when_gpu_required_and_absent_fails_and_skips_the_daemon_pool(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    code, rows = run(tmp_path, "--require-gpu")
    assert code == 1 and rows["env --require-gpu"]["status"] == "FAIL"
    assert rows["daemon-pool tiny_cls memory=auto"]["status"] == "skip"


def test_selftest_on_doubles_of_a_gpu_and_tensorrt_runs_every_check(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = fake_cudart.install(monkeypatch, FakeCudart(DISCRETE))
    fake_tensorrt.install(monkeypatch)
    monkeypatch.setattr(backends, "_instances", {})
    monkeypatch.setattr(host, "gpus", lambda: [host.GpuStats(0, "NVIDIA Fake RTX", 1 << 30,
                                                             8 << 30, 3)])
    code, rows = run(tmp_path)
    assert code == 0, [r for r in rows.values() if r["status"] == "FAIL"]
    assert "1024 of 8192 MiB used" in rows["env NVML"]["detail"]
    assert {rows[f"memory {k}"]["status"] for k in ("mapped", "managed", "pinned")} == {"pass"}
    assert rows["tensorrt tiny_cnn fp16"]["status"] == "pass"
    for kind in ("mapped", "managed", "pinned"):  # in place, 2 instances, 2 threads
        row = rows[f"pool tiny_cls {kind} tensorrt"]
        assert row["status"] == "pass", row
        assert row["data"]["batches"] == 2 * 3 * 2  # 1 and 16 rows
    assert "engine built in" in rows["tensorrt tiny_cls fp16"]["detail"]
    assert "TensorRT fp16" in rows["timing tiny_cls b16"]["data"]["p50_ms"]
    assert "edged quantize" in rows["tensorrt tiny_cls int8"]["detail"]  # no variant: skipped
    # The daemon's pools on the double's device memory: batches of several requests, each
    # answer equal to ONNX Runtime's on the CPU.
    for strategy, kind in (("auto", "pinned"), ("pinned", "pinned"), ("mapped", "mapped"),
                           ("managed", "managed"), ("host", "host")):
        row = rows[f"daemon-pool tiny_cls memory={strategy}"]
        assert row["status"] == "pass", row
        assert row["detail"].startswith(f"{kind} pool")
        assert row["data"]["batches"] < row["data"]["rows"] == gpu_selftest.ort_paths.REQUESTS
    assert fake.live() == 0  # every pool buffer given back


def test_selftest_by_default_writes_under_the_results_folder_not_the_current_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    results = tmp_path / "repo" / "bench-results" / "gpu-selftest.json"
    monkeypatch.setattr(gpu_selftest, "RESULTS", results)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    assert gpu_selftest.main(["--models", "tiny", "--quick", "--sections", "env"]) == 0
    assert os.listdir(cwd) == []
    assert json.loads(results.read_text())["ok"] is True


def test_selftest_default_results_folder_is_ignored_by_git() -> None:
    ignored = (Path(gpu_selftest.ROOT) / ".gitignore").read_text().splitlines()
    assert "/bench-results/" in ignored
    assert gpu_selftest.RESULTS.parent == gpu_selftest.ROOT / "bench-results"
