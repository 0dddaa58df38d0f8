"""Detection heads: the ONNX metadata read safely, each stock head told from its shapes and
metadata (and refused, with the keys that settle it, when it cannot be), and each decoded into
the boxes, scores and classes it holds."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from edged.core.errors import InvalidModel
from edged.model.config import PostprocessConfig
from edged.model.heads import Head, choose_head
from edged.model.metadata import ExportMetadata, read_metadata
from edged.model.tensor import TensorSpec
from edged.processing.boxes import nms
from edged.processing.decode import decode
from edged.processing.post import detect

COCO = str({i: f"class{i}" for i in range(80)})
DETECT = PostprocessConfig(kind="detect")


def spec(name: str, *dims: int) -> TensorSpec:
    return TensorSpec(name, np.dtype(np.float32), (-1, *dims))


def ultralytics(**extra: str) -> ExportMetadata:
    props = {"author": "Ultralytics", "task": "detect", "stride": "32", "names": COCO,
             "imgsz": "[640, 640]", **extra}
    return read_metadata(props, "model.onnx")


# -- metadata ------------------------------------------------------------------------------------

def test_metadata_when_ultralytics_wrote_it_reads_names_size_task_and_end2end() -> None:
    meta = read_metadata({"author": "Ultralytics", "names": "{0: 'person', 1: 'bicycle'}",
                          "imgsz": "[480, 640]", "stride": "32", "task": "detect",
                          "end2end": "True", "batch": "1"}, "m.onnx")
    assert meta.names == ("person", "bicycle")
    assert meta.imgsz == (480, 640) and meta.stride == 32
    assert meta.task == "detect" and meta.end2end is True and meta.ultralytics
    assert read_metadata({"stride": "32", "names": "['a', 'b']"}, "m.onnx").ultralytics  # v5
    assert not read_metadata({"names": "['a']"}, "m.onnx").ultralytics


def test_metadata_when_a_name_index_is_missing_names_the_class_by_its_index() -> None:
    assert read_metadata({"names": "{0: 'a', 2: 'c'}"}, "m.onnx").names == ("a", "1", "c")


@pytest.mark.parametrize(("key", "value"), [
    ("names", "{0: 'person', 1: "),                     # cut short
    ("names", "__import__('os').system('touch /tmp/x')"),  # code, not a literal
    ("names", "{0: 1}"),                                # not strings
    ("names", "{-1: 'x'}"),
    ("imgsz", "[640, 'x']"),
    ("imgsz", "[0, 640]"),
    ("stride", "True"),
    ("task", "paint"),
    ("end2end", "'yes'"),
])
def test_metadata_when_a_value_is_malformed_treats_it_as_absent_with_a_warning(
        key: str, value: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="edged.model.metadata"):
        meta = read_metadata({"author": "Ultralytics", key: value}, "bad.onnx")
    assert getattr(meta, key) is None
    assert [r.getMessage() for r in caplog.records] and \
        f"bad.onnx: ignoring metadata {key!r}" in caplog.records[0].getMessage()
    assert len(caplog.records) == 1  # one warning per bad value


# -- choosing ------------------------------------------------------------------------------------

@pytest.mark.parametrize(("outputs", "metadata", "size", "expected"), [
    ([spec("output0", 84, 8400)], ultralytics(), (640, 640), ("yolov8", True, "8400 anchors")),
    ([spec("output0", 84, -1)], None, None, ("yolov8", True, "more rows than columns")),
    ([spec("output0", 8400, 84)], read_metadata({"names": COCO}, "m"), (640, 640),
     ("yolov8", False, "8400 anchors")),
    ([spec("output0", 25200, 85)], None, (640, 640), ("yolov5", False, "three per cell")),
    ([spec("output0", 25200, 85)], read_metadata({"stride": "32", "names": COCO}, "m"), None,
     ("yolov5", False, "85 = 5 + 80 classes (names)")),
    ([spec("output0", 300, 6)], ultralytics(end2end="True"), None, ("end2end", False,
                                                                     "metadata end2end")),
    ([spec("output0", 300, 6)], None, (640, 640), ("end2end", False, "2-class DETR")),
    ([spec("output0", 300, 84)], ultralytics(description="Ultralytics rtdetr-l model"), None,
     ("detr", False, "RT-DETR")),
    ([spec("output0", 300, 84)], None, (640, 640), ("detr", False, "300 queries")),
])
def test_choose_head_when_the_layout_is_a_stock_one_names_it_and_why(
        outputs: list[TensorSpec], metadata: ExportMetadata | None,
        size: tuple[int, int] | None, expected: tuple[str, bool, str]) -> None:
    head = choose_head(outputs, metadata, DETECT, said=(), input_size=size, batched=True)
    assert (head.format, head.transposed) == expected[:2]
    assert expected[2] in head.reason and head.table == "output0"
    assert head.nms == (head.format in ("yolov5", "yolov8"))


def test_choose_head_when_boxes_sit_beside_scores_tells_ssd_from_detr() -> None:
    ssd = choose_head([spec("boxes", 8732, 4), spec("scores", 8732, 81)],
                      read_metadata({"names": COCO}, "m"), DETECT, said=(), batched=True)
    assert (ssd.format, ssd.background, ssd.nms) == ("ssd", True, True)
    assert "81 columns for 80 names" in ssd.reason
    vectors = choose_head([spec("detection_boxes", 100, 4), spec("detection_classes", 100),
                           spec("detection_scores", 100), spec("num_detections")], None,
                          DETECT, said=(), batched=True)
    assert (vectors.scores, vectors.classes, vectors.count) == (
        "detection_scores", "detection_classes", "num_detections")
    assert (vectors.box, vectors.normalized, vectors.nms) == ("yxyx", True, False)
    detr = choose_head([spec("pred_logits", 100, 92), spec("pred_boxes", 100, 4)], None,
                       DETECT, said=(), batched=True)
    assert (detr.format, detr.activation, detr.box, detr.normalized, detr.nms) == (
        "detr", "sigmoid", "cxcywh", True, False)
    sigmoid_boxes = choose_head([spec("b", 300, 4), spec("s", 300, 80)], None, DETECT,
                                said=(), producers={"b": "Sigmoid"}, batched=True)
    assert sigmoid_boxes.format == "detr" and "Sigmoid" in sigmoid_boxes.reason


def test_choose_head_when_the_table_fits_two_layouts_refuses_naming_shapes_and_keys() -> None:
    with pytest.raises(InvalidModel) as caught:
        choose_head([spec("output0", 84, 84)], ultralytics(imgsz="[64, 64]"), DETECT, said=(),
                    input_size=(64, 64), batched=True)
    message = str(caught.value)
    assert "output0 [-1, 84, 84] fits more than one head" in message
    assert "set postprocess.format: yolov8 with transposed: true" in message
    for transposed in (True, False):  # model.yaml's `transposed:` settles it
        cfg = PostprocessConfig(kind="detect", transposed=transposed)
        head = choose_head([spec("output0", 84, 84)], ultralytics(), cfg,
                           said=("kind", "transposed"), input_size=(64, 64), batched=True)
        assert (head.format, head.transposed) == ("yolov8", transposed)


def test_choose_head_when_v5_and_v8_both_fit_says_what_is_missing() -> None:
    with pytest.raises(InvalidModel) as caught:
        choose_head([spec("output0", 25200, 85)], None, DETECT, said=(), batched=True)
    message = str(caught.value)
    assert "postprocess.format: yolov8 or yolov5 (yolov5 with objectness: true)" in message
    assert "no class count" in message and "no anchor grid" in message
    told = choose_head([spec("output0", 25200, 85)], None,
                       PostprocessConfig(kind="detect", objectness=True), batched=True)
    assert told.format == "yolov5" and told.objectness


@pytest.mark.parametrize("outputs", [[spec("prob", 4)], [spec("map", 1, 64, 64)],
                                     [spec("output0", 3, 3)]])
def test_choose_head_when_no_layout_fits_refuses_suggesting_only_kind_raw(
        outputs: list[TensorSpec]) -> None:
    with pytest.raises(InvalidModel) as caught:
        choose_head(outputs, None, DETECT, said=(), batched=True)
    assert f"{outputs[0].name} {list(outputs[0].shape)}" in str(caught.value)
    assert "none of the heads edged reads" in str(caught.value)
    assert "serve it with postprocess.kind: raw" in str(caught.value)  # the one key that works


def test_choose_head_when_metadata_says_end2end_and_model_yaml_a_format_yaml_wins() -> None:
    with pytest.raises(InvalidModel, match="fits no detection head"):  # end2end ≠ yolov8
        choose_head([spec("output0", 300, 6)], ultralytics(end2end="True"),
                    PostprocessConfig(kind="detect", format="yolov8"), batched=True)
    head = choose_head([spec("output0", 300, 6)], ultralytics(end2end="True"),
                       PostprocessConfig(kind="detect", format="yolo", transposed=False),
                       batched=True)
    assert head.format == "yolov8" and "postprocess.format: yolo" in head.reason


# -- decoding ------------------------------------------------------------------------------------

def test_detect_when_an_end2end_row_comes_reads_its_class_and_score() -> None:
    # The row edged used to read as a YOLOv8 candidate: class 1 with score 5.0.
    rows = np.zeros((1, 300, 6), np.float32)
    rows[0, 0] = [10, 20, 50, 60, 0.9, 5]
    found = detect({"output0": rows}, DETECT, None, []).rows()
    assert found == [{"class": 5, "label": "5", "score": 0.9, "box": [10, 20, 50, 60]}]


def test_decode_yolov5_scores_are_objectness_times_class_and_the_threshold_cuts_first() -> None:
    rows = np.zeros((1, 252, 8), np.float32)
    rows[0, 0] = [20, 20, 10, 10, 0.5, 0.2, 0.9, 0.1]   # 0.45 for class 1
    rows[0, 1] = [40, 40, 10, 10, 0.2, 1.0, 0.0, 0.0]   # objectness under the threshold
    head = Head("yolov5", "test", table="output0", objectness=True)
    found = decode(head, {"output0": rows}, 0.25, 1000)
    assert found.classes.tolist() == [1]
    assert found.scores.tolist() == pytest.approx([0.45])
    assert found.boxes.tolist() == [[15, 15, 25, 25]]


def test_decode_when_more_candidates_than_top_k_keeps_the_best_in_index_order() -> None:
    table = np.zeros((1, 5, 10), np.float32)
    table[0, 4] = np.arange(10) / 10  # anchor i scores i/10
    head = Head("yolov8", "test", table="output0", transposed=True)
    found = decode(head, {"output0": table}, 0.0, 3)
    assert found.scores.tolist() == pytest.approx([0.7, 0.8, 0.9])


def test_decode_ssd_drops_the_background_column_and_counts_classes_after_it() -> None:
    boxes = np.array([[[0.1, 0.1, 0.5, 0.5], [0.2, 0.2, 0.6, 0.6]]], np.float32)
    scores = np.array([[[0.9, 0.05, 0.05], [0.1, 0.1, 0.8]]], np.float32)
    head = Head("ssd", "test", boxes="boxes", scores="scores", box="xyxy", normalized=None,
                background=True)
    found = decode(head, {"boxes": boxes, "scores": scores}, 0.25, 1000)
    assert found.classes.tolist() == [1] and found.normalized  # told by the range
    assert found.scores.tolist() == pytest.approx([0.8])


def test_decode_tf_style_ssd_reads_only_the_counted_rows() -> None:
    outputs = {"detection_boxes": np.array([[[0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]]], np.float32),
               "detection_scores": np.array([[0.9, 0.8]], np.float32),
               "detection_classes": np.array([[3, 7]], np.float32),
               "num_detections": np.array([1], np.float32)}
    head = choose_head([spec("detection_boxes", 2, 4), spec("detection_scores", 2),
                        spec("detection_classes", 2), spec("num_detections")], None, DETECT,
                       said=(), batched=True)
    found = decode(head, outputs, 0.25, 1000)
    assert found.classes.tolist() == [3]
    assert found.boxes[0].tolist() == pytest.approx([0.2, 0.1, 0.4, 0.3])  # yxyx → xyxy


def test_decode_detr_applies_a_sigmoid_only_to_logits() -> None:
    table = np.zeros((1, 300, 6), np.float32)
    table[0, :, 4:] = -6.0  # logits: far under 0 for the empty queries
    table[0, 0] = [0.5, 0.5, 0.2, 0.2, -6.0, 2.0]
    head = Head("detr", "test", table="output0", normalized=True, activation="auto", nms=False)
    found = decode(head, {"output0": table}, 0.25, 1000)
    assert found.classes.tolist() == [1]
    assert found.scores.tolist() == pytest.approx([1 / (1 + np.exp(-2.0))])
    assert found.boxes[0].tolist() == pytest.approx([0.4, 0.4, 0.6, 0.6])
    table[0, :, 4:] = 0.0
    table[0, 0, 4:] = [0.1, 0.7]  # probabilities already: left as they are
    assert decode(head, {"output0": table}, 0.25, 1000).scores.tolist() == pytest.approx([0.7])


def test_nms_when_candidates_cluster_keeps_what_the_greedy_reference_keeps() -> None:
    from tools.bench.post import numpy_nms

    rng = np.random.default_rng(3)
    centres = rng.uniform(50, 600, (30, 2))[rng.integers(0, 30, 600)] + rng.normal(0, 6, (600, 2))
    sizes = rng.uniform(20, 120, (600, 2))
    boxes = np.concatenate([centres - sizes / 2, centres + sizes / 2], axis=1).astype(np.float32)
    scores = rng.random(600).astype(np.float32)
    classes = rng.integers(0, 4, 600)
    kept = nms(boxes, scores, classes, 0.45)
    assert kept == numpy_nms(boxes, scores, classes, 0.45)
    assert 30 < len(kept) < 600  # suppression really happened, across several classes


def test_detect_when_a_box_falls_in_the_letterbox_bars_drops_it() -> None:
    from edged.processing.pre import Geometry

    rows = np.zeros((1, 300, 6), np.float32)
    rows[0, 0] = [10, 0, 50, 6, 0.9, 0]     # wholly in the top bar (8 px)
    rows[0, 1] = [10, 20, 50, 60, 0.8, 0]
    found = detect({"output0": rows}, DETECT, Geometry(0.4, 0.4, 0, 8, (160, 120)), []).rows()
    assert [d["score"] for d in found] == [0.8]


# -- families from other exporters -----------------------------------------------------------

def test_choose_head_when_rows_fit_yolox_and_yolov8_only_by_count_refuses_both() -> None:
    """[3549, 6] on a 416 input: YOLOX (1 class + objectness) or YOLOv8 rows (2 classes);
    without the graph or metadata to tell, neither is taken: no boxes read the wrong way."""
    with pytest.raises(InvalidModel) as caught:
        choose_head([spec("output", 3549, 6)], None, DETECT, said=("kind",),
                    input_size=(416, 416), batched=True)
    message = str(caught.value)
    assert "fits more than one head" in message and "yolox" in message
    assert "postprocess.format: yolov8 or yolox" in message
    head = choose_head([spec("output", 3549, 6)], None, DETECT, said=("kind",),
                       input_size=(416, 416), batched=True, marks={"yolox"})
    assert (head.format, head.grid, head.objectness) == ("yolox", (416, 416), True)
    assert "Conv + Sigmoid + Sigmoid" in head.reason


@pytest.mark.parametrize("rows", [3000, 3548, 10647])
def test_choose_head_when_the_row_count_is_not_the_inputs_grid_takes_no_yolo_head(
        rows: int) -> None:
    """The columns add up (5 + 1 classes), the rows are not one (or three) per cell of a
    416 input's stride 8/16/32 grid: refused, suggesting only kind: raw."""
    with pytest.raises(InvalidModel, match="none of the heads edged reads"):
        choose_head([spec("output", rows, 6)], None, DETECT, said=("kind",),
                    input_size=(416, 416), batched=True, marks={"yolox"})


