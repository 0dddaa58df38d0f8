"""Exporter-faithful stand-ins for the face pipeline's two models, for tests and the faces
benchmark (no wheel on PyPI was found to ship a trained face detector or embedder as ONNX:
docs/models.md lists what was tried).

- `face_yolo`: a YOLOv8-face export as Ultralytics' pose exporter writes it (derronqi's
  yolov8-face, yolov11-face): `images` [1, 3, 160, 160] → `output0` [1, 4+1+5*3, 525] (cx, cy,
  w, h, the face score, five landmarks x, y, visibility), metadata task pose, kpt_shape
  [5, 3], names {0: face}. Its answer is one a test can compute: in each half of the picture
  (left, right) the lit pixels' bounding box is a face (`tools.assets.models`' bright box), its
  landmarks where ArcFace's template puts them in a 112 x 112 crop of that box. A face pasted
  with a bright 1-pixel frame onto a dark picture is found exactly; two faces, one in each
  half, are two.
- `face_embedder`: an InsightFace ArcFace export's shape (`input.1` [N, 3, 112, 112], (x -
  127.5) / 127.5 RGB → `683` [N, 512], no metadata): its weights are a fixed seeded random
  projection of the crop's 4 x 4-pooled pixels less their mean, so the same aligned face gives
  the same vector, a face moved or rescaled a close one, and another face (or the cat) a far
  one. A new seed is a new embedder (an OTA update whose vectors are not comparable).

    python -m tools.assets.faces DIR      # DIR/face_yolo/1 and DIR/face_embedder/1
"""

from __future__ import annotations

import sys
from pathlib import Path

import cv2
import numpy as np
import onnx
from onnx import helper

from tools.assets.models import (
    _N,
    _bright_box,
    _const,
    _rows,
    build_model,
    declare_float,
    write_model,
)

