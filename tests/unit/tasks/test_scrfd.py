"""SCRFD's head (InsightFace's face detector): told from its nine outputs with no model.yaml,
read as a keypoints task with a face's five named points and SCRFD's own pre-processing, and
on a real face (skimage's astronaut) its box and points are those of SCRFD's published
decoding (`support.scrfd_reference`), on the exporter-faithful stand-in."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from support import scrfd_reference

from edged.api.describe import model_config
from edged.core.errors import InvalidModel
from edged.model.config import PostprocessConfig
from edged.model.heads import choose_head
from edged.model.repository import ModelRepository
from edged.model.tensor import TensorSpec
from edged.processing.post import Postprocessor
from edged.processing.pre import image_preprocess, preprocess
from edged.tasks.keypoints import FACE_LANDMARKS
from tools.assets.faces import make_face_scrfd, paste_face
from tools.assets.models import write_model
from tools.real_models import member


@pytest.fixture
def scrfd(tmp_path: Path) -> Path:
    write_model(make_face_scrfd(), tmp_path / "scrfd" / "1" / "model.onnx")
    return tmp_path


def test_scrfd_when_read_with_no_model_yaml_is_a_face_keypoints_task(scrfd: Path) -> None:
    model = ModelRepository(scrfd).resolve("scrfd")
    edged = model_config(model)["edged"]
    assert model.head is not None and model.head.format == "scrfd"
    assert [lv[0] for lv in model.head.levels] == [8, 16, 32] and model.head.anchors == 2
    assert edged["task"]["kind"] == "pose" and "5 landmarks" in edged["task"]["reason"]
    assert "scrfd's own pre-processing" in model.reasons["preprocess"]
    pre = model.config.preprocess
    assert pre is not None and (pre.pad, pre.mean, pre.std) == ("end", [127.5] * 3, [128.0] * 3)


@pytest.mark.parametrize(("x", "y", "size", "frame"), [(200, 100, 200, (480, 640)),
                                                       (30, 260, 170, (720, 540))])
def test_scrfd_when_a_face_is_in_view_finds_what_scrfds_own_decoding_finds(
        scrfd: Path, x: int, y: int, size: int, frame: tuple[int, int]) -> None:
    model = ModelRepository(scrfd).resolve("scrfd")
    picture = np.zeros((*frame, 3), np.uint8)
    paste_face(picture, cv2.imread(str(member("astronaut.png")))[20:240, 100:300], x, y, size)
    spec = model.inputs[0]
    pre = image_preprocess(model.config.preprocess, model.label, spec, model.max_batch_size > 0)
    tensor, geometry = preprocess(picture, pre, spec)
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {spec.name: tensor}), strict=True))
    post = Postprocessor(model.config.postprocess, scrfd, model.head)
    [found] = post(outputs, geometry)["detections"].rows()
    dets, points = scrfd_reference.detect(session, picture)
    assert len(dets) == 1
    assert found["box"] == pytest.approx(dets[0, :4].tolist(), abs=0.05)
    assert found["score"] == pytest.approx(float(dets[0, 4]), abs=1e-4)
    assert list(found["keypoints"]) == list(FACE_LANDMARKS)
    assert np.array(list(found["keypoints"].values())) == pytest.approx(points[0], abs=0.06)
    assert found["box"] == pytest.approx([x, y, x + size, y + size], abs=2.0)


def test_scrfd_when_a_levels_part_is_missing_with_format_scrfd_names_the_shapes() -> None:
    specs = [TensorSpec(f"o{i}", np.dtype(np.float32), (n, w)) for i, (n, w) in enumerate(
        [(3200, 1), (800, 1), (200, 1), (3200, 4), (800, 4), (200, 4), (3200, 10), (800, 10)])]
    with pytest.raises(InvalidModel, match="detect/scrfd: expected per stride scores"):
        choose_head(specs, None, PostprocessConfig(kind="detect", format="scrfd"))


def test_yunet_when_a_face_is_in_view_finds_what_opencvs_own_decoding_finds(
        tmp_path: Path) -> None:
    """YuNet's head (OpenCV's FaceDetectorYN): told by its twelve named outputs, read as a face
    keypoints task with BGR pixels as they are, and held to OpenCV's published decoding."""
    from support import yunet_reference

    from tools.assets.faces import make_face_yunet

    write_model(make_face_yunet(), tmp_path / "yunet" / "1" / "model.onnx")
    model = ModelRepository(tmp_path).resolve("yunet")
    assert model.head is not None and model.head.format == "yunet"
    assert model_config(model)["edged"]["task"]["kind"] == "pose"
    assert model.config.preprocess is not None and model.config.preprocess.color == "bgr"
    picture = np.zeros((480, 640, 3), np.uint8)
    paste_face(picture, cv2.imread(str(member("astronaut.png")))[20:240, 100:300], 250, 90, 210)
    spec = model.inputs[0]
    pre = image_preprocess(model.config.preprocess, model.label, spec, model.max_batch_size > 0)
    tensor, geometry = preprocess(picture, pre, spec)
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    outputs = dict(zip([o.name for o in session.get_outputs()],
                       session.run(None, {spec.name: tensor}), strict=True))
    found = Postprocessor(model.config.postprocess, tmp_path, model.head)(
        outputs, geometry)["detections"].rows()
    faces, points = yunet_reference.detect(session, picture)
    assert len(found) == len(faces) == 1
    assert found[0]["box"] == pytest.approx(faces[0, :4].tolist(), abs=0.05)
    assert found[0]["score"] == pytest.approx(float(faces[0, 4]), abs=1e-4)
    assert np.array(list(found[0]["keypoints"].values())) == pytest.approx(points[0], abs=0.06)
    assert found[0]["box"] == pytest.approx([250, 90, 460, 300], abs=2.0)
