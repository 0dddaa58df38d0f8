"""Segment and pose tasks end to end on exporter-faithful YOLO-seg and YOLO-pose exports (real
ONNX files, real ONNX Runtime): recognised from the file with no model.yaml, masks decoded for
the kept boxes only as Ultralytics' own `process_mask` makes them (a numpy port of the
published code), polygons in frame pixels through the letterbox and bounded in points,
keypoints named and in frame pixels; bad heads refused at load."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from support import ultralytics_masks as ref

from edged.api.describe import model_config
from edged.core.errors import InvalidModel
from edged.model.config import PostprocessConfig, PreprocessConfig
from edged.model.repository import ModelRepository, ModelVersion
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor, published
from edged.processing.pre import Geometry, preprocess
from edged.tasks.keypoints import COCO_KEYPOINTS
from edged.tasks.segment import mask_bitmap, simplify
from tools.assets import tasks as task_models
from tools.assets.models import write_model

FRAME = (160, 120)  # width, height: letterboxed into 64 x 64 with 8 px bars above and below


def ellipse_frame() -> np.ndarray:
    frame = np.zeros((FRAME[1], FRAME[0], 3), np.uint8)
    cv2.ellipse(frame, (70, 60), (40, 28), 20, 0, 360, (0, 255, 0), -1)  # green: bicycle
    return frame


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    return ModelRepository(task_models.write_task_models(tmp_path / "models"))


def run(model: ModelVersion, frame: np.ndarray
        ) -> tuple[dict[str, np.ndarray], Geometry, dict[str, object]]:
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    tensor, geometry = preprocess(frame, model.config.preprocess or PreprocessConfig(),
                                  model.inputs[0])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, {model.inputs[0].name: tensor}), strict=True))
    post = Postprocessor(model.config.postprocess, model.dir.parent, model.head)
    return outputs, geometry, post(outputs, geometry)


def test_segment_export_when_read_without_model_yaml_is_recognised_with_its_parts(
        repo: ModelRepository) -> None:
    model = repo.resolve("seg_yolo")
    edged = model_config(model)["edged"]
    assert edged["task"] == {"kind": "segment",
                             "reason": "kind segment from metadata task: segment"}
    assert edged["postprocess"]["proto"] == "output1"
    assert model.head is not None and model.head.extra == 32
    assert "32 per-candidate values" in model.head.reason
    pose = model_config(repo.resolve("pose_yolo"))["edged"]
    assert pose["task"]["kind"] == "pose"
    assert pose["postprocess"]["kpt_shape"] == [17, 3]
    assert pose["postprocess"]["keypoint_names"] == list(COCO_KEYPOINTS)


def test_segment_masks_when_decoded_match_ultralytics_process_mask_in_frame_pixels(
        repo: ModelRepository) -> None:
    model = repo.resolve("seg_yolo")
    frame = ellipse_frame()
    outputs, _geometry, results = run(model, frame)
    found = results["detections"]
    assert isinstance(found, Detections)
    rows = published(results)["detections"]
    assert [(d["label"], d["score"]) for d in rows] == [("bicycle", 1.0)]  # the copy: NMS'd
    polygon = np.array(rows[0]["mask"])
    assert 4 <= len(polygon) <= model.config.postprocess.mask_points  # type: ignore[union-attr]
    # Ultralytics: the chosen candidate's coefficients and its box in input pixels
    table = outputs["output0"][0]
    best = int(table[4:7].max(axis=0).argmax())
    box = table[:4, best]
    xyxy = np.array([[box[0] - box[2] / 2, box[1] - box[3] / 2, box[0] + box[2] / 2,
                      box[1] + box[3] / 2]])
    masks = ref.process_mask(outputs["output1"][0], table[7:, best][None], xyxy, (64, 64))
    segment = ref.scale_coords((64, 64), ref.masks2segments(masks)[0], (FRAME[1], FRAME[0]))
    theirs = ref.raster(segment, FRAME)
    ours = ref.raster(polygon, FRAME)
    assert ref.iou(ours, theirs) > 0.9
    # the object itself: the lit ellipse, within the 4-pixel cells of the prototypes
    lit = frame.max(axis=2) > 127
    assert ref.iou(ours, lit) > 0.8
    # pixel for pixel, edged's window is Ultralytics' whole-map mask
    bitmap, x0, y0 = mask_bitmap(outputs["output1"][0], table[7:, best], xyxy[0], (64, 64), 0.5)
    assert bitmap.any()
    whole = masks[0].astype(np.uint8)
    assert np.array_equal(bitmap, whole[y0:y0 + bitmap.shape[0], x0:x0 + bitmap.shape[1]])
    assert whole.sum() == bitmap.sum()  # nothing of the mask lies outside the window


def test_segment_when_the_frame_is_dark_finds_nothing_and_decodes_no_mask(
        repo: ModelRepository) -> None:
    _, _, results = run(repo.resolve("seg_yolo"), np.zeros((FRAME[1], FRAME[0], 3), np.uint8))
    assert published(results) == {"detections": []}


def test_mask_polygon_when_the_contour_is_long_is_simplified_under_the_bound() -> None:
    theta = np.linspace(0, 2 * np.pi, 500, endpoint=False)
    radius = 100 + 10 * np.sin(theta * 25)
    contour = np.stack([200 + radius * np.cos(theta), 200 + radius * np.sin(theta)],
                       axis=1).round().astype(np.int32).reshape(-1, 1, 2)
    for bound in (8, 32, 64):
        simplified = simplify(contour, bound)
        assert 3 <= len(simplified) <= bound
    assert simplify(contour[:10], 64) is not None and len(simplify(contour[:10], 64)) == 10


def test_pose_keypoints_when_decoded_are_named_in_frame_pixels_with_their_scores(
        repo: ModelRepository) -> None:
    model = repo.resolve("pose_yolo")
    frame = np.zeros((FRAME[1], FRAME[0], 3), np.uint8)
    frame[30:90, 40:100] = (0, 255, 0)
    _, _, results = run(model, frame)
    rows = published(results)["detections"]
    assert [d["label"] for d in rows] == ["person"]
    x1, y1, x2, y2 = rows[0]["box"]
    assert (x1, y1, x2, y2) == (40.0, 30.0, 100.0, 90.0)
    points = rows[0]["keypoints"]
    assert list(points) == list(COCO_KEYPOINTS)
    for name, (fx, fy, seen) in zip(COCO_KEYPOINTS, task_models.POINTS, strict=True):
        x, y, score = points[name]
        assert x == pytest.approx(x1 + fx * (x2 - x1), abs=0.1)
        assert y == pytest.approx(y1 + fy * (y2 - y1), abs=0.1)
        assert score == pytest.approx(seen, abs=1e-4)


def test_segment_when_the_prototypes_disagree_with_the_table_is_refused_at_load(
        tmp_path: Path) -> None:
    model = task_models.make_seg_yolo()
    proto = model.graph.output[1].type.tensor_type.shape.dim[1]
    proto.dim_value = 16  # the table still carries 32 coefficients a candidate
    zeros = next(i for i in model.graph.initializer if i.name == "zeros31")
    zeros.CopyFrom(onnx.numpy_helper.from_array(np.zeros((1, 15, 1, 1), np.float32), "zeros31"))
    write_model(model, tmp_path / "seg" / "1" / "model.onnx")
    with pytest.raises(InvalidModel, match="fits no detection head"):
        ModelRepository(tmp_path).resolve("seg")


def test_pose_when_the_metadata_has_no_kpt_shape_is_refused_at_load_naming_it(
        tmp_path: Path) -> None:
    model = task_models.make_pose_yolo()
    kept = [p for p in model.metadata_props if p.key != "kpt_shape"]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    write_model(model, tmp_path / "pose" / "1" / "model.onnx")
    with pytest.raises(InvalidModel, match="no kpt_shape"):
        ModelRepository(tmp_path).resolve("pose")


def test_segment_when_served_from_tensors_alone_maps_masks_in_input_pixels() -> None:
    """`edged infer` with a .npy input: no geometry, the polygon stays in input pixels (the
    prototypes' stride 4 gives the input's size)."""
    proto = np.full((32, 16, 16), -10, np.float32)
    proto[0, 4:12, 4:12] = 10
    table = np.zeros((1, 39, 84), np.float32)
    table[0, :4, 0] = [32, 32, 32, 32]  # cx, cy, w, h: the lit 16..48 square
    table[0, 4, 0] = 0.9
    table[0, 7, 0] = 1.0
    cfg = PostprocessConfig(kind="segment", names=["a", "b", "c"])
    results = Postprocessor(cfg, Path("."))({"output0": table, "output1": proto[None]}, None)
    rows = published(results)["detections"]
    xs, ys = zip(*rows[0]["mask"], strict=True)
    # Ultralytics crops in prototype cells, then upsamples: the mask reaches past the box
    # until the centre of the first cropped (zeroed) cell, 13.5 and 49.5 input pixels
    whole = ref.process_mask(proto, table[0, 7:, :1].T, np.array([[16, 16, 48, 48]]),
                             (64, 64))[0]
    rows_lit, cols_lit = np.nonzero(whole)
    assert (min(xs), min(ys), max(xs), max(ys)) == (cols_lit.min(), rows_lit.min(),
                                                    cols_lit.max(), rows_lit.max())
    assert (min(xs), min(ys), max(xs), max(ys)) == (14, 14, 49, 49)


def test_keypoints_when_the_model_gives_nan_are_published_unseen_never_nan() -> None:
    from edged.tasks.keypoints import keypoints

    values = np.array([[10, 20, 0.9, np.nan, 5, 0.8, 7, np.inf, 0.7]], np.float32)
    [points] = keypoints(values, (3, 3), ["a", "b", "c"], None)
    assert points == {"a": [10.0, 20.0, 0.9], "b": [0.0, 0.0, 0.0], "c": [0.0, 0.0, 0.0]}
