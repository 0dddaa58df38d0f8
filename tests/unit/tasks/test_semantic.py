"""Semantic segmentation as a task, on an exporter-faithful DeepLab-style export (logits [1, C,
H/4, W/4], class names in its labels file): recognised with no postprocess in model.yaml,
each class present with its share of the frame and its regions as polygons in frame pixels
through the letterbox, the background left out; drawn and summed up in the live view."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from support import ultralytics_masks as ref

from edged.api.describe import model_config
from edged.model.repository import ModelRepository, ModelVersion
from edged.processing.post import Postprocessor
from edged.processing.pre import Geometry, preprocess
from edged.streams.live import Seen, answer_of, masks_of
from edged.tasks.semantic import class_ids, segments
from tools.assets import tasks as task_models

FRAME = (160, 120)  # letterboxed into 64 x 64: 8 px bars above and below


@pytest.fixture
def semantic(tmp_path: Path) -> ModelVersion:
    root = task_models.write_task_models(tmp_path / "models", ["semantic"])
    return ModelRepository(root).resolve("semantic")


def scene() -> np.ndarray:
    frame = np.zeros((FRAME[1], FRAME[0], 3), np.uint8)
    frame[20:80, 20:80] = (0, 255, 0)  # BGR green: a 60 x 60 square
    cv2.circle(frame, (120, 70), 25, (0, 0, 255), -1)  # red
    return frame


def test_class_map_when_read_without_postprocess_is_a_semantic_task(
        semantic: ModelVersion) -> None:
    task = model_config(semantic)["edged"]["task"]
    assert task == {"kind": "semantic", "reason": "kind semantic: logits [1, 3, 16, 16] is a "
                    "class map [N, C, H, W] with the labels file's 3 lines"}


def test_class_map_when_decoded_gives_each_class_its_share_and_regions_in_frame_pixels(
        semantic: ModelVersion) -> None:
    frame = scene()
    session = ort.InferenceSession(str(semantic.onnx_path), providers=["CPUExecutionProvider"])
    assert semantic.config.preprocess is not None
    tensor, geometry = preprocess(frame, semantic.config.preprocess, semantic.inputs[0])
    [logits] = session.run(None, {"x": tensor})
    post = Postprocessor(semantic.config.postprocess, semantic.dir.parent, semantic.head)
    results = post({"logits": logits}, geometry)
    found = {s["label"]: s for s in results["segments"]}
    assert set(found) == {"green", "red"}  # the background is left out
    green, red = found["green"], found["red"]
    assert green["area"] == pytest.approx(3600 / (160 * 120), abs=0.03)
    assert red["area"] == pytest.approx(np.pi * 25 ** 2 / (160 * 120), abs=0.03)
    assert [s["label"] for s in results["segments"]] == ["green", "red"]  # biggest first
    for label, colour in (("green", 1), ("red", 2)):
        [polygon] = found[label]["polygons"]
        drawn = ref.raster(np.array(polygon), FRAME)
        truth = frame[:, :, colour] > 127
        assert ref.iou(drawn, truth) > 0.75, label  # 2.5 frame px a map cell
    seen = Seen(1, 0.0, frame, results, None)
    assert [label for label, _ in masks_of(seen)] == ["green", "red"]
    assert answer_of(results) == f"green {green['area']:.0%}, red {red['area']:.0%}"


def test_class_map_when_letterboxed_counts_only_the_frame_not_the_bars() -> None:
    ids = np.zeros((16, 16), np.int32)
    ids[:2] = 1  # the bars above: 2 of 16 rows (8 px of 64)
    geometry = Geometry(0.4, 0.4, 0, 8, (160, 120), (64, 64))
    assert segments(ids, ["background", "bar"], geometry, 64) == []
    ids[2:8] = 1  # the frame's upper half (its 12 rows are 2..13)
    [half] = segments(ids, ["background", "bar"], geometry, 64)
    assert half["area"] == pytest.approx(0.5, abs=0.01)


def test_class_ids_when_given_ids_or_one_probability_reads_them() -> None:
    assert class_ids(np.array([[[0, 2], [1, 1]]])).tolist() == [[0, 2], [1, 1]]
    assert class_ids(np.array([[[[0.2, 0.7]]]], np.float32)).tolist() == [[0, 1]]
