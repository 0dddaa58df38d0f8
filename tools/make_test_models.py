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


def fix_first_dim(values: Iterable[onnx.ValueInfoProto], size: int) -> None:
    """Make the first dim of each of `values` the fixed `size`, as a static export has it."""
    for value in values:
        first = value.type.tensor_type.shape.dim[0]
        first.Clear()
        first.dim_value = size


MODELS: dict[str, Callable[[int], onnx.ModelProto]] = {
    "tiny_cls": make_tiny_cls,
    "tiny_cnn": make_tiny_cnn,
    "tiny_nobatch": make_tiny_nobatch,
    "tiny_two_input": make_tiny_two_input,
    "colors": make_colors,
    "grid_det": make_grid_det,
    "colors_b1": make_colors_b1,
    "tiny_cnn_b4": make_tiny_cnn_b4,
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


def write_config(name: str, root: Path) -> Path:
    path = root / name / "model.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(MODEL_YAML[name])
    for file_name, text in MODEL_FILES.get(name, {}).items():
        (path.parent / file_name).write_text(text)
    return path


def write_model_versions(name: str, root: Path, versions: int) -> list[Path]:
    # Version v uses seed v-1 so every version computes something different.
    return [
        write_model(MODELS[name](v - 1), root / name / str(v) / "model.onnx")
        for v in range(1, versions + 1)
    ]


def write_repository_files(
    root: Path, versions: int, names: Iterable[str] | None
) -> list[Path]:
    selected = list(DEFAULT_MODELS) if names is None else list(names)
    unknown = sorted(set(selected) - set(MODELS))
    if unknown:
        raise ValueError(f"unknown test model(s): {', '.join(unknown)}")
    written: list[Path] = []
    for name in selected:
        written.append(write_config(name, root))
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
        choices=sorted(MODELS),
        metavar="NAME",
        help=f"models to write (default: {' '.join(DEFAULT_MODELS)})",
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
