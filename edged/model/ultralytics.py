"""Ultralytics exports' own pre-processing, as its predictors feed them.

Detectors, segmenters and pose models go through `LetterBox`: centred, grey 114, the scaled
size rounded, INTER_LINEAR, RGB, 0..1. Classifiers go through `classify_transforms(imgsz)`
(ultralytics/data/augment.py; ClassificationPredictor.setup_source picks it for every
exported format, imgsz from the export's metadata): torchvision's `Resize` and `CenterCrop`
on a PIL image, then `ToTensor` (RGB, 1/255) and `Normalize` with mean 0 and std 1. A square
imgsz resizes the short side (`Resize(S)`: the short side S, the long `int(S * long /
short)`) and cuts the S x S middle (`CenterCrop`: offsets `int(round((w - S) / 2))`); a
non-square one resizes to it (`Resize((h, w))`), which the crop then leaves whole. Both
resize with Pillow's BILINEAR, which on a PIL image is antialiased (a triangle filter widened
by the shrink factor): edged's `pillow_bilinear` (edged.processing.resample). 8.4's split
path (the resize and crop on the uint8 BGR array through `Image.fromarray`, then the flip to
RGB and / 255 on the device) makes the same pixels: Pillow resizes each channel alike.
"""

from __future__ import annotations

from typing import Any

# Ultralytics' LetterBox and its predictor: centred, grey 114, RGB, 0..1, no mean/std.
# LetterBox rounds the scaled size (int(round(...))) and resizes with INTER_LINEAR.
ULTRALYTICS_DETECT: dict[str, Any] = {
    "keep_ratio": True, "pad": "center", "pad_value": 114.0, "color": "rgb", "scale": 1 / 255,
    "mean": [0.0], "std": [1.0], "layout": "nchw", "interpolation": "linear",
    "rounding": "round"}
ULTRALYTICS_CLASSIFY: dict[str, Any] = {
    "keep_ratio": False, "color": "rgb", "scale": 1 / 255, "mean": [0.0], "std": [1.0],
    "layout": "nchw", "interpolation": "pillow_bilinear"}
# The crop's keys: a model.yaml that states its own resize takes none of them.
CROP_KEYS = ("resize_short", "crop", "crop_offset", "rounding")
SQUASH_KEYS = ("resize", "keep_ratio")


def classify_crop(size: tuple[int, int] | None) -> dict[str, Any]:
    """The crop keys for a classifier of tensor `size` (width, height): the short side and
    centre crop for a square one, none (a plain resize) for another or an unknown size."""
    if size is None or size[0] != size[1]:
        return {}
    return {"resize_short": size[0], "crop": "center", "crop_offset": "round",
            "rounding": "floor"}


def classify_reason(size: tuple[int, int] | None, crop: bool, stated: str | None) -> str:
    """What the classifier's pre-processing is and why, for the model config API."""
    head = "Ultralytics classify export (metadata task classify): its predictor's " \
           "classify_transforms"
    tail = "Pillow's antialiased bilinear, RGB, 1/255, mean 0 std 1"
    if crop and size is not None:
        return (f"{head}: short side {size[0]} (torchvision Resize({size[0]})), centre crop "
                f"{size[0]}x{size[1]} (offsets rounded), {tail}")
    if stated:
        return f"{head}, its resize and crop left out: model.yaml states {stated}; {tail}"
    if size is None:
        return f"{head}; no fixed size to crop to (neither imgsz nor the input says one); {tail}"
    return (f"{head}: resize {size[0]}x{size[1]} (torchvision Resize(({size[1]}, "
            f"{size[0]})): a non-square imgsz is resized to, not cropped), {tail}")
