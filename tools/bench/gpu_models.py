"""Models for `python -m tools.bench gpu`: a YOLO-sized detector written with onnx.helper
(YOLOv8n's signature and Ultralytics metadata: images [N, 3, 640, 640] → output0 [N, 84, 8400],
a strided conv backbone with SiLU and three heads, about 5 GFLOPs a frame: the work a real
small detector gives a GPU) and the repositories the suite serves. Its weights are random, so
the head adds a realistic scene (tools/bench/post.py's YOLOv8 head with 16 objects) to a small
multiple of what the convolutions computed: every layer still runs, and post-processing finds
boxes as it would on a street camera."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tools.bench.assets import PPOCR_CLS, ppocr_model
from tools.bench.post import yolov8_head

CLASSES = 80
# (output channels, stride 2 first?, extra 3x3 convs) per stage; the last three stages feed
# the heads at strides 8, 16 and 32.
STAGES = ((16, True, 0), (32, True, 1), (64, True, 3), (128, True, 3), (256, True, 2))
YOLO_YAML = """max_batch_size: {batch}
preprocess: {{keep_ratio: true, pad_value: 114}}
postprocess: {{kind: detect, score_threshold: 0.25}}
"""
CLS_YAML = "max_batch_size: 16\ninputs: [{name: x, dtype: float32, shape: [3, 48, 192]}]\n"


def yolo_sized(imgsz: int = 640, seed: int = 0) -> tuple[onnx.ModelProto, float]:
    """The detector and its GFLOPs per frame (multiply-adds x 2)."""
    rng = np.random.default_rng(seed)
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = []
    flops = 0.0
    x, channels, size = "images", 3, imgsz

    def conv(src: str, cin: int, cout: int, k: int, stride: int, size: int, name: str,
             act: bool = True) -> tuple[str, int]:
        nonlocal flops
        w = (rng.standard_normal((cout, cin, k, k)) * np.sqrt(2 / (cin * k * k))).astype(
            np.float32)
        inits.extend([numpy_helper.from_array(w, f"{name}.w"),
                      numpy_helper.from_array(np.zeros(cout, np.float32), f"{name}.b")])
        nodes.append(helper.make_node("Conv", [src, f"{name}.w", f"{name}.b"], [f"{name}.y"],
                                      kernel_shape=[k, k], strides=[stride, stride],
                                      pads=[k // 2] * 4))
        out = size // stride
        flops += 2.0 * out * out * cout * cin * k * k
        if not act:
            return f"{name}.y", out
        nodes.append(helper.make_node("Sigmoid", [f"{name}.y"], [f"{name}.s"]))
        nodes.append(helper.make_node("Mul", [f"{name}.y", f"{name}.s"], [f"{name}.a"]))
        return f"{name}.a", out

    levels = []
    for i, (cout, down, extra) in enumerate(STAGES):
        x, size = conv(x, channels, cout, 3, 2 if down else 1, size, f"s{i}.down")
        channels = cout
        for j in range(extra):
            x, size = conv(x, channels, channels, 3, 1, size, f"s{i}.c{j}")
        if i >= len(STAGES) - 3:
            levels.append((x, channels, size))
    flat = []
    for i, (src, cin, side) in enumerate(levels):
        head, _ = conv(src, cin, 4 + CLASSES, 1, 1, side, f"head{i}", act=False)
        inits.append(numpy_helper.from_array(np.array([0, 4 + CLASSES, -1], np.int64),
                                             f"head{i}.shape"))
        nodes.append(helper.make_node("Reshape", [head, f"head{i}.shape"], [f"head{i}.flat"]))
        flat.append(f"head{i}.flat")
    anchors = sum(side * side for *_, side in levels)
    # The scene is drawn for 640x640 (YOLOv8's anchors); a smaller dry-run model finds nothing.
    scene = (yolov8_head(np.random.default_rng(seed), 16, (40, 200), 60) if imgsz == 640
             else np.zeros((1, 4 + CLASSES, anchors), np.float32))
    assert scene.shape == (1, 4 + CLASSES, anchors), scene.shape
    inits += [numpy_helper.from_array(scene.astype(np.float32), "scene"),
              numpy_helper.from_array(np.full(1, 1e-4, np.float32), "small")]
    nodes += [helper.make_node("Concat", flat, ["computed"], axis=2),
              helper.make_node("Mul", ["computed", "small"], ["nudge"]),
              helper.make_node("Add", ["scene", "nudge"], ["output0"])]
    graph = helper.make_graph(
        nodes, "yolo_sized",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, imgsz, imgsz])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT,
                                       ["N", 4 + CLASSES, anchors])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    names = {i: f"class{i}" for i in range(CLASSES)}
    helper.set_model_props(model, {"author": "Ultralytics", "task": "detect", "stride": "32",
                                   "batch": "1", "imgsz": f"[{imgsz}, {imgsz}]",
                                   "names": str(names)})
    onnx.checker.check_model(model)
    return model, flops / 1e9


def write_models(root: Path, *, imgsz: int) -> dict[str, float]:
    """PP-OCR cls and the YOLO-sized detector, each as `<name>` (batching on, delay 0: the
    default) and `<name>_nobatch` (`batching: off`). Returns GFLOPs per frame by model."""
    cls = ppocr_model(PPOCR_CLS)
    model, gflops = yolo_sized(imgsz)
    for suffix, extra in (("", ""), ("_nobatch", "batching: off\n")):
        (root / f"cls{suffix}" / "1").mkdir(parents=True)
        shutil.copyfile(cls, root / f"cls{suffix}" / "1" / "model.onnx")
        (root / f"cls{suffix}" / "model.yaml").write_text(CLS_YAML + extra)
        (root / f"yolo{suffix}" / "1").mkdir(parents=True)
        onnx.save(model, str(root / f"yolo{suffix}" / "1" / "model.onnx"))
        (root / f"yolo{suffix}" / "model.yaml").write_text(YOLO_YAML.format(batch=16) + extra)
    return {"cls": 0.0, "yolo": gflops}
