"""An Ultralytics classify export with no model.yaml (the exporter-faithful YOLO-cls stand-in,
tools/assets/tasks.py) is fed as ClassificationPredictor feeds it: short side to imgsz,
centre crop (offsets rounded), Pillow's antialiased bilinear, RGB, 1/255. The tensor is the
reference port's (tests/support/ultralytics_classify.py) within one float32 step (edged
multiplies by 1/255 where torch divides by 255), on frames wide, tall (the vertical pass
first), small, odd and real; the top-1 is its. A model.yaml that states a resize squashes."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from support import ultralytics_classify as ref
from support.models import write_yaml

from edged.api.describe import model_config
from edged.model.repository import ModelRepository, ModelVersion
from edged.processing.pre import preprocess
from tools.assets import tasks as task_models

SIZES = [(640, 480), (480, 640), (1280, 720), (333, 517), (227, 224), (229, 224), (100, 300),
         (64, 48), (224, 224), (1920, 1080)]
REAL = ("astronaut.png", "page.png", "alpr_plates.jpg")
ULP = 2.0 ** -24  # one float32 step just under 1.0: x * (1/255) against x / 255


@pytest.fixture
def cls_root(tmp_path: Path) -> Path:
    return task_models.write_task_models(tmp_path / "models", ["cls_yolo"])


def probs(model: ModelVersion, tensor: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    [out] = session.run(None, {"images": tensor})
    return np.asarray(out[0])


def centre_red() -> np.ndarray:
    """Red in the middle third, blue at the sides: red to a centre crop, blue squashed."""
    frame = np.zeros((160, 480, 3), np.uint8)
    frame[:, :] = (255, 0, 0)  # BGR blue
    frame[:, 160:320] = (0, 0, 255)  # BGR red
    return frame


def test_ultralytics_classifier_when_served_without_model_yaml_crops_as_its_predictor(
        cls_root: Path) -> None:
    model = ModelRepository(cls_root).resolve("cls_yolo")
    pre = model.config.preprocess
    assert pre is not None
    assert (pre.resize, pre.resize_short, pre.crop, pre.crop_offset, pre.rounding) == (
        [224, 224], 224, "center", "round", "floor")
    assert (pre.interpolation, pre.color, pre.scale, pre.mean, pre.std) == (
        "pillow_bilinear", "rgb", 1 / 255, [0.0], [1.0])
    reasons = model_config(model)["edged"]["reasons"]
    assert reasons["preprocess"].startswith(
        "Ultralytics classify export (metadata task classify): its predictor's "
        "classify_transforms: short side 224 (torchvision Resize(224)), centre crop 224x224 "
        "(offsets rounded), Pillow's antialiased bilinear"), reasons


def test_ultralytics_classifier_tensor_when_made_is_the_predictors_within_a_float_step(
        cls_root: Path, real_models: Path) -> None:
    model = ModelRepository(cls_root).resolve("cls_yolo")
    assert model.config.preprocess is not None
    frames = [ref.pattern(w, h) for w, h in SIZES]
    frames += [cv2.imread(str(real_models / name), cv2.IMREAD_COLOR) for name in REAL]
    for frame in frames:
        tensor, geometry = preprocess(frame, model.config.preprocess, model.inputs[0])
        expected = ref.classify_tensor(frame, (224, 224))
        assert tensor.shape == expected.shape == (1, 3, 224, 224)
        assert float(np.abs(tensor - expected).max()) <= ULP, frame.shape
        assert int(np.argmax(probs(model, tensor))) == int(np.argmax(probs(model, expected)))
        # the crop's offset maps back: the tensor's middle is the frame's middle
        short = min(frame.shape[:2])
        assert geometry.scale_x == pytest.approx(224 / short, rel=0.01)


def test_ultralytics_classifier_when_the_middle_differs_answers_what_the_crop_sees(
        cls_root: Path, tmp_path: Path) -> None:
    model = ModelRepository(cls_root).resolve("cls_yolo")
    assert model.config.preprocess is not None
    frame = centre_red()
    tensor, _ = preprocess(frame, model.config.preprocess, model.inputs[0])
    assert model.config.postprocess is not None and model.config.postprocess.names
    names = model.config.postprocess.names
    assert names[int(np.argmax(probs(model, tensor)))] == "red"
    assert names[int(np.argmax(probs(model, ref.squashed_tensor(frame, (224, 224)))))] == "blue"
    # model.yaml states a squash: it wins, with Ultralytics' resampler still
    write_yaml(cls_root, "cls_yolo", "preprocess: {resize: [224, 224]}\n")
    squashed = ModelRepository(cls_root).resolve("cls_yolo")
    pre = squashed.config.preprocess
    assert pre is not None and (pre.resize_short, pre.crop, pre.interpolation) == (
        None, "none", "pillow_bilinear")
    assert "its resize and crop left out: model.yaml states resize" in \
        squashed.reasons["preprocess"]
    tensor, _ = preprocess(frame, pre, squashed.inputs[0])
    assert names[int(np.argmax(probs(squashed, tensor)))] == "blue"
    write_yaml(cls_root, "cls_yolo", "preprocess: {crop: none, interpolation: area}\n")
    pre = ModelRepository(cls_root).resolve("cls_yolo").config.preprocess
    assert pre is not None and (pre.resize, pre.resize_short, pre.crop, pre.interpolation) == (
        [224, 224], None, "none", "area")
    # the way out docs/models.md gives a device short of CPU: the crop kept, OpenCV's box filter
    write_yaml(cls_root, "cls_yolo", "preprocess: {interpolation: area}\n")
    boxed = ModelRepository(cls_root).resolve("cls_yolo")
    pre = boxed.config.preprocess
    assert pre is not None and (pre.resize_short, pre.crop, pre.interpolation) == (
        224, "center", "area")
    tensor, _ = preprocess(frame, pre, boxed.inputs[0])
    assert names[int(np.argmax(probs(boxed, tensor)))] == "red"


def test_ultralytics_classifier_when_imgsz_is_not_square_resizes_to_it(
        cls_root: Path) -> None:
    """classify_transforms((h, w)) is Resize((h, w)): the crop then cuts nothing."""
    path = cls_root / "cls_yolo" / "1" / "model.onnx"
    proto = onnx.load(str(path))
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value, dims[3].dim_value = 160, 256
    for prop in proto.metadata_props:
        if prop.key == "imgsz":
            prop.value = "[160, 256]"
    onnx.save(proto, str(path))
    model = ModelRepository(cls_root).resolve("cls_yolo")
    pre = model.config.preprocess
    assert pre is not None and (pre.resize, pre.resize_short, pre.crop, pre.interpolation) == (
        [256, 160], None, "none", "pillow_bilinear")
    assert "resize 256x160 (torchvision Resize((160, 256))" in model.reasons["preprocess"]
    frame = ref.pattern(640, 480)
    tensor, _ = preprocess(frame, pre, model.inputs[0])
    assert float(np.abs(tensor - ref.classify_tensor(frame, (160, 256))).max()) <= ULP