FACE_SIZE = 160
FACE_GRID = (FACE_SIZE // 8) ** 2 + (FACE_SIZE // 16) ** 2 + (FACE_SIZE // 32) ** 2  # 525
EMBED_DIM = 512
CROP = 112
# ArcFace's template (InsightFace's arcface_dst) as fractions of its 112 x 112 crop.
ARCFACE = ((38.2946, 51.6963), (73.5318, 51.5014), (56.0252, 71.7366), (41.5493, 92.3655),
           (70.7299, 92.2041))
VISIBLE = 0.95
EMBEDDER_YAML = ("preprocess: {resize: [112, 112], keep_ratio: false, color: rgb, "
                 "mean: [0.5, 0.5, 0.5], std: [0.5, 0.5, 0.5], layout: nchw}\n"
                 "max_batch_size: 8\n")


def _half(prefix: str, start: int, consts: set[str]) -> tuple[list[onnx.NodeProto],
                                                              list[onnx.TensorProto]]:
    """The bright box of one half of the input (columns start..start+W/2), its names
    prefixed, in whole-input pixels: `<p>xyxy`, `<p>cxcywh`, `<p>score` and the NMS copy."""
    nodes, inits = _bright_box()
    names = {i.name for i in inits} | consts
    renamed = []
    for node in nodes:
        node.input[:] = [n if n in names else f"{prefix}{n}" for n in node.input]
        node.output[:] = [f"{prefix}{n}" for n in node.output]
        renamed.append(node)
    half = FACE_SIZE // 2
    nodes = [_N("Slice", ["images", f"{prefix}starts", f"{prefix}ends", "axis3"],
                [f"{prefix}x"])]
    for node in renamed:  # the half's own box, moved into the whole input's columns
        if node.output[0] == f"{prefix}xyxy":
            nodes += [_N("Add", [f"{prefix}corners", "to_end"], [f"{prefix}xyxy_local"]),
                      _N("Add", [f"{prefix}xyxy_local", f"{prefix}offset"],
                         [f"{prefix}xyxy_all"])]
            continue
        node.input[:] = [f"{prefix}xyxy_all" if n == f"{prefix}xyxy" else n
                         for n in node.input]
        nodes.append(node)
    more = [_const(f"{prefix}starts", [start], np.int64),
            _const(f"{prefix}ends", [start + half], np.int64),
            _const(f"{prefix}offset", [start, 0, start, 0])]
    return nodes, inits + more


def make_face_yolo(seed: int = 0) -> onnx.ModelProto:
    """The YOLOv8-face-shaped detector (module docstring)."""
    del seed
    weights = np.zeros((4, 15), np.float32)
    bias = np.zeros(15, np.float32)
    for i, (x, y) in enumerate(ARCFACE):
        fx, fy = x / CROP, y / CROP
        weights[0, 3 * i], weights[2, 3 * i] = 1 - fx, fx
        weights[1, 3 * i + 1], weights[3, 3 * i + 1] = 1 - fy, fy
        bias[3 * i + 2] = VISIBLE
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = [_const("axis3", [3], np.int64),
                                     _const("axis1", [1], np.int64),
                                     _const("kpt_w", weights), _const("kpt_b", bias)]
    seen: set[str] = set()
    rows = []
    for prefix, start in (("l_", 0), ("r_", FACE_SIZE // 2)):
        more_nodes, more_inits = _half(prefix, start, {"axis3"})
        nodes += more_nodes
        inits += [i for i in more_inits if i.name not in seen]
        seen |= {i.name for i in more_inits}
        nodes += [_N("MatMul", [f"{prefix}xyxy_all", "kpt_w"], [f"{prefix}kpt_0"]),
                  _N("Add", [f"{prefix}kpt_0", "kpt_b"], [f"{prefix}kpts"])]
        rows += [[f"{prefix}cxcywh", f"{prefix}score", f"{prefix}kpts"],
                 [f"{prefix}cxcywh_dup", f"{prefix}score_dup", f"{prefix}kpts"]]
    more_nodes, more_inits = _rows(rows, FACE_GRID, "output0", transpose=True)
    model = build_model("face_yolo", nodes + more_nodes,
                        [declare_float("images", [1, 3, FACE_SIZE, FACE_SIZE])],
                        [declare_float("output0", [1, 5 + 15, FACE_GRID])],
                        _unique(inits + more_inits))
    helper.set_model_props(model, {
        "description": "Ultralytics YOLOv8n-pose model trained on widerface.yaml",
        "author": "Ultralytics", "version": "8.3.200", "task": "pose", "stride": "32",
        "batch": "1", "imgsz": f"[{FACE_SIZE}, {FACE_SIZE}]", "names": "{0: 'face'}",
        "kpt_shape": "[5, 3]"})
    return model


SCRFD_SIZE = 320
# InsightFace's scrfd_*_bnkps.onnx output order and (numeric) names: scores, boxes, points per
# stride 8, 16, 32
SCRFD_OUTPUTS = (("448", "471", "494"), ("451", "474", "497"), ("454", "477", "500"))


def make_face_scrfd(seed: int = 0) -> onnx.ModelProto:
    """An SCRFD export as InsightFace's `scrfd_*_bnkps.onnx` are laid out: `input.1 [1, 3,
    320, 320]`, (x - 127.5) / 128 RGB, nine outputs (scores [1, N, 1], boxes [1, N, 4],
    points [1, N, 10] per stride 8, 16, 32, in that order; two anchors a cell; the batched
    form its newer exports write and `SCRFD` reads). Its answer: every
    anchor whose centre (its cell's top-left corner times the stride) lies inside the lit box
    scores the box's brightness and gives the box (distances to its sides, in strides) and the
    five points where ArcFace's template puts them in it (offsets, in strides)."""
    del seed
    nodes, inits = _bright_box()
    for node in nodes:
        node.input[:] = ["input.1" if n == "x" else n for n in node.input]
    weights = np.zeros((4, 10), np.float32)
    for i, (x, y) in enumerate(ARCFACE):
        fx, fy = x / CROP, y / CROP
        weights[0, 2 * i], weights[2, 2 * i] = 1 - fx, fx
        weights[1, 2 * i + 1], weights[3, 2 * i + 1] = 1 - fy, fy
    inits += [_const("points_w", weights), _const("sides", [-1, -1, 1, 1]),
              _const("zero", 0.0), _const("axis0", [0], np.int64)]
    nodes += [_N("MatMul", ["xyxy", "points_w"], ["points"]),
              _N("Mul", ["xyxy", "sides"], ["signed"])]
    outputs = []
    for level, stride in enumerate((8, 16, 32)):
        cells = SCRFD_SIZE // stride
        ys, xs = np.mgrid[0:cells, 0:cells]
        centres = np.repeat(np.stack([xs, ys], -1).reshape(-1, 2) * stride, 2, axis=0)
        n = len(centres)
        score, box, point = (names[level] for names in SCRFD_OUTPUTS)
        inits += [_const(f"c4_{stride}", np.concatenate([centres, -centres], 1)),
                  _const(f"c10_{stride}", -np.tile(centres, 5)),
                  _const(f"inv_{stride}", 1.0 / stride)]
        nodes += [_N("Add", ["signed", f"c4_{stride}"], [f"d_{stride}"]),
                  _N("Mul", [f"d_{stride}", f"inv_{stride}"], [f"{box}_2d"]),
                  _N("ReduceMin", [f"d_{stride}"], [f"near_{stride}"], axes=[1], keepdims=1),
                  _N("Greater", [f"near_{stride}", "zero"], [f"in_{stride}"]),
                  _N("Cast", [f"in_{stride}"], [f"inf_{stride}"], to=onnx.TensorProto.FLOAT),
                  _N("Mul", [f"inf_{stride}", "score"], [f"{score}_2d"]),
                  _N("Add", ["points", f"c10_{stride}"], [f"p_{stride}"]),
                  _N("Mul", [f"p_{stride}", f"inv_{stride}"], [f"{point}_2d"])]
        nodes += [_N("Unsqueeze", [f"{name}_2d", "axis0"], [name]) for name in (score, box, point)]
        outputs.append((score, box, point, n))
    declared = [declare_float(o[0], [1, o[3], 1]) for o in outputs] + \
        [declare_float(o[1], [1, o[3], 4]) for o in outputs] + \
        [declare_float(o[2], [1, o[3], 10]) for o in outputs]
    return build_model("face_scrfd", nodes,
                       [declare_float("input.1", [1, 3, SCRFD_SIZE, SCRFD_SIZE])], declared,
                       _unique(inits))


def make_face_yunet(seed: int = 0) -> onnx.ModelProto:
    """A YuNet export as OpenCV's zoo ships `face_detection_yunet_2023mar.onnx`: `input [1, 3,
    320, 320]` BGR pixels 0..255, twelve outputs `cls_<s>`, `obj_<s>` [1, N, 1], `bbox_<s>`
    [1, N, 4], `kps_<s>` [1, N, 10] for s = 8, 16, 32 (one anchor a cell), in that order. Its
    answer: every cell whose corner lies inside the lit box scores cls 0.9, obj 1.0 and gives
    the box (centre offsets from the cell and log sizes, in strides) and the five points at
    ArcFace's template in it (offsets from the cell, in strides)."""
    del seed
    nodes, inits = _bright_box()
    for node in nodes:
        node.input[:] = ["input" if n == "x" else n for n in node.input]
    weights = np.zeros((4, 10), np.float32)
    for i, (x, y) in enumerate(ARCFACE):
        fx, fy = x / CROP, y / CROP
        weights[0, 2 * i], weights[2, 2 * i] = 1 - fx, fx
        weights[1, 2 * i + 1], weights[3, 2 * i + 1] = 1 - fy, fy
    pick_xy = np.array([[1, 0], [0, 1], [0, 0], [0, 0]], np.float32)
    pick_wh = np.array([[0, 0], [0, 0], [1, 0], [0, 1]], np.float32)
    inits += [_const("points_w", weights), _const("sides", [-1, -1, 1, 1]),
              _const("zero", 0.0), _const("axis0", [0], np.int64), _const("cls_p", 0.9),
              _const("pick_xy", pick_xy), _const("pick_wh", pick_wh)]
    nodes += [_N("MatMul", ["xyxy", "points_w"], ["points"]),
              _N("Mul", ["xyxy", "sides"], ["signed"]),
              _N("MatMul", ["cxcywh", "pick_xy"], ["centre"]),
              _N("MatMul", ["cxcywh", "pick_wh"], ["size"])]
    parts: dict[str, list[str]] = {"cls": [], "obj": [], "bbox": [], "kps": []}
    shapes = {}
    for stride in (8, 16, 32):
        cells = SCRFD_SIZE // stride
        ys, xs = np.mgrid[0:cells, 0:cells]
        grid = np.stack([xs, ys], -1).reshape(-1, 2).astype(np.float32)
        n = len(grid)
        s = str(stride)
        inits += [_const(f"corner4_{s}", np.concatenate([grid, -grid], 1) * stride),
                  _const(f"grid_{s}", -grid), _const(f"grid10_{s}", -np.tile(grid, 5)),
                  _const(f"inv_{s}", 1.0 / stride), _const(f"zeros2_{s}", np.zeros((n, 2))),
                  _const(f"ones_{s}", np.ones((n, 1)))]
        nodes += [_N("Add", ["signed", f"corner4_{s}"], [f"d_{s}"]),
                  _N("ReduceMin", [f"d_{s}"], [f"near_{s}"], axes=[1], keepdims=1),
                  _N("Greater", [f"near_{s}", "zero"], [f"in_{s}"]),
                  _N("Cast", [f"in_{s}"], [f"inf_{s}"], to=onnx.TensorProto.FLOAT),
                  _N("Mul", [f"inf_{s}", "cls_p"], [f"cls_{s}_2d"]),
                  _N("Mul", [f"ones_{s}", f"inf_{s}"], [f"obj_{s}_2d"]),
                  _N("Mul", ["centre", f"inv_{s}"], [f"c_{s}"]),
                  _N("Add", [f"c_{s}", f"grid_{s}"], [f"dc_{s}"]),
                  _N("Mul", ["size", f"inv_{s}"], [f"sz_{s}"]),
                  _N("Log", [f"sz_{s}"], [f"lsz_{s}"]),
                  _N("Add", [f"lsz_{s}", f"zeros2_{s}"], [f"lszn_{s}"]),
                  _N("Concat", [f"dc_{s}", f"lszn_{s}"], [f"bbox_{s}_2d"], axis=1),
                  _N("Mul", ["points", f"inv_{s}"], [f"pp_{s}"]),
                  _N("Add", [f"pp_{s}", f"grid10_{s}"], [f"kps_{s}_2d"])]
        for part, width in (("cls", 1), ("obj", 1), ("bbox", 4), ("kps", 10)):
            name = f"{part}_{s}"
            nodes.append(_N("Unsqueeze", [f"{name}_2d", "axis0"], [name]))
            parts[part].append(name)
            shapes[name] = [1, n, width]
    order = [name for part in ("cls", "obj", "bbox", "kps") for name in parts[part]]
    return build_model("face_yunet", nodes,
                       [declare_float("input", [1, 3, SCRFD_SIZE, SCRFD_SIZE])],
                       [declare_float(name, shapes[name]) for name in order], _unique(inits))


def _unique(inits: list[onnx.TensorProto]) -> list[onnx.TensorProto]:
    kept: dict[str, onnx.TensorProto] = {}
    for init in inits:
        kept.setdefault(init.name, init)
    return list(kept.values())


def make_face_embedder(seed: int = 0) -> onnx.ModelProto:
    """The ArcFace-shaped embedder (module docstring); `seed` picks its projection."""
    rng = np.random.default_rng(1000 + seed)
    pooled = 3 * (CROP // 4) ** 2
    projection = (rng.standard_normal((pooled, EMBED_DIM)) / np.sqrt(pooled)).astype(np.float32)
    nodes = [_N("AveragePool", ["input.1"], ["pooled"], kernel_shape=[4, 4], strides=[4, 4]),
             _N("Flatten", ["pooled"], ["flat"], axis=1),
             _N("ReduceMean", ["flat"], ["mean"], axes=[1], keepdims=1),
             _N("Sub", ["flat", "mean"], ["centred"]),
             _N("MatMul", ["centred", "fc_w"], ["683"])]
    return build_model("face_embedder", nodes,
                       [declare_float("input.1", ["None", 3, CROP, CROP])],
                       [declare_float("683", ["None", EMBED_DIM])], [_const("fc_w", projection)])


def write_face_models(root: Path, *, embedder_versions: int = 1) -> Path:
    """DIR/face_yolo/1/model.onnx, DIR/face_embedder/<v>/model.onnx (seed v-1) and its
    model.yaml (ArcFace's pre-processing, which InsightFace's files do not carry)."""
    write_model(make_face_yolo(), root / "face_yolo" / "1" / "model.onnx")
    for version in range(1, embedder_versions + 1):
        write_embedder_version(root, version)
    (root / "face_embedder" / "model.yaml").write_text(EMBEDDER_YAML)
    return root


def write_embedder_version(root: Path, version: int) -> Path:
    return write_model(make_face_embedder(version - 1),
                       root / "face_embedder" / str(version) / "model.onnx")


def paste_face(canvas: np.ndarray, face: np.ndarray, x: int, y: int, size: int) -> np.ndarray:
    """`face` resized to size x size onto `canvas` at (x, y) with a white 1-pixel frame (so
    the stand-in detector's lit box is the square); returns the canvas."""
    patch = cv2.resize(face, (size, size), interpolation=cv2.INTER_AREA)
    patch[0, :] = patch[-1, :] = 255
    patch[:, 0] = patch[:, -1] = 255
    canvas[y:y + size, x:x + size] = patch
    return canvas


if __name__ == "__main__":
    write_face_models(Path(sys.argv[1]))
