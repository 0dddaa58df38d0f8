"""Tasks beyond boxes end to end: the daemon in-process serves an exporter-faithful YOLO-seg
export and a YOLO-pose export with no model.yaml; a stream plays a real video OpenCV wrote (a
lit ellipse, then a lit square) and publishes to a real mosquitto each frame's detections with
their mask polygon or keypoints in frame pixels, and the tracked object's events with its
latest mask (as COCO RLE too, with `masks: rle`), all in the published schemas, and
latest.jpg draws it; `edged infer --json` on an image prints the same results, and draws the
mask on the image."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
from support import ultralytics_masks as ref
from support.broker import Broker, Received, Subscriber
from support.daemon import Served, ServeFactory
from support.demo import get, get_json, image

from edged.cli import main
from edged.tasks import rle
from tools.assets import tasks as task_models

SCHEMAS = Path(__file__).parents[2] / "docs" / "schemas"
EVENT, RESULT = (json.loads((SCHEMAS / name).read_text()) for name in (
    "events.schema.json", "stream-result.schema.json"))
FRAMES = 8
SIZE = (160, 120)


def lit_frame(shape: str) -> np.ndarray:
    frame = np.zeros((SIZE[1], SIZE[0], 3), np.uint8)
    if shape == "ellipse":
        cv2.ellipse(frame, (70, 60), (40, 28), 20, 0, 360, (0, 255, 0), -1)
    else:
        frame[30:90, 40:100] = (0, 255, 0)
    return frame


def write_video(path: Path, shape: str) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, SIZE)
    assert writer.isOpened()
    try:
        for _ in range(FRAMES):
            writer.write(lit_frame(shape))
    finally:
        writer.release()
    return path


def stream(video: Path, model: str, extra: str = "") -> str:
    return (f"[{{name: cam, source: 'file://{video}', model: {model}, backpressure: block, "
            f"publish: {{frames: true}}, track: {{min_hits: 2}}{extra}}}]")


# The ellipse's upper two thirds: its box's bottom centre is outside, most of its mask inside
ZONES = (", zones: [{name: upper, polygon: [[20, 10], [130, 10], [130, 70], [20, 70]], "
         "anchor: mask}, {name: upper_by_point, polygon: [[20, 10], [130, 10], [130, 70], "
         "[20, 70]]}]")


def messages(got: list[Received], topic: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == topic]


def ended(prefix: str) -> Any:
    def done(got: list[Received]) -> bool:
        return any(e["type"] == "end" for e in messages(got, f"{prefix}/events"))
    return done


def served_stream(broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path,
                  model: str, shape: str, prefix: str,
                  collect: Callable[[Subscriber], list[Received]],
                  extra: str = "") -> tuple[Served, list[Received]]:
    """A daemon streaming a video of a lit `shape` through `model`, publishing under `prefix`
    on the test's broker; what `collect` took from a subscriber to everything under it."""
    task_models.write_task_models(repo_dir, [model])
    video = write_video(tmp_path / f"{shape}.avi", shape)
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache=f"preload: [{model}]", streams=stream(video, model, extra),
                             mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        return served, collect(sub)
    finally:
        sub.close()


