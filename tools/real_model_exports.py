"""Signature-faithful exports for detector families that no PyPI wheel ships trained: a trained
model's weights (nudenet's YOLOv8n) with an output stage, written with `onnx.helper`, that gives
exactly another family's output signature, so edged reads real boxes through that family's
head. Which family each is, and how it differs from a real export, is in docs/models.md.

- YOLO-NAS (super-gradients, `postprocessing=None`): input [1, 3, 320, 320] 0..1 RGB; outputs
  `boxes` [1, N, 4] x1, y1, x2, y2 in input pixels and `scores` [1, N, C] probabilities, N one
  per cell of the stride 8/16/32 grid.
- D-FINE (its deploy export, as RT-DETRv2's): inputs `images` [1, 3, 320, 320] 0..1 RGB and
  `orig_target_sizes` [1, 2] (w, h); outputs `labels` [1, Q], `boxes` [1, Q, 4] x1, y1, x2, y2
  scaled to orig_target_sizes, `scores` [1, Q], Q = 300 queries as below.
- RF-DETR: input [1, 3, 320, 320] normalised with ImageNet's mean and std; outputs `dets`
  [1, Q, 4] 0..1 cx, cy, w, h and `labels` [1, Q, C] logits, Q = 300 distinct queries (here:
  the candidates left by NMS, best first, padded with empty queries).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

SIZE = 320
QUERIES = 300
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def write_exports(base: Path, out_dir: Path) -> list[Path]:
    """Both exports made from the YOLOv8 file `base`, into `out_dir`."""
    return [_yolonas(base, out_dir / "nudenet_as_yolonas.onnx"),
            _rfdetr(base, out_dir / "nudenet_as_rfdetr.onnx"),
            _dfine(base, out_dir / "nudenet_as_dfine.onnx")]


def _load(base: Path) -> tuple[onnx.ModelProto, int]:
    model = onnx.load(str(base))
    del model.metadata_props[:]  # other exporters write no Ultralytics metadata
    graph = model.graph
    graph.input[0].type.tensor_type.shape.dim[0].dim_value = 1
    for d, v in zip(graph.input[0].type.tensor_type.shape.dim[2:], (SIZE, SIZE), strict=True):
        d.dim_value = v
    out = graph.output[0]
    classes = out.type.tensor_type.shape.dim[1].dim_value - 4
    del graph.output[:]
    # output0 [1, 4+C, N] -> rows [1, N, 4+C]; cx, cy, w, h -> x1, y1, x2, y2 by a matrix
    graph.initializer.extend([
        numpy_helper.from_array(to_xyxy_matrix(), "x_to_xyxy"),
        numpy_helper.from_array(np.array([0], np.int64), "x_0"),
        numpy_helper.from_array(np.array([4], np.int64), "x_4"),
        numpy_helper.from_array(np.array([1 << 30], np.int64), "x_end"),
        numpy_helper.from_array(np.array([2], np.int64), "x_axis2")])
    graph.node.extend([
        helper.make_node("Transpose", [out.name], ["x_rows"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["x_rows", "x_0", "x_4", "x_axis2"], ["x_cxcywh"]),
        helper.make_node("Slice", ["x_rows", "x_4", "x_end", "x_axis2"], ["x_scores"]),
        helper.make_node("MatMul", ["x_cxcywh", "x_to_xyxy"], ["x_xyxy"])])
    return model, classes


def to_xyxy_matrix() -> np.ndarray:
    """[cx, cy, w, h] @ M = [x1, y1, x2, y2]."""
    return np.array([[1, 0, 1, 0], [0, 1, 0, 1], [-0.5, 0, 0.5, 0], [0, -0.5, 0, 0.5]],
                    np.float32)


def _save(model: onnx.ModelProto, path: Path) -> Path:
    model.producer_name = "edged tools/real_model_exports.py"
    model.producer_version = "1"
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def _yolonas(base: Path, path: Path) -> Path:
    model, classes = _load(base)
    g = model.graph
    g.node.extend([helper.make_node("Identity", ["x_xyxy"], ["boxes"]),
                   helper.make_node("Identity", ["x_scores"], ["scores"])])
    cells = sum((SIZE // s) ** 2 for s in (8, 16, 32))
    g.output.extend([helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, cells, 4]),
                     helper.make_tensor_value_info("scores", TensorProto.FLOAT,
                                                   [1, cells, classes])])
    _fix_dims(g)
    return _save(model, path)


def _queries(g: onnx.GraphProto, classes: int) -> None:
    """x_top_scores [Q], x_top_labels [Q], x_top_boxes [Q, 4] (cx, cy, w, h, input pixels):
    the candidates NMS leaves, best first, padded with empty queries to Q."""
    n = helper.make_node
    g.initializer.extend([
        numpy_helper.from_array(np.array([QUERIES], np.int64), "x_q"),
        numpy_helper.from_array(np.array(0.5, np.float32), "x_iou"),
        numpy_helper.from_array(np.array(0.05, np.float32), "x_min"),
        numpy_helper.from_array(np.zeros((QUERIES,), np.float32), "x_zero_scores"),
        numpy_helper.from_array(np.zeros((QUERIES,), np.int64), "x_zero_labels"),
        numpy_helper.from_array(np.zeros((QUERIES, 4), np.float32), "x_zero_boxes"),
        numpy_helper.from_array(np.array(1, np.int64), "x_i1"),
        numpy_helper.from_array(np.array(2, np.int64), "x_i2"),
        numpy_helper.from_array(np.array([1], np.int64), "x_1"),
        numpy_helper.from_array(np.array(SIZE, np.float32), "x_size")])
    g.node.extend([
        n("Transpose", ["x_scores"], ["x_by_class"], perm=[0, 2, 1]),  # [1, C, N]
        n("NonMaxSuppression", ["x_cxcywh", "x_by_class", "x_q", "x_iou", "x_min"], ["x_sel"],
          center_point_box=1),  # [K, 3]: batch, class, box
        n("GatherND", ["x_by_class", "x_sel"], ["x_sel_scores"]),  # [K]
        n("Gather", ["x_sel", "x_i1"], ["x_cls"], axis=1),  # [K]
        n("Gather", ["x_sel", "x_i2"], ["x_box"], axis=1),
        n("Squeeze", ["x_cxcywh", "x_0"], ["x_all_boxes"]),
        n("Gather", ["x_all_boxes", "x_box"], ["x_sel_boxes"]),  # [K, 4]
        n("Concat", ["x_sel_scores", "x_zero_scores"], ["x_pad_scores"], axis=0),
        n("Concat", ["x_cls", "x_zero_labels"], ["x_pad_labels"], axis=0),
        n("Concat", ["x_sel_boxes", "x_zero_boxes"], ["x_pad_boxes"], axis=0),
        n("TopK", ["x_pad_scores", "x_q"], ["x_top_scores", "x_top"], axis=0),
        n("Gather", ["x_pad_labels", "x_top"], ["x_top_labels"]),
        n("Gather", ["x_pad_boxes", "x_top"], ["x_top_boxes"])])


def _rfdetr(base: Path, path: Path) -> Path:
    model, classes = _load(base)
    g = model.graph
    image = g.input[0].name
    # ImageNet-normalised input back to the 0..1 the weights were trained on
    g.input[0].name = "input"
    for node in g.node:
        node.input[:] = ["x_pixels" if i == image else i for i in node.input]
    g.initializer.extend([
        numpy_helper.from_array(np.array(IMAGENET_STD, np.float32).reshape(1, 3, 1, 1), "x_std"),
        numpy_helper.from_array(np.array(IMAGENET_MEAN, np.float32).reshape(1, 3, 1, 1),
                                "x_mean"),
        numpy_helper.from_array(np.array(classes, np.int64), "x_depth"),
        numpy_helper.from_array(np.array([-10.0, 0.0], np.float32), "x_onoff"),
        numpy_helper.from_array(np.array(1e-6, np.float32), "x_eps"),
        numpy_helper.from_array(np.array(1.0, np.float32), "x_one"),
        numpy_helper.from_array(np.array(0.0, np.float32), "x_zero_f"),
        numpy_helper.from_array(np.array(10.0, np.float32), "x_const_off")])
    n = helper.make_node
    g.node.insert(0, n("Mul", ["input", "x_std"], ["x_scaled"]))
    g.node.insert(1, n("Add", ["x_scaled", "x_mean"], ["x_pixels"]))
    _queries(g, classes)
    g.node.extend([
        n("Div", ["x_top_boxes", "x_size"], ["x_norm_boxes"]),
        n("Unsqueeze", ["x_norm_boxes", "x_0"], ["dets"]),
        # logits: the chosen class's score as a logit, -10 elsewhere and for empty queries
        n("Clip", ["x_top_scores", "x_eps", "x_one"], ["x_p"]),
        n("Sub", ["x_one", "x_p"], ["x_q1"]),
        n("Div", ["x_p", "x_q1"], ["x_odds"]),
        n("Log", ["x_odds"], ["x_logit"]),
        n("OneHot", ["x_top_labels", "x_depth", "x_onoff"], ["x_hot"], axis=-1),  # [Q, C]
        # x_hot is -10 off the class and 0 on it; x_hot_mask is 1 on it: (logit + 10) - 10
        n("Equal", ["x_hot", "x_zero_f"], ["x_hot_bool"]),
        n("Cast", ["x_hot_bool"], ["x_hot_mask"], to=TensorProto.FLOAT),
        n("Unsqueeze", ["x_logit", "x_1"], ["x_logit_col"]),
        n("Add", ["x_logit_col", "x_const_off"], ["x_shifted"]),
        n("Mul", ["x_hot_mask", "x_shifted"], ["x_on"]),
        n("Sub", ["x_on", "x_const_off"], ["x_logits"]),
        n("Unsqueeze", ["x_logits", "x_0"], ["labels"])])
    g.output.extend([
        helper.make_tensor_value_info("dets", TensorProto.FLOAT, [1, QUERIES, 4]),
        helper.make_tensor_value_info("labels", TensorProto.FLOAT, [1, QUERIES, classes])])
    _fix_dims(g)
    _sort(g)
    return _save(model, path)


def _dfine(base: Path, path: Path) -> Path:
    model, classes = _load(base)
    g = model.graph
    g.input.append(helper.make_tensor_value_info("orig_target_sizes", TensorProto.INT64, [1, 2]))
    g.initializer.extend([
        numpy_helper.from_array(np.array([1, 2], np.int64), "x_repeat"),
        numpy_helper.from_array(to_xyxy_matrix(), "x_to_xyxy_q")])
    n = helper.make_node
    _queries(g, classes)
    g.node.extend([
        # D-FINE's postprocessor: 0..1 x1, y1, x2, y2 times orig_target_sizes (w, h, w, h)
        n("MatMul", ["x_top_boxes", "x_to_xyxy_q"], ["x_top_xyxy"]),
        n("Div", ["x_top_xyxy", "x_size"], ["x_unit"]),
        n("Cast", ["orig_target_sizes"], ["x_sizes_f"], to=TensorProto.FLOAT),
        n("Tile", ["x_sizes_f", "x_repeat"], ["x_whwh"]),  # [1, 4]
        n("Unsqueeze", ["x_unit", "x_0"], ["x_unit_b"]),
        n("Mul", ["x_unit_b", "x_whwh"], ["boxes"]),
        n("Unsqueeze", ["x_top_labels", "x_0"], ["labels"]),
        n("Unsqueeze", ["x_top_scores", "x_0"], ["scores"])])
    g.output.extend([
        helper.make_tensor_value_info("labels", TensorProto.INT64, [1, QUERIES]),
        helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, QUERIES, 4]),
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, QUERIES])])
    _fix_dims(g)
    _sort(g)
    return _save(model, path)


def _fix_dims(graph: onnx.GraphProto) -> None:
    """Old value infos of the dynamic input's shapes would disagree with a fixed input."""
    del graph.value_info[:]


def _sort(graph: onnx.GraphProto) -> None:
    """Nodes in topological order (the checker and ONNX Runtime want it)."""
    ready = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    nodes, ordered = list(graph.node), []
    while nodes:
        rest = []
        for node in nodes:
            if all(i in ready for i in node.input):
                ordered.append(node)
                ready.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(nodes):
            raise ValueError(f"cycle or missing input near {rest[0].name or rest[0].op_type}")
        nodes = rest
    del graph.node[:]
    graph.node.extend(ordered)
