"""The install extras name wheels each platform can run: the Jetson extras' cuda-python must
match the CUDA major JetPack ships (12 on JetPack 6, 13 on JetPack 7), or the GPU is silently
not found; the discrete-GPU extra takes CUDA 13 wheels throughout."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def extra(name: str) -> dict[str, Requirement]:
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return {(r := Requirement(line)).name: r for line in extras[name]}


@pytest.mark.parametrize(("name", "allowed", "refused"), [
    ("jetson", ["12.6.1", "12.6.2.post1", "12.9.4"], ["12.2.1", "12.6.0", "13.0.0", "13.1.1"]),
    ("jetson7", ["13.0.0", "13.1.1"], ["12.9.4", "14.0.0"]),
    ("gpu", ["13.0.0"], ["12.9.4"]),
])
def test_extra_cuda_python_matches_the_platforms_cuda_major(name: str, allowed: list[str],
                                                            refused: list[str]) -> None:
    spec = extra(name)["cuda-python"].specifier
    assert all(spec.contains(v) for v in allowed), (name, str(spec))
    assert not any(spec.contains(v) for v in refused), (name, str(spec))


def test_jetpack_6_extra_keeps_numpy_1_for_jetpacks_opencv_and_tensorrt() -> None:
    spec = extra("jetson")["numpy"].specifier
    assert spec.contains("1.26.4") and not spec.contains("2.0.0")


def test_no_jetson_extra_brings_an_opencv_wheel_that_would_shadow_jetpacks() -> None:
    for name in ("jetson", "jetson7"):
        assert not any(n.startswith("opencv") for n in extra(name))
