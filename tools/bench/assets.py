"""Where benchmarks and tests find real models: the PP-OCR ONNX files inside the
`rapidocr-onnxruntime` wheel (a test/bench dependency) and the tiny generated ones."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

PPOCR_CLS = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
PPOCR_DET = "ch_PP-OCRv4_det_infer.onnx"
PPOCR_REC = "ch_PP-OCRv4_rec_infer.onnx"


class AssetMissing(RuntimeError):
    pass


def ppocr_model(filename: str) -> Path:
    """Path of a PP-OCR model file shipped in the rapidocr-onnxruntime wheel, or in the folder
    $EDGED_PPOCR_DIR names (a host without the wheel: the GPU kit carries the files)."""
    carried = os.environ.get("EDGED_PPOCR_DIR")
    if carried and (Path(carried) / filename).is_file():
        return Path(carried) / filename
    spec = importlib.util.find_spec("rapidocr_onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissing("rapidocr-onnxruntime is not installed; `make setup` installs it "
                           "(pip install --no-deps rapidocr-onnxruntime)")
    path = Path(next(iter(spec.submodule_search_locations))) / "models" / filename
    if not path.is_file():
        raise AssetMissing(f"{path} is missing from the rapidocr-onnxruntime package")
    return path


def tiny_model_tools() -> ModuleType:
    """The tiny-model generator (tools/assets/models.py)."""
    from tools.assets import models

    return models


def cpu_model() -> str:
    """The CPU as the kernel reports it: its model name, and on x86 its family, model and
    clock (a VM may name only the vendor's line: 'AMD EPYC'); else the architecture."""
    import platform

    from edged.inference.precision import cpu_fields

    fields = cpu_fields()
    name = fields.get("model name") or fields.get("Hardware") or platform.processor() \
        or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']} model {fields['model']}"
        name += f", {float(fields['cpu MHz']):.0f} MHz)" if "cpu MHz" in fields else ")"
    return name


def run_and_report(name: str, run: Callable[[Path], dict[str, Any]],
                   table: Callable[[dict[str, Any]], str], *, out_dir: Path,
                   quick: bool) -> int:
    """Run a bench in a short temporary directory (Unix socket paths are limited to 107
    bytes), add the machine, write `<out_dir>/<name>.json` and print the table."""
    import json
    import platform
    import tempfile

    with tempfile.TemporaryDirectory(prefix="edb-", dir="/tmp") as tmp:
        results = run(Path(tmp))
    results["machine"] = machine = {"python": platform.python_version(), "cpu": cpu_model(),
                                    "cores": os.cpu_count(), "quick": quick}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=2))
    print(table(results))
    # Absolute figures move with the machine (the same VM kind has run 2x apart on two days):
    # the table says which one it came from.
    print(f"\nmachine: {machine['cpu']}, {machine['cores']} cores, Python {machine['python']}")
    print(f"\nwritten to {out_dir / f'{name}.json'}")
    return 0
