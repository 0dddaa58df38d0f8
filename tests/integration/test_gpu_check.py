"""The device check's end-to-end section (tools/gpu_check/daemon_e2e.py) is the same code on a
GPU host and here: without CUDA it runs `edged run` on the CPU EP, with a real mosquitto, and
every row passes saying it ran on the CPU fallback, so the one prepared GPU run cannot fail on
a defect of the check itself. Where a GPU is required, a daemon on the CPU is a failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doubles import fake_cudart
from doubles.fake_cudart import FakeCudart

from tools import gpu_selftest
from tools.gpu_check.daemon_e2e import E2E
from tools.gpu_check.report import CUDA_EP, Report


def test_device_check_daemon_section_when_no_gpu_passes_on_the_cpu_fallback(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_cudart.install(monkeypatch, FakeCudart(driver=False))
    out, log = tmp_path / "check.json", tmp_path / "logs" / "edged-e2e.log"
    code = gpu_selftest.main(["--models", "tiny", "--sections", "env,daemon", "--out",
                              str(out), "--daemon-log", str(log)])
    rows = {r["check"]: r for r in json.loads(out.read_text())["rows"]
            if r["section"] == "daemon"}
    assert code == 0, rows
    for check in ("edged run", "stream events", "shm requests", "ota swap"):
        assert rows[check]["status"] == "pass", rows[check]
        assert "CPUExecutionProvider (the CPU fallback" in rows[check]["detail"], check
    assert rows["shm requests"]["data"]["requests"] == 64
    assert rows["ota swap"]["data"]["failed"] == 0
    assert rows["stream events"]["data"]["events"] >= 6  # three objects: new and end each
    assert rows["gpu metrics"]["status"] == "skip"
    assert "grid_det" in log.read_text()  # the daemon's log is kept for the results


@pytest.mark.parametrize(("providers", "required", "ok"), [
    ([CUDA_EP, "CPUExecutionProvider"], True, True),
    (["CPUExecutionProvider"], False, True),
    (["CPUExecutionProvider"], True, False),
    ([], True, False),
])
def test_e2e_where_when_a_gpu_is_required_a_model_on_the_cpu_fails(
        providers: list[str], required: bool, ok: bool, tmp_path: Path) -> None:
    ctx = E2E(Report(), tmp_path, tmp_path / "s.sock", required)
    ctx.providers = providers
    assert ctx.where()[0] is ok
