"""Post-processing: top-k with labels, YOLO and SSD heads through threshold and per-class NMS
with boxes mapped back through the letterbox, raw summaries, and bad heads named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edged.core.errors import InvalidModel
from edged.model.config import PostprocessConfig
from edged.processing.boxes import nms
from edged.processing.post import Postprocessor, classify, detect, raw
from edged.processing.pre import Geometry

LABELS = ["cat", "dog", "car"]


def test_classify_returns_top_k_best_first_with_labels() -> None:
    got = classify(np.array([[0.1, 0.7, 0.2]], np.float32), 2, LABELS)
    assert [(c["label"], c["index"]) for c in got] == [("dog", 1), ("car", 2)]
    assert classify(np.array([0.2, 0.9]), 5, [])[0] == {"index": 1, "label": "1",
                                                        "score": pytest.approx(0.9)}


def test_detect_yolo_when_boxes_overlap_keeps_the_best_per_class_in_frame_pixels() -> None:
    # 640x480 frame letterboxed into 640x640: scale 1, 80 px of padding above.
    geometry = Geometry(1.0, 1.0, 0, 80, (640, 480))
    rows = np.array([  # cx, cy, w, h, score cat, score dog
        [100, 180, 40, 40, 0.9, 0.0],
        [102, 182, 40, 40, 0.8, 0.0],   # same cat: suppressed
        [104, 184, 40, 40, 0.0, 0.85],  # overlaps, but a dog: kept
        [500, 500, 20, 20, 0.1, 0.0],   # under the threshold
    ] + [[0, 0, 1, 1, 0, 0]] * 4, np.float32)  # more candidates than columns, as real heads
    cfg = PostprocessConfig(kind="detect", format="yolo", score_threshold=0.25)
    for table in (rows[None], rows.T[None]):  # [1, N, 6] and YOLOv8's [1, 6, N]
        found = detect({"out": table}, cfg, geometry, LABELS).rows()
        assert [(d["label"], d["score"]) for d in found] == [("cat", 0.9), ("dog", 0.85)]
        assert found[0]["box"] == [80.0, 80.0, 120.0, 120.0]  # padding undone


def test_detect_ssd_with_normalised_yxyx_boxes_and_class_vector() -> None:
    geometry = Geometry(0.5, 0.5, 0, 0, (200, 100))  # frame 200x100 → tensor 100x50
    outputs = {"boxes": np.array([[[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]]], np.float32),
               "scores": np.array([[0.9, 0.2]], np.float32),
               "classes": np.array([[2, 1]], np.float32)}
    cfg = PostprocessConfig(kind="detect", format="ssd", box="yxyx", normalized=True)
    found = detect(outputs, cfg, geometry, LABELS).rows()
    assert found == [{"class": 2, "label": "car", "score": 0.9, "box": [0.0, 0.0, 100.0, 50.0]}]


@pytest.mark.parametrize(("fmt", "outputs", "message"), [
    ("yolo", {"o": np.zeros((1, 3, 3), np.float32)}, "expected"),
    ("ssd", {"s": np.zeros((1, 5), np.float32)}, "no \\[N, 4\\] boxes"),
    ("ssd", {"b": np.zeros((1, 5, 4), np.float32), "s": np.zeros((1, 3))}, "expected scores"),
])
def test_detect_when_the_head_is_not_what_the_format_says_names_it(
        fmt: str, outputs: dict[str, np.ndarray], message: str) -> None:
    cfg = PostprocessConfig(kind="detect", format=fmt)  # type: ignore[arg-type]
    with pytest.raises(InvalidModel, match=message):
        detect(outputs, cfg, None, [])


def test_detect_yolo_when_transposed_is_said_does_not_guess() -> None:
    rows = np.array([[100, 100, 40, 40, 0.9, 0.0]], np.float32)  # one row: a guess would err
    cfg = PostprocessConfig(kind="detect", transposed=False)
    assert detect({"out": rows[None]}, cfg, None, LABELS).rows()[0]["box"] == [80, 80, 120, 120]


def test_nms_only_suppresses_within_a_class() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10]], np.float32)
    assert nms(boxes, np.array([0.9, 0.8, 0.7]), np.array([0, 0, 1]), 0.5) == [0, 2]


def test_raw_gives_small_tensors_in_full_and_summarises_large_ones() -> None:
    out = raw({"small": np.arange(4, dtype=np.float32), "map": np.ones((1, 64, 64))}, 16)
    assert out["small"]["data"] == [0, 1, 2, 3]
    assert out["map"] == {"shape": [1, 64, 64], "dtype": "float64", "min": 1.0, "max": 1.0,
                          "mean": 1.0}


def test_postprocessor_reads_labels_beside_the_model_and_refuses_a_missing_file(
        tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n\n")
    post = Postprocessor(PostprocessConfig(kind="classify", labels="labels.txt"), tmp_path)
    assert post({"p": np.array([[0.2, 0.8]])}, None) == {
        "classes": [{"index": 1, "label": "dog", "score": pytest.approx(0.8)}]}
    with pytest.raises(InvalidModel, match="labels file"):
        Postprocessor(PostprocessConfig(kind="classify", labels="nope.txt"), tmp_path)