def test_segment_stream_when_an_object_is_lit_publishes_its_mask_in_results_and_events(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    prefix = "t/seg"
    served, got = served_stream(
        broker, make_served, repo_dir, tmp_path, "seg_yolo", "ellipse", prefix,
        lambda sub: sub.collect(until=ended(prefix), timeout=60, what="the object's end"),
        ZONES)
    # the live view draws the mask: the ellipse tinted, the corner far from it as it was
    status, _, body = get(served.http, "/v2/edged/streams/cam/latest.jpg")
    status_raw, _, body_raw = get(served.http, "/v2/edged/streams/cam/latest.jpg?raw=1")
    assert (status, status_raw) == (200, 200)
    drawn, raw = image(body).astype(int), image(body_raw).astype(int)
    assert np.abs(drawn[60, 70] - raw[60, 70]).max() > 40  # inside the mask, away from text
    assert np.abs(drawn[110, 150] - raw[110, 150]).max() < 12  # outside everything drawn
    results = messages(got, f"{prefix}/streams/cam/results")
    assert len(results) == FRAMES
    lit = lit_frame("ellipse").max(axis=2) > 127
    for message in results:
        jsonschema.validate(message, RESULT)
        [found] = message["results"]["detections"]
        assert found["label"] == "bicycle"
        assert 4 <= len(found["mask"]) <= 64
        assert ref.iou(ref.raster(np.array(found["mask"]), SIZE), lit) > 0.8  # JPEG'd edges
    events = messages(got, f"{prefix}/events")
    for event in events:
        jsonschema.validate(event, EVENT)
    assert events[0]["type"] == "new" and events[-1]["type"] == "end"
    assert all(len(e["after"]["mask"]) >= 4 for e in events)
    assert events[-1]["after"]["entered_zones"] == ["upper"]  # by its mask, not its box


def test_pose_stream_when_a_person_is_lit_publishes_named_keypoints_in_frame_pixels(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    prefix = "t/pose"
    _, got = served_stream(
        broker, make_served, repo_dir, tmp_path, "pose_yolo", "square", prefix,
        lambda sub: sub.collect(until=ended(prefix), timeout=60, what="the person's end"))
    results = messages(got, f"{prefix}/streams/cam/results")
    assert results
    for message in results:
        jsonschema.validate(message, RESULT)
        [found] = message["results"]["detections"]
        points = found["keypoints"]
        assert len(points) == 17
        # the left shoulder sits at 0.2 of the box's width, 0.3 of its height, seen 0.95
        x1, y1, x2, y2 = found["box"]
        x, y, score = points["left_shoulder"]
        assert x == pytest.approx(x1 + 0.2 * (x2 - x1), abs=0.2)
        assert y == pytest.approx(y1 + 0.3 * (y2 - y1), abs=0.2)
        assert score == pytest.approx(0.95, abs=1e-3)
    for event in messages(got, f"{prefix}/events"):
        jsonschema.validate(event, EVENT)
        assert set(event["after"]["keypoints"]) == set(points)


def test_semantic_stream_when_regions_are_lit_publishes_each_class_share_and_polygons(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    prefix = "t/sem"
    _, got = served_stream(
        broker, make_served, repo_dir, tmp_path, "semantic", "square", prefix,
        lambda sub: sub.collect(f"{prefix}/streams/cam/results",
                                until=lambda got: len(got) >= FRAMES, timeout=60,
                                what="each frame's segments"))
    lit = lit_frame("square").max(axis=2) > 127
    for message in messages(got, f"{prefix}/streams/cam/results"):
        jsonschema.validate(message, RESULT)
        [green] = message["results"]["segments"]
        assert green["label"] == "green"
        assert green["area"] == pytest.approx(lit.mean(), abs=0.03)
        assert ref.iou(ref.raster(np.array(green["polygons"][0]), SIZE), lit) > 0.85


def test_infer_cli_when_given_an_image_prints_the_masks_as_a_stream_publishes_them(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    task_models.write_task_models(repo_dir, ["seg_yolo"])
    image = tmp_path / "ellipse.png"
    cv2.imwrite(str(image), lit_frame("ellipse"))
    served = make_served(cache="preload: [seg_yolo]")
    drawn = tmp_path / "drawn.png"
    assert main(["infer", "seg_yolo", "-i", str(image), "--json",
                 "--socket", str(served.socket)]) == 0
    answer = json.loads(capsys.readouterr().out)
    [found] = answer["results"]["detections"]
    lit = lit_frame("ellipse").max(axis=2) > 127
    assert ref.iou(ref.raster(np.array(found["mask"]), SIZE), lit) > 0.8
    assert set(answer["outputs"]) == {"output0", "output1"}
    assert main(["infer", "seg_yolo", "-i", str(image), "--output", str(drawn),
                 "--socket", str(served.socket)]) == 0
    out = capsys.readouterr().out
    assert "bicycle" in out and "mask of" in out
    picture = cv2.imread(str(drawn))
    inside = picture[60, 70].astype(int)  # the ellipse's centre: green tinted by the mask
    assert inside[1] < 255 and inside[0] > 0, inside
    assert tuple(picture[5, 150]) == (0, 0, 0)  # outside: untouched


def test_infer_cli_when_a_text_recogniser_reads_a_line_prints_the_text(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    from tools.bench.assets import PPOCR_REC, ppocr_model

    (repo_dir / "rec" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_REC), repo_dir / "rec" / "1" / "model.onnx")
    (repo_dir / "rec" / "model.yaml").write_text(
        "preprocess: {resize: [320, 48], keep_ratio: true, pad: end, pad_value: 127.5, "
        "color: bgr, mean: [0.5], std: [0.5], interpolation: linear, rounding: ceil}\n")
    line = np.full((48, 200, 3), 255, np.uint8)
    cv2.putText(line, "edged 2026", (4, 36), cv2.FONT_HERSHEY_SIMPLEX, 1.2, (0, 0, 0), 2,
                cv2.LINE_AA)
    image = tmp_path / "line.png"
    cv2.imwrite(str(image), line)
    served = make_served(cache="preload: [rec]")
    assert main(["infer", "rec", "-i", str(image), "--json", "--socket",
                 str(served.socket)]) == 0
    read = json.loads(capsys.readouterr().out)["results"]["text"]
    assert read["text"].strip() == "edged 2026" and 0.5 < read["score"] <= 1
    assert main(["infer", "rec", "-i", str(image), "--socket", str(served.socket)]) == 0
    assert "'edged 2026" in capsys.readouterr().out


def walking_body(x: int) -> np.ndarray:
    """A lit body at x: a 40 x 50 block (y 10..60) on a 16-wide leg down to y 110."""
    frame = np.zeros((SIZE[1], SIZE[0], 3), np.uint8)
    frame[10:60, x:x + 40] = (0, 255, 0)
    frame[60:110, x + 12:x + 28] = (0, 255, 0)
    return frame


# A short gate at x 80 down to y 70: the body's centre of mass passes it, its box's bottom
# centre (y 110) passes below its end. The same gate followed by the box's bottom centre.
GATES = (", lines: [{name: gate_mask, points: [[80, 70], [80, 0]], anchor: mask}, "
         "{name: gate_box, points: [[80, 70], [80, 0]]}]")


def test_segment_stream_when_a_line_follows_the_mask_counts_the_body_the_box_would_miss(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    task_models.write_task_models(repo_dir, ["seg_yolo"])
    video = tmp_path / "walk.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, SIZE)
    assert writer.isOpened()
    for x in range(10, 115, 7):
        writer.write(walking_body(x))
    writer.release()
    prefix = "t/segline"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        make_served(cache="preload: [seg_yolo]", streams=stream(video, "seg_yolo", GATES),
                    mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        got = sub.collect(until=ended(prefix), timeout=60, what="the body's end")
    finally:
        sub.close()
    counts = {m.topic.rsplit("/", 1)[1]: json.loads(m.payload) for m in got
              if m.topic.startswith(f"{prefix}/streams/cam/lines/")}  # the last of each
    assert counts["gate_mask"] == {"bicycle": {"in": 1, "out": 0}}, counts
    assert counts["gate_box"].get("bicycle", {"in": 0, "out": 0}) == {"in": 0, "out": 0}
    [end] = [e for e in messages(got, f"{prefix}/events") if e["type"] == "end"]
    assert len(end["after"]["mask"]) >= 4


def test_segment_stream_when_masks_rle_publishes_its_objects_masks_as_rle_in_events_too(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    """`masks: rle` reaches the events: each event's mask (and its `before`'s) is COCO RLE at
    frame size of the lit shape, in the events schema; the events listing shows it so; the
    zone anchored on the mask still tests the polygon."""
    prefix = "t/segrle"
    served, got = served_stream(
        broker, make_served, repo_dir, tmp_path, "seg_yolo", "ellipse", prefix,
        lambda sub: sub.collect(until=ended(prefix), timeout=60, what="the object's end"),
        ZONES + ", masks: rle")
    lit = lit_frame("ellipse").max(axis=2) > 127
    events = messages(got, f"{prefix}/events")
    assert events[0]["type"] == "new" and events[-1]["type"] == "end"
    for event in events:
        jsonschema.validate(event, EVENT)
        for side in ("before", "after"):
            if event[side] is None:
                continue
            mask = event[side]["mask"]
            assert mask["size"] == [SIZE[1], SIZE[0]]
            bitmap = rle.decode(mask)
            assert (bitmap & lit).sum() / (bitmap | lit).sum() > 0.8  # (JPEG'd edges)
    assert events[-1]["after"]["entered_zones"] == ["upper"]  # by its mask, not its box
    by_capture = {}
    for message in messages(got, f"{prefix}/streams/cam/results"):
        jsonschema.validate(message, RESULT)
        by_capture[message["capture_ts"]] = message["results"]["detections"][0]["mask"]
    for event in events:  # the frame's results and its event: one RLE of one polygon
        assert event["after"]["mask"] == by_capture[round(event["after"]["frame_time"], 6)]
    listed = get_json(served.http, "/v2/edged/events?stream=cam")["events"]
    assert listed and listed[0]["object"]["mask"] == events[-1]["after"]["mask"]
