"""Generate tiny deterministic ONNX models and model repositories for edged tests."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Opset 17 / IR 8 is the newest pair both ORT 1.31 and TensorRT 10 accept.
OPSET = 17
IR_VERSION = 8

Dim = int | str


def draw_weight(
    rng: np.random.Generator, name: str, shape: Sequence[int]
) -> onnx.TensorProto:
    # Scaled down so softmax/relu outputs stay in a numerically boring range.
    values = (rng.standard_normal(shape) * 0.5).astype(np.float32)
    return numpy_helper.from_array(values, name=name)


def declare_float(name: str, shape: Sequence[Dim]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def build_model(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto],
) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="edged-make-test-models",
    )
    # make_model stamps the IR version of the installed onnx, which may be too new.
    model.ir_version = IR_VERSION
    return model


def make_tiny_cls(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Flatten", ["x"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "W"], ["mm"]),
        helper.make_node("Add", ["mm", "B"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
    ]
    return build_model(
        "tiny_cls",
        nodes,
        [declare_float("x", ["batch", 3, 8, 8])],
        [declare_float("prob", ["batch", 4])],
        [draw_weight(rng, "W", [192, 4]), draw_weight(rng, "B", [4])],
    )


def make_tiny_cnn(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node(
            "Conv",
            ["image", "conv_w", "conv_b"],
            ["conv"],
            kernel_shape=[3, 3],
            pads=[1, 1, 1, 1],
        ),
        helper.make_node("Relu", ["conv"], ["relu"]),
        # Global pooling is what makes arbitrary H/W collapse to a fixed-size vector.
        helper.make_node("GlobalAveragePool", ["relu"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"]),
    ]
    return build_model(
        "tiny_cnn",
        nodes,
        [declare_float("image", ["batch", 3, "height", "width"])],
        [declare_float("logits", ["batch", 5])],
        [
            draw_weight(rng, "conv_w", [4, 3, 3, 3]),
            draw_weight(rng, "conv_b", [4]),
            draw_weight(rng, "fc_w", [4, 5]),
            draw_weight(rng, "fc_b", [5]),
        ],
    )


def make_tiny_nobatch(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes = [
        helper.make_node("Mul", ["v", "w"], ["scaled"]),
        helper.make_node("Add", ["scaled", "b"], ["out"]),
    ]
    return build_model(
        "tiny_nobatch",
        nodes,
        [declare_float("v", [4])],
        [declare_float("out", [4])],
        [draw_weight(rng, "w", [4]), draw_weight(rng, "b", [4])],
    )


def make_tiny_two_input(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    # Since opset 13 ReduceSum takes its axes as a tensor input, not an attribute.
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), name="axes")
    nodes = [
        helper.make_node("Mul", ["b", "w"], ["bw"]),
        helper.make_node("Add", ["a", "bw"], ["sum"]),
        helper.make_node("Mul", ["a", "b"], ["ab"]),
        helper.make_node("ReduceSum", ["ab", "axes"], ["dot"], keepdims=0),
    ]
    return build_model(
        "tiny_two_input",
        nodes,
        [declare_float("a", ["batch", 4]), declare_float("b", ["batch", 4])],
        [declare_float("sum", ["batch", 4]), declare_float("dot", ["batch"])],
        [draw_weight(rng, "w", [4]), axes],
    )


def make_colors(seed: int = 0, batch: Dim = "batch") -> onnx.ModelProto:
    """The demo model: which of red, green, blue dominates an RGB image (0..1). Mean per
    channel, sharpened, softmax: a real image classifier whose answer a person can check."""
    del seed  # not random: the demo's answers must be right
    nodes = [
        helper.make_node("GlobalAveragePool", ["image"], ["pool"]),
        helper.make_node("Flatten", ["pool"], ["flat"], axis=1),
        helper.make_node("MatMul", ["flat", "sharpen"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["prob"], axis=1),
    ]
    sharpen = numpy_helper.from_array(np.eye(3, dtype=np.float32) * 12.0, name="sharpen")
    return build_model(
        "colors",
        nodes,
        [declare_float("image", [batch, 3, 64, 64])],
        [declare_float("prob", [batch, 3])],
        [sharpen],
    )


def make_grid_det(seed: int = 0) -> onnx.ModelProto:
    """A detector whose answer a person can check: the 64x64 RGB input is cut into a 4x4 grid
    of 16-pixel cells, and each cell is a candidate box (xyxy, input pixels) scored per class
    by its mean red, green and blue (SSD layout: boxes [N, 16, 4], scores [N, 16, 3]). A
    square of pure colour on one cell is found there, with that colour as its class."""
    del seed  # not random: tests check its boxes
    cells = np.array([[16 * c, 16 * r, 16 * c + 16, 16 * r + 16]
                      for r in range(4) for c in range(4)], np.float32)[None]
    nodes = [
        helper.make_node("AveragePool", ["image"], ["means"], kernel_shape=[16, 16],
                         strides=[16, 16]),
        helper.make_node("Reshape", ["means", "flat_shape"], ["per_channel"]),
        helper.make_node("Transpose", ["per_channel"], ["scores"], perm=[0, 2, 1]),
        # Boxes do not depend on the input, but carry its batch dim: 0 * score + cell.
        helper.make_node("ReduceMax", ["scores"], ["any"], axes=[2], keepdims=1),
        helper.make_node("Mul", ["any", "zero"], ["nothing"]),
        helper.make_node("Add", ["nothing", "cells"], ["boxes"]),
    ]
    return build_model(
        "grid_det",
        nodes,
        [declare_float("image", ["batch", 3, 64, 64])],
        [declare_float("boxes", ["batch", 16, 4]), declare_float("scores", ["batch", 16, 3])],
        [numpy_helper.from_array(np.array([0, 3, 16], np.int64), name="flat_shape"),
         numpy_helper.from_array(np.zeros(1, np.float32), name="zero"),
         numpy_helper.from_array(cells, name="cells")],
    )


def make_colors_b1(seed: int = 0) -> onnx.ModelProto:
    """The colors classifier as exporters write a model by default (Ultralytics'
    `dynamic=False`): a static batch of one, input [1, 3, 64, 64], output [1, 3]."""
    model = make_colors(seed, batch=1)
    model.graph.name = "colors_b1"
    return model


def make_tiny_cnn_b4(seed: int = 0) -> onnx.ModelProto:
    """tiny_cnn exported with a static batch of four: input [4, 3, H, W], output [4, 5]
    (the same weights as tiny_cnn of the same seed, so that runs it unbatched)."""
    model = make_tiny_cnn(seed)
    fix_first_dim([*model.graph.input, *model.graph.output], 4)
    model.graph.name = "tiny_cnn_b4"
    return model


def make_identity(elem_type: int, name: str, n: str | int = "n") -> onnx.ModelProto:
    """INPUT0 [batch, n] → OUTPUT0, unchanged: Triton's identity models, for the wire
    protocol (BYTES as ONNX strings, zero-element tensors)."""
    def tensor(tensor_name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(tensor_name, elem_type, ["batch", n])

    return build_model(name, [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
                       [tensor("INPUT0")], [tensor("OUTPUT0")], [])


def make_identity_bytes(seed: int = 0) -> onnx.ModelProto:
    return make_identity(TensorProto.STRING, "identity_bytes")


def make_identity_bytes_1(seed: int = 0) -> onnx.ModelProto:
    """One string a row (Triton's onnx_zero_1_object_1_element): what a raw binary request
    may send a BYTES input to."""
    return make_identity(TensorProto.STRING, "identity_bytes_1", 1)


def make_identity_fp32(seed: int = 0) -> onnx.ModelProto:
    return make_identity(TensorProto.FLOAT, "identity_fp32")


def make_scale(n: int = 4, factor: float = 2.0, name: str = "scale") -> onnx.ModelProto:
    """x [batch, n] → y = factor·x: an answer exact at any batch size and in any order of
    rows (a multiply by a power of two rounds nothing), so that two paths' answers can be
    compared byte for byte (the differential test), and whose input width marks its
    signature (a version with another `n` changes the model's I/O)."""
    return build_model(
        name,
        [helper.make_node("Mul", ["x", "factor"], ["y"])],
        [declare_float("x", ["batch", n])],
        [declare_float("y", ["batch", n])],
        [numpy_helper.from_array(np.array(factor, np.float32), name="factor")],
    )


def fix_first_dim(values: Iterable[onnx.ValueInfoProto], size: int) -> None:
    """Make the first dim of each of `values` the fixed `size`, as a static export has it."""
    for value in values:
        first = value.type.tensor_type.shape.dim[0]
        first.Clear()
        first.dim_value = size


# -- detectors: stock head layouts around one real answer ------------------------------------
# Each finds the pixels brighter than 0.5 in any channel (a lit square on a dark frame; the
# letterbox's grey 114 stays under it) and reports their bounding box, scored by how bright the
# peak is (0 on a dark frame) and classed by the channel that peaks: a model whose right answer
# a test can compute. Heads that need NMS also carry a copy shifted by a pixel at 0.9 the score.
DETECT_SIZE = 64  # fixed input side; YOLOv8's grid then has 8x8 + 4x4 + 2x2 = 84 cells
DETECT_NAMES = ("person", "bicycle", "car")
ULTRALYTICS = {"author": "Ultralytics", "stride": "32", "task": "detect", "batch": "1",
               "names": str(dict(enumerate(DETECT_NAMES))),
               "imgsz": f"[{DETECT_SIZE}, {DETECT_SIZE}]"}
_N = helper.make_node
Part = tuple[list[onnx.NodeProto], list[onnx.TensorProto]]  # nodes and their constants


def _const(name: str, values: object, dtype: type = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype), name=name)


def _bright_box() -> Part:
    """x [B, 3, H, W] → xyxy [B, 4] (input pixels), cxcywh [B, 4], score [B, 1], onehot [B, 3]
    (the peaking channel), cls [B, 1] (its index, as a float)."""
    to_f = TensorProto.FLOAT
    nodes = [
        _N("ReduceMax", ["x"], ["bright"], axes=[1], keepdims=1),
        _N("Greater", ["bright", "half"], ["lit"]), _N("Cast", ["lit"], ["mask"], to=to_f),
        _N("ReduceMax", ["mask"], ["cols"], axes=[1, 2], keepdims=0),
        _N("ReduceMax", ["mask"], ["rows"], axes=[1, 3], keepdims=0),
        _N("ArgMax", ["cols"], ["x1"], axis=1, keepdims=1),
        _N("ArgMax", ["cols"], ["x2"], axis=1, keepdims=1, select_last_index=1),
        _N("ArgMax", ["rows"], ["y1"], axis=1, keepdims=1),
        _N("ArgMax", ["rows"], ["y2"], axis=1, keepdims=1, select_last_index=1),
        _N("Concat", ["x1", "y1", "x2", "y2"], ["corners_i"], axis=1),
        _N("Cast", ["corners_i"], ["corners"], to=to_f),
        _N("Add", ["corners", "to_end"], ["xyxy"]),  # the last lit pixel's far edge
        _N("MatMul", ["xyxy", "xyxy_to_cxcywh"], ["cxcywh"]),
        _N("ReduceMax", ["bright"], ["peak"], axes=[2, 3], keepdims=0),
        _N("Sub", ["peak", "half"], ["over"]), _N("Relu", ["over"], ["over_0"]),
        _N("Mul", ["over_0", "two"], ["score"]),
        _N("ReduceMax", ["x"], ["channels"], axes=[2, 3], keepdims=0),
        _N("ArgMax", ["channels"], ["cls_i"], axis=1, keepdims=1),
        _N("Equal", ["cls_i", "class_ids"], ["is_cls"]), _N("Cast", ["is_cls"], ["onehot"],
                                                           to=to_f),
        _N("Cast", ["cls_i"], ["cls"], to=to_f),
        _N("Mul", ["onehot", "score"], ["class_scores"]),
        _N("Mul", ["score", "ninety"], ["score_dup"]),
        _N("Mul", ["class_scores", "ninety"], ["class_scores_dup"]),
        _N("Add", ["cxcywh", "shift"], ["cxcywh_dup"]),
    ]
    to_cxcywh = [[0.5, 0, -1, 0], [0, 0.5, 0, -1], [0.5, 0, 1, 0], [0, 0.5, 0, 1]]
    return nodes, [_const("half", 0.5), _const("two", 2.0), _const("ninety", 0.9),
                   _const("to_end", [0, 0, 1, 1]), _const("xyxy_to_cxcywh", to_cxcywh),
                   _const("shift", [1, 1, 0, 0]),
                   _const("class_ids", range(len(DETECT_NAMES)), np.int64)]


def _rows(parts: list[list[str]], total: int, out: str, fill: float = 0.0,
          transpose: bool = False) -> Part:
    """Rows (each the Concat of [B, k] parts) stacked into [B, total, D], the rest `fill`."""
    nodes, names = [], []
    for i, row in enumerate(parts):
        nodes += [_N("Concat", row, [f"{out}_r{i}"], axis=1),
                  _N("Unsqueeze", [f"{out}_r{i}", "axis1"], [f"{out}_u{i}"])]
        names.append(f"{out}_u{i}")
    padded = f"{out}_t" if transpose else out
    nodes += [_N("Concat", names, [f"{out}_stack"], axis=1),
              _N("Pad", [f"{out}_stack", f"{out}_pads", f"{out}_fill"], [padded])]
    if transpose:
        nodes.append(_N("Transpose", [padded], [out], perm=[0, 2, 1]))
    pads = [0, 0, 0, 0, total - len(parts), 0]
    return nodes, [_const(f"{out}_pads", pads, np.int64), _const(f"{out}_fill", fill)]


def _detector(name: str, heads: list[Part],
              outputs: dict[str, list[Dim]], metadata: dict[str, str],
              size: Sequence[Dim] = (DETECT_SIZE, DETECT_SIZE)) -> onnx.ModelProto:
    nodes, inits = _bright_box()
    inits += [_const("axis1", [1], np.int64), _const("side", DETECT_SIZE)]
    nodes.append(_N("Div", ["xyxy", "side"], ["xyxy_n"]))
    nodes.append(_N("Div", ["cxcywh", "side"], ["cxcywh_n"]))
    for more_nodes, more_inits in heads:
        nodes += more_nodes
        inits += more_inits
    model = build_model(name, nodes, [declare_float("x", ["batch", 3, *size])],
                        [declare_float(k, ["batch", *v]) for k, v in outputs.items()], inits)
    helper.set_model_props(model, metadata)
    return model


def make_det_yolov8(seed: int = 0) -> onnx.ModelProto:
    """[B, 4+C, N] on an input of dynamic size, served at the metadata's imgsz (64 high, 96
    wide): N = 126 anchors, the grid of that size (12x8 + 6x4 + 3x2)."""
    del seed
    rows = _rows([["cxcywh", "class_scores"], ["cxcywh_dup", "class_scores_dup"]], 126,
                 "output0", transpose=True)
    return _detector("det_yolov8", [rows], {"output0": [7, 126]},
                     {**ULTRALYTICS, "imgsz": "[64, 96]",
                      "description": "Ultralytics YOLOv8n model trained on coco.yaml"},
                     size=("height", "width"))


def make_det_yolov5(seed: int = 0) -> onnx.ModelProto:
    """YOLOv5's [B, 3 x 84, 5+C] with objectness; metadata as YOLOv5's exporter writes it."""
    del seed
    rows = _rows([["cxcywh", "score", "onehot"], ["cxcywh_dup", "score_dup", "onehot"]], 252,
                 "output0")
    return _detector("det_yolov5", [rows], {"output0": [252, 8]},
                     {"stride": "32", "names": ULTRALYTICS["names"]})


def make_det_end2end(seed: int = 0) -> onnx.ModelProto:
    """[B, 300, 6]: x1, y1, x2, y2, score, class, as YOLO26 and YOLOv10 export (no NMS)."""
    del seed
    rows = _rows([["xyxy", "score", "cls"]], 300, "output0")
    return _detector("det_end2end", [rows], {"output0": [300, 6]},
                     {**ULTRALYTICS, "end2end": "True",
                      "description": "Ultralytics YOLO26n model trained on coco.yaml"})


def make_det_ssd(seed: int = 0) -> onnx.ModelProto:
    """boxes [B, 200, 4] (0..1 x1, y1, x2, y2) + scores [B, 200, C] from a Sigmoid."""
    del seed
    boxes = _rows([["xyxy_n"], ["xyxy_n"]], 200, "boxes")
    logits = _rows([["logit"], ["logit_dup"]], 200, "logits", fill=-10.0)
    scored = ([_N("Mul", ["class_scores", "sixteen"], ["logit_up"]),
               _N("Sub", ["logit_up", "eight"], ["logit"]),
               _N("Mul", ["class_scores_dup", "sixteen"], ["logit_up_dup"]),
               _N("Sub", ["logit_up_dup", "eight"], ["logit_dup"])],
              [_const("sixteen", 16.0), _const("eight", 8.0)])
    squash: Part = ([_N("Sigmoid", ["logits"], ["scores"])], [])
    return _detector("det_ssd", [scored, boxes, logits, squash],
                     {"boxes": [200, 4], "scores": [200, 3]}, {"names": ULTRALYTICS["names"]})


def make_det_ssd_background(seed: int = 0) -> onnx.ModelProto:
    """boxes [B, 200, 4] + scores [B, 200, 1+C] from a Softmax, column 0 the background."""
    del seed
    boxes = _rows([["xyxy_n"], ["xyxy_n"]], 200, "boxes")
    logits = _rows([["bg", "logit"], ["bg_dup", "logit_dup"]], 200, "logits_rows")
    filler = np.zeros((200, 4), np.float32)
    filler[2:, 0] = 10.0  # the rows that hold nothing are background
    scored = ([_N("Mul", ["class_scores", "eight"], ["logit"]),
               _N("Mul", ["class_scores_dup", "eight"], ["logit_dup"]),
               _N("Sub", ["one", "score"], ["absent"]),
               _N("Mul", ["absent", "eight"], ["bg"]),
               _N("Sub", ["one", "score_dup"], ["absent_dup"]),
               _N("Mul", ["absent_dup", "eight"], ["bg_dup"])],
              [_const("eight", 8.0), _const("one", 1.0)])
    squash = ([_N("Add", ["logits_rows", "filler"], ["logits"]),
               _N("Softmax", ["logits"], ["scores"], axis=-1)], [_const("filler", filler)])
    return _detector("det_ssd_background", [scored, boxes, logits, squash],
                     {"boxes": [200, 4], "scores": [200, 4]}, {"names": ULTRALYTICS["names"]})


def make_det_detr(seed: int = 0) -> onnx.ModelProto:
    """RT-DETR as Ultralytics exports it: [B, 300, 4+C], 0..1 cx, cy, w, h, class scores."""
    del seed
    rows = _rows([["cxcywh_n", "class_scores"]], 300, "output0")
    return _detector("det_detr", [rows], {"output0": [300, 7]},
                     {**ULTRALYTICS,
                      "description": "Ultralytics rtdetr-l model trained on coco.yaml"})


def make_det_detr_pair(seed: int = 0) -> onnx.ModelProto:
    """DETR's two outputs: pred_logits [B, 100, C] (logits) and pred_boxes [B, 100, 4] out of
    a Sigmoid (0..1 cx, cy, w, h)."""
    del seed
    logits = _rows([["logit"]], 100, "pred_logits", fill=-10.0)
    boxes = _rows([["box_logit"]], 100, "box_logits")
    ops = ([_N("Mul", ["class_scores", "sixteen"], ["logit_up"]),
            _N("Sub", ["logit_up", "eight"], ["logit"]),
            _N("Clip", ["cxcywh_n", "tiny", "almost_one"], ["inside"]),
            _N("Sub", ["almost_one_1", "inside"], ["outside"]),
            _N("Div", ["inside", "outside"], ["odds"]), _N("Log", ["odds"], ["box_logit"])],
           [_const("sixteen", 16.0), _const("eight", 8.0), _const("tiny", 1e-4),
            _const("almost_one", 1 - 1e-4), _const("almost_one_1", 1.0)])
    squash: Part = ([_N("Sigmoid", ["box_logits"], ["pred_boxes"])], [])
    return _detector("det_detr_pair", [ops, logits, boxes, squash],
                     {"pred_logits": [100, 3], "pred_boxes": [100, 4]},
                     {"names": ULTRALYTICS["names"]})


def make_det_ambiguous(seed: int = 0) -> onnx.ModelProto:
    """[B, 84, 84] from a 64x64 input with 80 classes: YOLOv8's [4+80, 84 anchors] and its
    rows [84 anchors, 4+80] alike; nothing tells which."""
    rng = np.random.default_rng(seed)
    nodes = [_N("GlobalAveragePool", ["x"], ["pool"]), _N("Flatten", ["pool"], ["flat"]),
             _N("MatMul", ["flat", "w"], ["wide"]), _N("Reshape", ["wide", "shape"], ["output0"])]
    model = build_model("det_ambiguous", nodes, [declare_float("x", ["batch", 3, 64, 64])],
                        [declare_float("output0", ["batch", 84, 84])],
                        [draw_weight(rng, "w", [3, 84 * 84]),
                         _const("shape", [-1, 84, 84], np.int64)])
    helper.set_model_props(model, {**ULTRALYTICS,
                                   "names": str({i: f"class{i}" for i in range(80)})})
    return model


def make_cls_ultralytics(seed: int = 0) -> onnx.ModelProto:
    """The colors classifier as an Ultralytics classify export: labels in the metadata."""
    model = make_colors(seed)
    helper.set_model_props(model, {**ULTRALYTICS, "task": "classify",
                                   "names": str({0: "red", 1: "green", 2: "blue"})})
    return model


# Not in MODELS: `write_repository()` without names writes the tiny models only.
DETECTORS: dict[str, Callable[[int], onnx.ModelProto]] = {
    "det_yolov8": make_det_yolov8,
    "det_yolov5": make_det_yolov5,
    "det_end2end": make_det_end2end,
    "det_ssd": make_det_ssd,
    "det_ssd_background": make_det_ssd_background,
    "det_detr": make_det_detr,
    "det_detr_pair": make_det_detr_pair,
    "det_ambiguous": make_det_ambiguous,
    "cls_ultralytics": make_cls_ultralytics,
}


MODELS: dict[str, Callable[[int], onnx.ModelProto]] = {
    "tiny_cls": make_tiny_cls,
    "tiny_cnn": make_tiny_cnn,
    "tiny_nobatch": make_tiny_nobatch,
    "tiny_two_input": make_tiny_two_input,
    "colors": make_colors,
    "grid_det": make_grid_det,
    "colors_b1": make_colors_b1,
    "tiny_cnn_b4": make_tiny_cnn_b4,
    "identity_bytes": make_identity_bytes,
    "identity_bytes_1": make_identity_bytes_1,
    "identity_fp32": make_identity_fp32,
}
# What a repository holds when no names are given: the models every test may rely on. The
# static-batch models and the detectors are written by the tests that name them (tests that
# list the repository's models expect this set).
DEFAULT_MODELS = ("tiny_cls", "tiny_cnn", "tiny_nobatch", "tiny_two_input", "colors")

# Shapes here exclude the batch dimension whenever max_batch_size > 0.
MODEL_YAML: dict[str, str] = {
    "tiny_cls": (
        "max_batch_size: 16\n"
        "inputs: [{name: x, dtype: float32, shape: [3, 8, 8]}]\n"
        "outputs: [{name: prob, dtype: float32, shape: [4]}]\n"
    ),
    "tiny_cnn": (
        "max_batch_size: 8\n"
        "inputs: [{name: image, dtype: float32, shape: [3, -1, -1]}]\n"
        "outputs: [{name: logits, dtype: float32, shape: [5]}]\n"
    ),
    "tiny_nobatch": (
        "max_batch_size: 0\n"
        "inputs: [{name: v, dtype: float32, shape: [4]}]\n"
        "outputs: [{name: out, dtype: float32, shape: [4]}]\n"
    ),
    "tiny_two_input": (
        "max_batch_size: 8\n"
        "inputs: [{name: a, dtype: float32, shape: [4]},\n"
        "         {name: b, dtype: float32, shape: [4]}]\n"
        "outputs: [{name: sum, dtype: float32, shape: [4]},\n"
        "          {name: dot, dtype: float32, shape: []}]\n"
    ),
    "colors": (
        "max_batch_size: 8\n"
        "preprocess: {resize: [64, 64], color: rgb}\n"
        "postprocess: {kind: classify, labels: labels.txt, top_k: 1}\n"
    ),
    "grid_det": (
        "max_batch_size: 8\n"
        "preprocess: {resize: [64, 64], color: rgb}\n"
        "postprocess: {kind: detect, format: ssd, box: xyxy, score_threshold: 0.5,\n"
        "              labels: labels.txt}\n"
    ),
    # No max_batch_size: the static-batch models have theirs inferred from the graph.
    "colors_b1": (
        "preprocess: {resize: [64, 64], color: rgb}\n"
        "postprocess: {kind: classify, labels: labels.txt, top_k: 1}\n"
    ),
    "tiny_cnn_b4": (
        "tensorrt: {shapes: {image: {min: [3, 8, 8], opt: [3, 16, 16], max: [3, 32, 32]}}}\n"
    ),
}

# Files beside model.yaml.
MODEL_FILES: dict[str, dict[str, str]] = {
    "colors": {"labels.txt": "red\ngreen\nblue\n"},
    "colors_b1": {"labels.txt": "red\ngreen\nblue\n"},
    "grid_det": {"labels.txt": "red\ngreen\nblue\n"},
}


def write_model(model: onnx.ModelProto, path: Path) -> Path:
    # Fail here rather than in a backend with a less helpful error.
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def write_config(name: str, root: Path) -> Path | None:
    """model.yaml (and the files beside it) where the model has one; detectors have none."""
    for file_name, text in MODEL_FILES.get(name, {}).items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / file_name).write_text(text)
    if name not in MODEL_YAML:
        return None
    path = root / name / "model.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MODEL_YAML[name])
    return path


