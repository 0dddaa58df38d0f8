"""The real cuda-python and TensorRT bindings for the API conformance suite: each installed
once with pip into its own folder under .cache/gpu-api/ (reused by later runs), the TensorRT
libraries they link replaced by C stubs built here with `cc -shared`. Whatever cannot be
installed or built is skipped with the reason. The real modules are only ever imported in a
subprocess (probe.py), with that folder on PYTHONPATH and the stubs on LD_LIBRARY_PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "gpu-api"
PROBE = Path(__file__).with_name("probe.py")
INSTALL_TIMEOUT_S = 300


@dataclass(frozen=True)
class Target:
    name: str
    requirement: str
    library: str  # cuda | tensorrt
    so_version: str = ""  # the TensorRT libraries' soname version the bindings link
    deps: bool = False


# cuda-python 13 (the `gpu` extra) and 12 (JetPack 6); TensorRT 10.13 and 11 for CUDA 13 (the
# `gpu` extra allows 10.x; 11 drops the precision flags), 10.3 for CUDA 12 (JetPack 6).
TARGETS = [
    Target("cuda-13", "cuda-bindings==13.*", "cuda", deps=True),
    Target("cuda-12", "cuda-bindings==12.*", "cuda", deps=True),
    Target("trt-10.13-cu13", "tensorrt-cu13-bindings==10.13.*", "tensorrt", "10"),
    Target("trt-11-cu13", "tensorrt-cu13-bindings==11.*", "tensorrt", "11"),
    Target("trt-10.3-cu12", "tensorrt-cu12-bindings==10.3.*", "tensorrt", "10"),
]

# The symbols the bindings import from each library (10.x and 11.x alike); the stubs return
# null pointers and zeros: enough to import the module and read it, not to run anything.
STUBS = {
    "libnvinfer": ["createInferBuilder_INTERNAL", "createInferRuntime_INTERNAL",
                   "createInferRefitter_INTERNAL", "getPluginRegistry",
                   "getBuilderPluginRegistry", "getInferLibVersion"],
    "libnvonnxparser": ["createNvOnnxParser_INTERNAL", "createNvOnnxParserRefitter_INTERNAL",
                        "getNvOnnxParserVersion"],
    "libnvinfer_plugin": ["initLibNvInferPlugins"],
}


def install(target: Target) -> Path:
    """The folder holding `target` installed, installing it on first use; skip if pip can't."""
    folder = CACHE / target.name
    stamp = folder / ".installed"
    if stamp.exists() and stamp.read_text() == target.requirement:
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
               "--target", str(folder), *([] if target.deps else ["--no-deps"]),
               target.requirement]
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        pytest.skip(f"{target.requirement}: pip took over {INSTALL_TIMEOUT_S}s (offline?)")
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if not line.startswith("WARNING")]
        pytest.skip(f"{target.requirement} cannot be installed here: "
                    f"{(lines or ['pip failed'])[-1][:200]}")
    stamp.write_text(target.requirement)
    return folder


def build_stubs(folder: Path, so_version: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build the TensorRT library stubs")
    out = folder / f"so{so_version}"
    out.mkdir(parents=True, exist_ok=True)
    for library, symbols in STUBS.items():
        source = folder / f"{library}.c"
        source.write_text("".join(f"void *{name}(void) {{ return 0; }}\n" for name in symbols))
        target = out / f"{library}.so.{so_version}"
        done = subprocess.run([cc, "-shared", "-fPIC", "-o", str(target), str(source)],
                              capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            pytest.skip(f"cc could not build {target.name}: {done.stderr.strip()[-200:]}")
    return out


def probe(target: Target, folder: Path, stubs: Path | None, request: dict[str, Any]
          ) -> dict[str, Any]:
    """Run probe.py against the real module of `target`; its JSON answer."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env["PYTHONPATH"] = os.pathsep.join([str(folder), str(ROOT)])
    if stubs is not None:
        env["LD_LIBRARY_PATH"] = str(stubs)
    done = subprocess.run([sys.executable, str(PROBE), target.library], env=env,
                          input=json.dumps(request), capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, f"probe of {target.name} failed:\n{done.stderr[-3000:]}"
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer
