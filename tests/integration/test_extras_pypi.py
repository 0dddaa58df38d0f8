"""Every install extra resolves against PyPI alone, as `pip install '.[extra]'` would, without
installing anything (`pip install --dry-run --report`, `--isolated` from any local index and
with PyPI as the only index): edged's own dependencies plus the extra's, for the platform the
extra is for (the Jetson extras for aarch64 and JetPack's Python). The extras for this machine
are resolved together in one run (a set of requirements that resolves has every subset
resolve, and one run costs a quarter of one per extra); each Jetson extra on its own. The
`tensorrt` extra is the one exception, by name: on PyPI its libraries are a stub that fetches
them from NVIDIA's index at install time, which is why it is apart from `gpu`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PROJECT = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
EXTRAS: dict[str, list[str]] = PROJECT["project"]["optional-dependencies"]
NOT_FROM_PYPI = {"tensorrt"}
# The extra's platform where it is not this machine's: (pip platform tags, Python version).
AARCH64 = ["manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_28_aarch64",
           "manylinux_2_31_aarch64", "manylinux_2_34_aarch64", "manylinux_2_35_aarch64"]
PLATFORMS = {"jetson": (AARCH64, "3.10"), "jetson7": (AARCH64, "3.12")}  # JetPack 6, 7


def resolve(extras: list[str], work: Path) -> tuple[int, str, list[str]]:
    """pip's exit status, the end of its output, and the names it would install, for edged's
    dependencies with those of `extras` (one platform's)."""
    name = "+".join(extras)
    report = work / f"{name}.json"
    command = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run",
               "--ignore-installed", "--disable-pip-version-check", "--quiet",
               "--index-url", "https://pypi.org/simple", "--report", str(report)]
    if extras[0] in PLATFORMS:
        tags, python = PLATFORMS[extras[0]]
        command += ["--only-binary=:all:", "--python-version", python, "--implementation", "cp",
                    "--target", str(work / f"{name}-target")]
        command += [arg for tag in tags for arg in ("--platform", tag)]
    command += PROJECT["project"]["dependencies"] + [r for e in extras for r in EXTRAS[e]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=540)
    names = []
    if done.returncode == 0:
        names = [canonicalize_name(item["metadata"]["name"])
                 for item in json.loads(report.read_text())["install"]]
    return done.returncode, (done.stdout + done.stderr)[-1500:], names


def cannot(extra: str) -> str | None:
    """Why this machine cannot resolve `extra` (a build tool its sdist needs), or None."""
    if extra == "systemd":
        probe = subprocess.run(["pkg-config", "--exists", "libsystemd"], capture_output=True) \
            if shutil.which("pkg-config") else None
        if probe is None or probe.returncode != 0:
            return "systemd-python builds its metadata with pkg-config and libsystemd-dev"
    return None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_every_extra_when_resolved_against_pypi_alone_would_install(tmp_path: Path) -> None:
    extras = sorted(set(EXTRAS) - NOT_FROM_PYPI)
    skipped = {e: why for e in extras if (why := cannot(e))}
    here = [e for e in extras if e not in PLATFORMS and e not in skipped]
    runs = [here] + [[e] for e in extras if e in PLATFORMS]
    with ThreadPoolExecutor(max_workers=len(runs)) as pool:
        done = dict(zip(["+".join(r) for r in runs],
                        pool.map(lambda r: resolve(r, tmp_path), runs), strict=True))
    failed = {run: out for run, (code, out, _) in done.items() if code != 0}
    assert not failed, failed
    for run, extras_run in zip(done, runs, strict=True):
        names = set(done[run][2])
        for extra in extras_run:
            wanted = {canonicalize_name(Requirement(r).name) for r in EXTRAS[extra]}
            assert wanted <= names, (extra, sorted(wanted - names))
    host = set(done["+".join(here)][2])
    assert {"onnxruntime-gpu", "cuda-bindings", "nvidia-ml-py"} <= host
    assert not {n for n in host if n.startswith("tensorrt")}, "an extra from PyPI pulls TensorRT"
    if skipped:
        pytest.skip(f"resolved all but {skipped}")


def test_extras_only_the_tensorrt_extra_needs_nvidias_index() -> None:
    assert set(EXTRAS) >= NOT_FROM_PYPI
    for extra, lines in EXTRAS.items():
        trt = [r for r in lines if Requirement(r).name.startswith("tensorrt")]
        assert bool(trt) == (extra in NOT_FROM_PYPI), extra