def write_model_versions(name: str, root: Path, versions: int) -> list[Path]:
    # Version v uses seed v-1 so every version computes something different.
    make = {**MODELS, **DETECTORS}[name]
    return [
        write_model(make(v - 1), root / name / str(v) / "model.onnx")
        for v in range(1, versions + 1)
    ]


def write_repository_files(
    root: Path, versions: int, names: Iterable[str] | None
) -> list[Path]:
    selected = list(DEFAULT_MODELS) if names is None else list(names)
    unknown = sorted(set(selected) - set(MODELS) - set(DETECTORS))
    if unknown:
        raise ValueError(f"unknown test model(s): {', '.join(unknown)}")
    written: list[Path] = []
    for name in selected:
        config = write_config(name, root)
        if config is not None:
            written.append(config)
        written.extend(write_model_versions(name, root, versions))
    return written


def write_repository(
    root: Path, versions: int = 1, names: Iterable[str] | None = None
) -> Path:
    write_repository_files(root, versions, names)
    return root


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "out_dir", type=Path, metavar="OUT_DIR", help="model repository root to write"
    )
    parser.add_argument(
        "--versions", type=int, default=1, help="versions per model (default: 1)"
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=sorted({*MODELS, *DETECTORS}),
        metavar="NAME",
        help=f"models to write (default: {' '.join(DEFAULT_MODELS)}; the others by name)",
    )
    args = parser.parse_args(argv)
    if args.versions < 1:
        parser.error("--versions must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for path in write_repository_files(args.out_dir, args.versions, args.only):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
