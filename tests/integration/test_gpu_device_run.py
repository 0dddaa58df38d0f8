"""The one command prepared for a GPU host (tools/gpu_device_run.sh) runs end to end here as
its dry run: the carried extras (a mosquitto, PP-OCR cls, the commit) unpacked and used, the
device check's GPU rows skipped with their reasons and the rest passing on the CPU, the
results recorded in the files that come back. Both scripts are shellcheck-clean."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ["tools/gpu_device_run.sh", "tools/gpu_kit.sh"]


def test_gpu_scripts_when_shellchecked_are_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    result = subprocess.run([shellcheck, *SCRIPTS], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gpu_device_run_when_dry_run_records_every_step_and_passes(tmp_path: Path) -> None:
    mosquitto = shutil.which("mosquitto")
    if mosquitto is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    from tools.bench.assets import PPOCR_CLS, ppocr_model

    kit = tmp_path / "kit"
    kit.mkdir()
    with tarfile.open(kit / "edged-gpu-extras.tar.xz", "w:xz") as tar:
        tar.add(mosquitto, "bin/mosquitto")
        tar.add(ppocr_model(PPOCR_CLS), f"ppocr/{PPOCR_CLS}")
        commit = tmp_path / "commit.txt"
        commit.write_text("0123abcd\n")
        tar.add(commit, "commit.txt")
    out = tmp_path / "out"
    env = {**os.environ, "DRY_RUN": "1", "PY": sys.executable, "KIT": str(kit),
           "OUT": str(out), "SITE": str(tmp_path / "site"), "STEPS": "selftest,pytest"}
    done = subprocess.run(["bash", "tools/gpu_device_run.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert {p.name for p in out.iterdir()} == {"run.log", "selftest.json", "edged-e2e.log",
                                               "pytest-gpu.txt", "gpu-results.json",
                                               "summary.md"}
    log = (out / "run.log").read_text()
    assert f"{tmp_path}/site-extras/bin/mosquitto" in log  # the carried broker is the one used
    doc = json.loads((out / "gpu-results.json").read_text())
    assert doc["commit"] == "0123abcd" and doc["selftest"]["ok"] is True
    rows = {f"{r['section']} {r['check']}": r for r in doc["selftest"]["rows"]}
    assert rows["ort-cuda ppocr_cls"]["status"] == "skip"  # the carried model was found
    assert rows["daemon ota swap"]["status"] == "pass"
    assert "passed" in doc["pytest_gpu"] or "skipped" in doc["pytest_gpu"]
    assert "## Device check" in (out / "summary.md").read_text()


def test_gpu_device_run_when_the_kit_comes_in_two_halves_joins_them_on_the_second_call(
        tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "module.py").write_bytes(os.urandom(200_000))  # incompressible: two real halves
    whole = tmp_path / "whole.tar.xz"
    with tarfile.open(whole, "w:xz") as tar:
        tar.add(source / "module.py", arcname="module.py")
    data = whole.read_bytes()
    kit = tmp_path / "kit"
    kit.mkdir()
    half = (len(data) + 1) // 2
    env = {**os.environ, "KIT": str(kit), "SITE": str(tmp_path / "site"),
           "OUT": str(tmp_path / "out"), "PARTS": str(tmp_path / "parts"), "UNPACK_ONLY": "1"}

    def call(name: str, part: bytes) -> str:
        for old in kit.iterdir():  # a call carries only what it is given
            old.unlink()
        (kit / name).write_bytes(part)
        done = subprocess.run(["bash", "tools/gpu_device_run.sh"], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    first = call("edged-gpukit-site.tar.xz.part0", data[:half])
    assert "call again with the other half" in first
    assert not (tmp_path / "site" / "module.py").exists()
    call("edged-gpukit-site.tar.xz.part1", data[half:])
    assert (tmp_path / "site" / "module.py").read_bytes() == (source / "module.py").read_bytes()
