"""Stock detectors dropped into the repository with no model.yaml: their ONNX metadata and
output shapes give the head, labels and pre-processing, so a lit square in a 160x120 frame
comes back boxed in frame pixels through the letterbox; a head that cannot be told fails the
load; a model.yaml that speaks wins. Real ONNX files, real ONNX Runtime sessions."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from support.models import write_yaml

from edged.api.describe import model_config
from edged.core.errors import InvalidModel
from edged.model.config import PreprocessConfig
from edged.model.repository import ModelRepository, ModelVersion
from edged.processing.post import Postprocessor, Results, published
from edged.processing.pre import Geometry, preprocess
from tools.assets import models as test_models

SQUARE = (60, 40, 100, 80)  # x1, y1, x2, y2 in the 160x120 frame
HEADS = ["det_yolov8", "det_yolov5", "det_end2end", "det_ssd", "det_ssd_background",
         "det_detr", "det_detr_pair"]


def lit_frame(lit: bool = True) -> np.ndarray:
    frame = np.zeros((120, 160, 3), np.uint8)
    if lit:
        x1, y1, x2, y2 = SQUARE
        frame[y1:y2, x1:x2] = (0, 255, 0)  # BGR green: the model's class 1, "bicycle"
    return frame


def serve(model: ModelVersion, frame: np.ndarray) -> tuple[Results, Geometry]:
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    tensor, geometry = preprocess(frame, model.config.preprocess or PreprocessConfig(),
                                  model.inputs[0])
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, {model.inputs[0].name: tensor}), strict=True))
    post = Postprocessor(model.config.postprocess, model.dir.parent, model.head)
    return published(post(outputs, geometry)), geometry


@pytest.fixture
def detectors(tmp_path: Path) -> Path:
    return test_models.write_repository(tmp_path / "models",
                                             names=list(test_models.DETECTORS))


@pytest.mark.parametrize("name", HEADS)
def test_stock_detector_when_served_without_model_yaml_boxes_the_square_in_frame_pixels(
        detectors: Path, name: str) -> None:
    assert not (detectors / name / "model.yaml").exists()
    model = ModelRepository(detectors).resolve(name)
    assert model.head is not None and model.head.reason
    results, _geometry = serve(model, lit_frame())
    [found] = results["detections"]  # the copy a pixel off is suppressed, or never emitted
    assert (found["class"], found["label"]) == (1, "bicycle")
    assert found["score"] > 0.9
    assert found["box"] == pytest.approx(SQUARE, abs=3)
    assert serve(model, lit_frame(lit=False))[0] == {"detections": []}


def test_stock_detector_when_ultralytics_letterboxes_pads_with_its_grey(
        detectors: Path) -> None:
    model = ModelRepository(detectors).resolve("det_yolov8")
    pre = model.config.preprocess
    assert pre is not None and (pre.keep_ratio, pre.pad_value, pre.color, pre.resize) == (
        True, 114.0, "rgb", [96, 64])  # imgsz [64, 96] is height, width
    _results, geometry = serve(model, lit_frame())
    assert (geometry.pad_x, geometry.pad_y) == (5, 0)  # 160x120 → 85x64 in 96x64


def test_ultralytics_classifier_without_model_yaml_labels_classes_from_its_metadata(
        detectors: Path) -> None:
    model = ModelRepository(detectors).resolve("cls_ultralytics")
    frame = np.zeros((120, 160, 3), np.uint8)
    frame[:] = (0, 0, 255)  # BGR red
    results, _geometry = serve(model, frame)
    assert results["classes"][0]["label"] == "red"
    assert model.head is None and "classify" in model.reasons["postprocess"]


def test_stock_detector_when_the_head_is_ambiguous_fails_at_load_with_the_fix(
        detectors: Path) -> None:
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(detectors).resolve("det_ambiguous")
    message = str(caught.value)
    assert "det_ambiguous/1/model.onnx" in message
    assert "output0 [-1, 84, 84] fits more than one head" in message
    assert "postprocess.format: yolov8 with transposed: true" in message
    write_yaml(detectors, "det_ambiguous", "postprocess: {format: yolov8, transposed: true}\n")
    model = ModelRepository(detectors).resolve("det_ambiguous")
    assert model.head is not None and model.head.transposed


def test_detect_when_no_head_fits_the_outputs_fails_at_load_naming_them(
        repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "postprocess: {kind: detect}\n")
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(repo_dir).resolve("tiny_cls")
    assert "output prob [-1, 4]" in str(caught.value)
    assert "postprocess.kind: raw" in str(caught.value)


def test_model_yaml_when_it_speaks_wins_over_the_metadata_key_by_key(
        detectors: Path) -> None:
    write_yaml(detectors, "det_end2end", "preprocess: {keep_ratio: false}\n"
                                         "postprocess: {names: [a, b, c], score_threshold: 0.5}\n")
    model = ModelRepository(detectors).resolve("det_end2end")
    pre, post = model.config.preprocess, model.config.postprocess
    assert pre is not None and post is not None
    assert (pre.keep_ratio, pre.pad_value) == (False, 114.0)  # the rest is still Ultralytics'
    assert (post.kind, post.names, post.score_threshold) == ("detect", ["a", "b", "c"], 0.5)
    assert "model.yaml: keep_ratio" in model.reasons["preprocess"]
    results, geometry = serve(model, lit_frame())
    assert (geometry.pad_x, geometry.pad_y) == (0, 0)  # stretched, as model.yaml says
    assert [d["label"] for d in results["detections"]] == ["b"]
    assert results["detections"][0]["box"] == pytest.approx(SQUARE, abs=3)
    write_yaml(detectors, "det_end2end", "postprocess: {kind: raw}\n")
    raw = ModelRepository(detectors).resolve("det_end2end")
    assert raw.head is None and "outputs" in serve(raw, lit_frame())[0]


def test_stock_detector_when_its_metadata_is_malformed_loads_on_the_shapes_alone(
        detectors: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = detectors / "det_end2end" / "1" / "model.onnx"
    model_proto = onnx.load(str(path))
    del model_proto.metadata_props[:]
    onnx.helper.set_model_props(model_proto, {
        "author": "Ultralytics", "task": "detect", "names": "{0: 'person', 1: ",
        "imgsz": "[64", "end2end": "maybe"})
    path.write_bytes(model_proto.SerializeToString())
    with caplog.at_level(logging.WARNING, logger="edged.model.metadata"):
        model = ModelRepository(detectors).resolve("det_end2end")
    assert {"names", "imgsz", "end2end"} <= {r.args[1] for r in caplog.records}
    assert model.head is not None and model.head.format == "end2end"  # [300, 6] by its shape
    results, _geometry = serve(model, lit_frame())
    [found] = results["detections"]
    assert found["label"] == "1" and found["box"] == pytest.approx(SQUARE, abs=3)


def test_model_config_api_shows_the_head_labels_and_why(detectors: Path) -> None:
    model = ModelRepository(detectors).resolve("det_detr")
    described = model_config(model)["edged"]
    assert described["head"]["format"] == "detr"
    assert "RT-DETR" in described["head"]["reason"]
    assert described["postprocess"]["names"] == list(test_models.DETECT_NAMES)
    assert described["preprocess"]["pad_value"] == 114.0
    assert "Ultralytics export" in described["reasons"]["preprocess"]
    assert PreprocessConfig(**described["preprocess"]).keep_ratio  # what `edged infer` rebuilds


def test_model_yaml_labels_file_names_the_classes_but_does_not_count_them(
        detectors: Path) -> None:
    (detectors / "det_yolov8" / "labels.txt").write_text("background\nwalker\ncyclist\ncar\n")
    write_yaml(detectors, "det_yolov8", "postprocess: {kind: detect, labels: labels.txt}\n")
    model = ModelRepository(detectors).resolve("det_yolov8")  # 4 lines, 3 classes: still v8
    assert model.head is not None and model.head.format == "yolov8"
    assert model_config(model)["edged"]["postprocess"]["names"] == [
        "background", "walker", "cyclist", "car"]  # the list the API (and edged infer) shows
    results, _geometry = serve(model, lit_frame())
    assert [d["label"] for d in results["detections"]] == ["walker"]
