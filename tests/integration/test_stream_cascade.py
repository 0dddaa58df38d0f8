"""A cascade end to end: a real video OpenCV writes (a red and a green square on black), the
grid detector as the stream's model, the colors classifier as its secondary model on crops of
green detections only; the daemon in-process publishes to a real mosquitto, and a subscriber
reads sub_label on the chosen detections and nowhere else, in the published schema."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import jsonschema
import numpy as np
import pytest
from support.broker import Broker, Subscriber
from support.daemon import ServeFactory

from tools.assets import models as test_models

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "schemas" /
                     "stream-result.schema.json").read_text())
# grid_det cuts its 64x64 input into 16-pixel cells: a 256x256 frame has 64-pixel cells.
RED_CELL, GREEN_CELL = (64, 0, 128, 64), (192, 128, 256, 192)


def write_squares_video(path: Path, frames: int = 30) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (256, 256))
    assert writer.isOpened(), f"OpenCV cannot write {path}"
    frame = np.zeros((256, 256, 3), np.uint8)
    for (x1, y1, x2, y2), bgr in ((RED_CELL, (0, 0, 255)), (GREEN_CELL, (0, 255, 0))):
        frame[y1:y2, x1:x2] = bgr
    try:
        for _ in range(frames):
            writer.write(frame)
    finally:
        writer.release()
    return path


def test_stream_with_a_secondary_model_publishes_sub_labels_for_the_chosen_labels_only(
        broker: Broker, make_served: ServeFactory, repo_dir: Path, tmp_path: Path) -> None:
    test_models.write_repository(repo_dir, names=["grid_det"])
    video = write_squares_video(tmp_path / "squares.avi")
    topic = "t/cascade/streams/door/results"
    sub = Subscriber(broker, topic)
    try:
        make_served(
            cache="preload: [grid_det, colors]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/cascade, qos_results: 1",
            streams=f"[{{name: door, source: 'file://{video}', model: grid_det, "
                    "backpressure: block, publish: {frames: true}, "
                    "secondary: [{model: colors, labels: [green], "
                    "as: sub_label, crop_margin: 0.0}]}]")
        messages = sub.collect(topic, until=lambda got: len(got) >= 10, timeout=30,
                               what="10 results")
    finally:
        sub.close()
    for message in (json.loads(m.payload) for m in messages):
        jsonschema.validate(message, SCHEMA)
        found = {d["label"]: d for d in message["results"]["detections"]}
        assert set(found) == {"red", "green"}
        assert found["green"]["box"] == list(map(float, GREEN_CELL))
        assert found["green"]["sub_label"] == "green"
        assert found["green"]["sub_label_score"] > 0.9
        assert found["red"]["box"] == list(map(float, RED_CELL))
        assert "sub_label" not in found["red"]  # not one of the cascade's labels


def test_stream_whose_secondary_model_cannot_take_crops_is_not_started_and_says_why(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    test_models.write_repository(repo_dir, names=["grid_det"])
    video = write_squares_video(tmp_path / "squares.avi", frames=3)
    served = make_served(
        cache="preload: [grid_det]",
        streams=f"[{{name: door, source: 'file://{video}', model: grid_det, "
                "secondary: [{model: tiny_cnn, as: attributes}]}, "
                f"{{name: yard, source: 'file://{video}', model: colors, "
                "secondary: [{model: colors}]}]")
    assert served.daemon.pipelines == ()
    assert "stream door is not started: secondary model tiny_cnn:1 has a dynamic input size" \
        in caplog.text
    assert "stream yard is not started: stream yard: secondary models crop detections, but " \
        "colors:1 is a classify model" in caplog.text
