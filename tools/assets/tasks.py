"""Exporter-faithful tiny exports of the tasks beyond boxes, for tests and the mask benchmark:
outputs named, shaped and laid out as Ultralytics' exporter writes them (a YOLO-seg export's
`output0` [1, 4+C+32, N] beside `output1` [1, 32, H/4, W/4]; a YOLO-pose export's `output0`
[1, 4+1+17*3, N]; a YOLO-cls export's `output0` [1, C] softmax; their metadata: author, task,
stride, imgsz, names, kpt_shape), around one answer a test can compute: the lit pixels of a
dark frame (`tools.assets.models`' bright box), the colour a classifier sees.

No wheel on PyPI was found to ship a trained YOLO-seg, YOLO-pose, YOLO-cls or
semantic-segmentation ONNX export (docs/models.md): these stand in for them, the masks held to
a numpy port of Ultralytics' own `process_mask` (tests/support/ultralytics_masks.py), the
classifier's tensor to a port of its `classify_transforms`
(tests/support/ultralytics_classify.py). The DeepLab-style class
map (`semantic`) comes with its labels file and stated pre-processing, as such exports need.

    python -m tools.assets.tasks DIR      # writes DIR/<name>/1/model.onnx for each
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tools.assets.models import (
    _N,
    DETECT_NAMES,
    DETECT_SIZE,
    _bright_box,
    _const,
    _rows,
    build_model,
    declare_float,
    write_model,
)

GRID = 84  # YOLOv8's candidates for a 64 x 64 input: 8x8 + 4x4 + 2x2
MASKS = 32  # Ultralytics' prototype count
PROTO = DETECT_SIZE // 4  # its prototypes are a quarter of the input's size
KPT_SHAPE = (17, 3)
# Where each of the 17 points sits in the lit box: (fraction of its width, of its height),
# and the visibility score the export gives it (after the head's sigmoid).
POINTS = [(0.5, 0.1, 0.95), (0.4, 0.05, 0.9), (0.6, 0.05, 0.9), (0.3, 0.1, 0.4),
          (0.7, 0.1, 0.4), (0.2, 0.3, 0.95), (0.8, 0.3, 0.95), (0.1, 0.5, 0.8),
          (0.9, 0.5, 0.8), (0.05, 0.7, 0.6), (0.95, 0.7, 0.6), (0.3, 0.6, 0.95),
          (0.7, 0.6, 0.95), (0.3, 0.8, 0.9), (0.7, 0.8, 0.9), (0.3, 1.0, 0.2), (0.7, 1.0, 0.2)]


def _metadata(task: str, names: dict[int, str], **more: str) -> dict[str, str]:
    return {"description": f"Ultralytics YOLO11n-{task[:3]} model trained on coco.yaml",
            "author": "Ultralytics", "date": "2026-11-29T00:00:00", "version": "8.3.200",
            "license": "AGPL-3.0 License (https://ultralytics.com/license)",
            "stride": "32", "task": task, "batch": "1", "imgsz": f"[{DETECT_SIZE}, "
            f"{DETECT_SIZE}]", "names": str(names), **more}


def make_seg_yolo(seed: int = 0) -> onnx.ModelProto:
    """A YOLO-seg export: the lit box (and its copy a pixel off at 0.9 the score, for NMS)
    with mask coefficients [1, 0, ..., 0] over prototypes whose first channel is the lit
    share of each 4 x 4 cell as a logit (20 * share - 10): the mask is the lit shape."""
    del seed
    nodes, inits = _bright_box()
    inits += [_const("axis1", [1], np.int64), _const("twenty", 20.0), _const("ten", 10.0),
              _const("zeros31", np.zeros((1, MASKS - 1, 1, 1))),
              _const("zeros32", np.zeros((1, MASKS))),
              _const("first", np.eye(1, MASKS))]
    nodes += [
        _N("AveragePool", ["mask"], ["share"], kernel_shape=[4, 4], strides=[4, 4]),
        _N("Mul", ["share", "twenty"], ["share20"]), _N("Sub", ["share20", "ten"], ["proto0"]),
        _N("Mul", ["proto0", "zeros31"], ["proto_rest"]),
        _N("Concat", ["proto0", "proto_rest"], ["output1"], axis=1),
        _N("Mul", ["score", "zeros32"], ["coef0"]), _N("Add", ["coef0", "first"], ["coef"]),
    ]
    more_nodes, more_inits = _rows([["cxcywh", "class_scores", "coef"],
                                    ["cxcywh_dup", "class_scores_dup", "coef"]], GRID,
                                   "output0", transpose=True)
    model = build_model("seg_yolo", nodes + more_nodes,
                        [declare_float("images", [1, 3, DETECT_SIZE, DETECT_SIZE])],
                        [declare_float("output0", [1, 4 + len(DETECT_NAMES) + MASKS, GRID]),
                         declare_float("output1", [1, MASKS, PROTO, PROTO])],
                        inits + more_inits)
    _rename_input(model, "x", "images")
    helper.set_model_props(model, _metadata("segment", dict(enumerate(DETECT_NAMES))))
    return model


def make_pose_yolo(seed: int = 0) -> onnx.ModelProto:
    """A YOLO-pose export: one class (person), the lit box and 17 keypoints placed in it
    (POINTS), x and y in input pixels, each with its visibility."""
    del seed
    nodes, inits = _bright_box()
    weights = np.zeros((4, KPT_SHAPE[0] * KPT_SHAPE[1]), np.float32)
    bias = np.zeros(KPT_SHAPE[0] * KPT_SHAPE[1], np.float32)
    for i, (fx, fy, seen) in enumerate(POINTS):
        weights[0, 3 * i], weights[2, 3 * i] = 1 - fx, fx
        weights[1, 3 * i + 1], weights[3, 3 * i + 1] = 1 - fy, fy
        bias[3 * i + 2] = seen
    inits += [_const("axis1", [1], np.int64), _const("kpt_w", weights), _const("kpt_b", bias)]
    nodes += [_N("MatMul", ["xyxy", "kpt_w"], ["kpt_0"]), _N("Add", ["kpt_0", "kpt_b"], ["kpts"])]
    more_nodes, more_inits = _rows([["cxcywh", "score", "kpts"],
                                    ["cxcywh_dup", "score_dup", "kpts"]], GRID, "output0",
                                   transpose=True)
    model = build_model("pose_yolo", nodes + more_nodes,
                        [declare_float("images", [1, 3, DETECT_SIZE, DETECT_SIZE])],
                        [declare_float("output0", [1, 5 + KPT_SHAPE[0] * KPT_SHAPE[1], GRID])],
                        inits + more_inits)
    _rename_input(model, "x", "images")
    helper.set_model_props(model, _metadata("pose", {0: "person"},
                                            kpt_shape=str(list(KPT_SHAPE))))
    return model


def _rename_input(model: onnx.ModelProto, old: str, new: str) -> None:
    """Ultralytics names its input `images`; the bright box reads `x`."""
    for node in model.graph.node:
        node.input[:] = [new if name == old else name for name in node.input]


SEMANTIC_LABELS = ("background", "green", "red")


def make_semantic(seed: int = 0) -> onnx.ModelProto:
    """A DeepLab-style export: `logits` [1, 3, H/4, W/4] over background, green and red (the
    lit share of each 4 x 4 cell in the G and R channels, against a flat 0.5 background), no
    metadata: its class names are the labels file's, as torchvision's exports ship them."""
    del seed
    nodes = [_N("AveragePool", ["x"], ["cells"], kernel_shape=[4, 4], strides=[4, 4]),
             _N("Split", ["cells", "split3"], ["r", "g", "b"], axis=1),
             _N("Mul", ["g", "zero"], ["g0"]), _N("Add", ["g0", "half"], ["background"]),
             _N("Concat", ["background", "g", "r"], ["logits"], axis=1)]
    model = build_model("semantic", nodes, [declare_float("x", [1, 3, DETECT_SIZE,
                                                                DETECT_SIZE])],
                        [declare_float("logits", [1, 3, PROTO, PROTO])],
                        [_const("split3", [1, 1, 1], np.int64), _const("zero", 0.0),
                         _const("half", 0.5)])
    return model


CLASSIFY_SIZE = 224  # Ultralytics' classifiers' imgsz
CLASSIFY_NAMES = ("red", "green", "blue")


def make_cls_yolo(seed: int = 0) -> onnx.ModelProto:
    """A YOLO-cls export (`yolo11n-cls.pt` exported to ONNX): `images` [1, 3, 224, 224] in,
    `output0` [1, C] out (the Classify head's softmax, applied in the export), the metadata
    its exporter writes (task classify, stride 1, imgsz, names, the head's name). Which
    colour's channel is brightest on average over what the model sees, sharpened: a
    classifier whose answer on a frame a person can check, and that tells a centre crop from
    a squash (a frame red in its middle third and blue at the sides is red cropped, blue
    squashed)."""
    del seed
    nodes = [_N("GlobalAveragePool", ["images"], ["pool"]),
             _N("Flatten", ["pool"], ["flat"], axis=1),
             _N("MatMul", ["flat", "sharpen"], ["logits"]),
             _N("Softmax", ["logits"], ["output0"], axis=1)]
    model = build_model("cls_yolo", nodes,
                        [declare_float("images", [1, 3, CLASSIFY_SIZE, CLASSIFY_SIZE])],
                        [declare_float("output0", [1, len(CLASSIFY_NAMES)])],
                        [_const("sharpen", np.eye(3) * 12.0)])
    helper.set_model_props(model, {
        **_metadata("classify", dict(enumerate(CLASSIFY_NAMES))),
        "description": "Ultralytics YOLO11n-cls model trained on imagenet", "stride": "1",
        "imgsz": f"[{CLASSIFY_SIZE}, {CLASSIFY_SIZE}]", "head": "Classify",
        "docs": "https://docs.ultralytics.com", "channels": "3", "end2end": "False",
        "args": str({"batch": 1, "half": False, "dynamic": False, "simplify": True,
                     "opset": None, "nms": False})})
    return model


TASK_MODELS: dict[str, Callable[[int], onnx.ModelProto]] = {
    "seg_yolo": make_seg_yolo,
    "pose_yolo": make_pose_yolo,
    "semantic": make_semantic,
    "cls_yolo": make_cls_yolo,
}
# Beside a model's versions: what its file does not say (its labels, its pre-processing)
TASK_FILES: dict[str, dict[str, str]] = {
    "semantic": {"labels.txt": "\n".join(SEMANTIC_LABELS) + "\n",
                 "model.yaml": "preprocess: {resize: [64, 64], keep_ratio: true, "
                               "pad_value: 0, color: rgb}\n"},
}


def write_task_models(root: Path, names: list[str] | None = None) -> Path:
    """DIR/<name>/1/model.onnx for each task model, and the files its file does not say."""
    for name in names or list(TASK_MODELS):
        write_model(TASK_MODELS[name](0), root / name / "1" / "model.onnx")
        for file, text in TASK_FILES.get(name, {}).items():
            (root / name / file).write_text(text)
    return root


if __name__ == "__main__":
    write_task_models(Path(sys.argv[1]))
