"""Test models beside the generated repository (tools/test_models.py): a model's
`model.yaml` written in place, a tiny_cls input that names its request, and a bare Q/DQ pair
for the INT8 checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def write_yaml(repo_dir: Path, name: str, text: str) -> None:
    (repo_dir / name / "model.yaml").write_text(text)


def cls_input(marker: float, rows: int = 1) -> np.ndarray:
    """A tiny_cls input whose first value identifies the request in the backend's call log."""
    x = np.random.default_rng(int(marker * 10)).random((rows, 3, 8, 8), dtype=np.float32)
    x[:, 0, 0, 0] = marker
    return x


def qdq_model(path: Path, zero_point: np.ndarray) -> Path:
    """QuantizeLinear then DequantizeLinear on a [1, 4] input, with `zero_point`'s type."""
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    zero = numpy_helper.from_array(zero_point, "z")
    graph = helper.make_graph(
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q0"),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq0")], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [scale, zero])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path
