"""On a machine with an NVIDIA GPU: the device check's GPU sections (tools/gpu_check) pass, so
`pytest tests/gpu` there runs the same checks as `tools/gpu_selftest.py --require-gpu`: each
pool kind reaching the device, the CUDA EP against the CPU EP, the provider chain dropping a
TensorRT EP that cannot start, IOBinding from the pools, every memory strategy on the daemon's
own path, INT8 and `precision: auto` on the CUDA EP. NVML reports the GPU (/metrics reads it).
Skipped, with the reason printed, everywhere else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edged.hardware import gpu, host
from tools import gpu_selftest

SECTIONS = "env,memory,ort-cuda,chain,iobind,daemon-pool,int8"


@pytest.mark.gpu
def test_device_check_when_gpu_present_every_gpu_section_passes(tmp_path: Path) -> None:
    if gpu.device() is None:
        pytest.skip(f"no usable CUDA device: {gpu.unavailable_reason()}")
    out = tmp_path / "check.json"
    code = gpu_selftest.main(["--models", "tiny", "--quick", "--sections", SECTIONS,
                              "--require-gpu", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    failed = [r for r in rows if r["status"] == "FAIL"]
    assert code == 0 and not failed, failed
    ran = {r["section"] for r in rows if r["status"] == "pass"}
    assert {"memory", "ort-cuda", "chain", "iobind", "daemon-pool", "int8"} <= ran, ran


@pytest.mark.gpu
def test_nvml_when_gpu_present_reports_its_memory() -> None:
    pytest.importorskip("pynvml", reason="nvidia-ml-py is not installed (the `gpu` extra)")
    if gpu.device() is None:
        pytest.skip(f"no usable CUDA device: {gpu.unavailable_reason()}")
    (first, *_) = host.gpus()
    assert first.memory_total_bytes > first.memory_used_bytes > 0