def test_decode_yolox_places_raw_offsets_on_the_grid_of_their_stride() -> None:
    """Row 0 is cell (0, 0) of stride 8; row 52 * 52 is cell (0, 0) of stride 16; YOLOX's
    rule: xy = (offset + cell) * stride, wh = exp(log wh) * stride."""
    table = np.zeros((1, 3549, 6), np.float32)
    table[0, 1] = [0.5, 0.5, np.log(2.0), np.log(4.0), 0.9, 1.0]  # cell (1, 0), stride 8
    table[0, 2704 + 27] = [0.0, 0.0, 0.0, 0.0, 0.8, 1.0]  # cell (1, 1), stride 16
    head = Head("yolox", "test", table="output", objectness=True, grid=(416, 416))
    found = decode(head, {"output": table}, 0.25, 1000)
    np.testing.assert_allclose(found.boxes, [[4, -12, 20, 20], [8, 8, 24, 24]], atol=1e-5)
    assert found.scores.tolist() == pytest.approx([0.9, 0.8])


def test_choose_head_when_tf_od_api_outputs_have_unknown_dims_reads_them_by_name() -> None:
    """tf2onnx leaves every dim unknown: detection_boxes [?, ?, ?]. The four names say it:
    y1, x1, y2, x2 in 0..1, ids from 1, rows already suppressed. `format: ssd`, which the old
    error message suggested, now reads it the same way."""
    outputs = [TensorSpec("num_detections:0", np.dtype(np.float32), (-1,)),
               TensorSpec("detection_boxes:0", np.dtype(np.float32), (-1, -1, -1)),
               TensorSpec("detection_scores:0", np.dtype(np.float32), (-1, -1)),
               TensorSpec("detection_classes:0", np.dtype(np.float32), (-1, -1))]
    for cfg, said in ((DETECT, ()), (PostprocessConfig(kind="detect", format="ssd"),
                                     ("kind", "format"))):
        head = choose_head(outputs, None, cfg, said=said, batched=True)
        assert (head.box, head.normalized, head.nms, head.class_base) == ("yxyx", True,
                                                                          False, 1)
        assert head.count == "num_detections:0"


def test_detect_when_tf_classes_count_from_one_names_them_from_the_first_label() -> None:
    head = Head("ssd", "test", boxes="b", scores="s", classes="c", count="n", box="yxyx",
                normalized=True, nms=False, class_base=1)
    outputs = {"b": np.array([[[0.1, 0.1, 0.5, 0.5]]], np.float32),
               "s": np.array([[0.9]], np.float32), "c": np.array([[1.0]], np.float32),
               "n": np.array([1.0], np.float32)}
    [found] = detect(outputs, DETECT, None, ["person", "bicycle"], head).rows()
    assert (found["class"], found["label"]) == (1, "person")
    [found] = detect(outputs, DETECT, None, ["???", "person"], head).rows()  # id 0 has its own line
    assert (found["class"], found["label"]) == (1, "person")


def test_choose_head_when_boxes_sit_beside_scores_on_the_grid_reads_yolonas() -> None:
    head = choose_head([spec("boxes", 8400, 4), spec("scores", 8400, 80)], None, DETECT,
                       said=(), input_size=(640, 640), batched=True)
    assert (head.format, head.box, head.normalized, head.nms) == ("yolonas", "xyxy", False,
                                                                  True)
    rf = choose_head([spec("dets", 300, 4), spec("labels", 300, 91)], None, DETECT, said=(),
                     input_size=(560, 560), batched=True)
    assert (rf.format, rf.box, rf.normalized, rf.activation, rf.nms) == (
        "detr", "cxcywh", True, "sigmoid", False)
    dfine = choose_head([TensorSpec("labels", np.dtype(np.int64), (-1, 300)),
                         spec("boxes", 300, 4), spec("scores", 300)], None, DETECT, said=(),
                        input_size=(640, 640), batched=True)
    assert (dfine.format, dfine.classes, dfine.box, dfine.nms) == ("detr", "labels", "xyxy",
                                                                   False)
