"""Events end to end: a real video OpenCV writes (coloured squares crossing the frame one cell
a frame, one hidden for a frame on its way) through grid_det, a real detector; the daemon
in-process tracks them and publishes to a real mosquitto, where a subscriber reads each
object's life, the counts, the zone and line counts, the snapshots and Home Assistant's
discovery configs, all in the published schemas; the snapshots are also served over the
socket, and a reload that drops the stream removes its Home Assistant entities."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
from support.broker import Broker, Received, Subscriber
from support.daemon import ServeFactory
from support.polling import wait_until

from edged.config import DaemonConfig
from tools.assets import models as test_models
from tools.assets.demo import Pass, write_crossing_video

SCHEMAS = Path(__file__).parents[2] / "docs" / "schemas"
EVENT, COUNT, LINES, RESULT = (json.loads((SCHEMAS / name).read_text()) for name in (
    "events.schema.json", "object-count.schema.json", "line-counts.schema.json",
    "stream-result.schema.json"))
# Red crosses row 1 rightwards and is hidden on its third step (a frame, under max_age_s);
# then blue crosses row 2 leftwards. The zone is the right half, the line the middle, drawn
# upwards so that rightwards is "in".
PASSES = (Pass("red", 1, hidden=(2,)), Pass("blue", 2, leftwards=True))
FPS = 5.0
ZONE = "{name: right, polygon: [[128, 0], [256, 0], [256, 256], [128, 256]]}"
LINE = "{name: middle, points: [[128, 256], [128, 0]]}"


def door(video: Path, extra: str = "") -> str:
    return (f"{{name: door, source: 'file://{video}', model: grid_det, backpressure: block, "
            f"labels: [red, blue], zones: [{ZONE}], lines: [{LINE}]{extra}}}")


def mqtt(broker: Broker, prefix: str) -> str:
    return (f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, "
            f"discovery: {{prefix: {prefix}ha}}")


@pytest.fixture
def video(repo_dir: Path, tmp_path: Path) -> Path:
    test_models.write_repository(repo_dir, names=["grid_det"])
    return write_crossing_video(tmp_path / "crossing.avi", PASSES, fps=FPS, gap_frames=8)


def events_in(got: list[Received], prefix: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == f"{prefix}/events"]


def payloads(got: list[Received], topic: str) -> list[bytes]:
    return [m.payload for m in got if m.topic == topic]


def both_gone(prefix: str) -> Callable[[list[Received]], bool]:
    """Two objects ended and their counts came back to 0."""
    def done(got: list[Received]) -> bool:
        counts = [payloads(got, f"{prefix}/streams/door/{c}") for c in ("red", "blue")]
        ended = [e for e in events_in(got, prefix) if e["type"] == "end"]
        return len(ended) >= 2 and all(c and c[-1] == b"0" for c in counts)
    return done


def test_detect_stream_when_squares_cross_publishes_each_object_life_counts_lines_snapshots(
        broker: Broker, make_served: ServeFactory, video: Path) -> None:
    prefix = "t/ev1"
    sub = Subscriber(broker, f"{prefix}/#", f"{prefix}ha/#")
    try:
        served = make_served(cache="preload: [grid_det]", mqtt=mqtt(broker, prefix),
                             streams=f"[{door(video)}]", device_id="evtest")
        got = sub.collect(until=both_gone(prefix), timeout=60, what="two objects' lives")
    finally:
        sub.close()
    events = events_in(got, prefix)
    for event in events:
        jsonschema.validate(event, EVENT)
    by_label: dict[str, list[dict[str, Any]]] = {}
    for event in events:
        by_label.setdefault(event["after"]["label"], []).append(event)
    assert set(by_label) == {"red", "blue"}
    for label, lives in by_label.items():
        ids = {e["after"]["id"] for e in lives}
        assert len(ids) == 1, f"{label}: one object, kept through its hidden frame: {ids}"
        kinds = [e["type"] for e in lives]
        assert kinds[0] == "new" and kinds[-1] == "end" and set(kinds[1:-1]) <= {"update"}
        assert all(e["before"] == prev["after"] for prev, e in itertools.pairwise(lives)
                   if e["type"] == "update")
        assert lives[-1]["after"]["has_snapshot"] and lives[-1]["after"]["end_time"]
    assert "right" in by_label["blue"][-1]["after"]["entered_zones"]

    for label in ("red", "blue"):
        counts = payloads(got, f"{prefix}/streams/door/{label}")
        for raw in counts:
            jsonschema.validate(json.loads(raw), COUNT)
        assert [int(c) for c in counts] == [0, 1, 0], label  # configured: reported at 0 first
    zone = [int(c) for c in payloads(got, f"{prefix}/streams/door/zones/right/blue")]
    assert zone[0] == 0 and 1 in zone and zone[-1] == 0
    lines = [json.loads(raw) for raw in payloads(got, f"{prefix}/streams/door/lines/middle")]
    for totals in lines:
        jsonschema.validate(totals, LINES)
    assert lines[-1] == {"red": {"in": 1, "out": 0}, "blue": {"in": 0, "out": 1}}
    assert not payloads(got, f"{prefix}/streams/door/results")  # detect: events, not frames

    red_snapshot = payloads(got, f"{prefix}/streams/door/red/snapshot")[-1]
    picture = cv2.imdecode(np.frombuffer(red_snapshot, np.uint8), cv2.IMREAD_COLOR)
    b, g, r = picture[picture.shape[0] // 2, picture.shape[1] // 2]
    assert r > 200 and g < 60 and b < 60, "the snapshot shows the red square"
    stats = served.daemon.pipelines[0].read_stats().as_dict()
    assert stats["events_ms"]["p50"] > 0 and stats["events_published"] > 0

    discovery = {m.topic: json.loads(m.payload) for m in got
                 if m.topic.startswith(f"{prefix}ha/")}
    count = discovery[f"{prefix}ha/sensor/evtest_door_red_count/config"]
    assert count["state_topic"] == f"{prefix}/streams/door/red"
    assert count["availability_topic"] == f"{prefix}/status"
    assert count["device"]["identifiers"] == ["edged_evtest"]
    occupancy = discovery[f"{prefix}ha/binary_sensor/evtest_door_right_blue_occupancy/config"]
    assert occupancy["state_topic"] == f"{prefix}/streams/door/zones/right/blue"
    camera = discovery[f"{prefix}ha/camera/evtest_door_blue_snapshot/config"]
    assert camera["topic"] == f"{prefix}/streams/door/blue/snapshot"
    assert len({c["unique_id"] for c in discovery.values()}) == len(discovery)


def test_snapshots_when_objects_ended_are_listed_and_served_over_the_socket(
        broker: Broker, make_served: ServeFactory, video: Path) -> None:
    prefix = "t/ev2"
    sub = Subscriber(broker, f"{prefix}/#")
    try:
        served = make_served(cache="preload: [grid_det]", mqtt=mqtt(broker, prefix),
                             streams=f"[{door(video)}]")
        got = sub.collect(until=both_gone(prefix), timeout=60, what="two objects' lives")
    finally:
        sub.close()
    ended = {e["after"]["label"]: e["after"]["id"] for e in events_in(got, prefix)
             if e["type"] == "end"}
    with served.client() as client:
        status, _, body = client.request("GET", "/v2/edged/snapshots")
        assert status == 200
        listed = json.loads(body)["snapshots"]
        assert [(s["id"], s["stream"], s["label"]) for s in listed] == [
            (ended["blue"], "door", "blue"), (ended["red"], "door", "red")]  # newest first
        status, headers, jpeg = client.request("GET", f"/v2/edged/snapshots/{ended['blue']}")
        assert status == 200 and headers["Content-Type"] == "image/jpeg"
        picture = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        b, g, r = picture[picture.shape[0] // 2, picture.shape[1] // 2]
        assert b > 200 and g < 60 and r < 60, "the snapshot shows the blue square"
        status, _, body = client.request("GET", "/v2/edged/snapshots?label=red")
        assert [s["id"] for s in json.loads(body)["snapshots"]] == [ended["red"]]
        status, _, body = client.request("GET", "/v2/edged/snapshots/1.000-door-99")
        assert status == 404 and json.loads(body)["code"] == "snapshot_not_found"
        for bad in ("..%2F..%2Fetc%2Fpasswd", "%2E%2E", "..%2Fsnapshots%2F" + ended["red"]):
            status, _, body = client.request("GET", f"/v2/edged/snapshots/{bad}")
            assert status in (400, 404) and not body.startswith(b"\xff\xd8"), bad
        status, _, body = client.request("GET", "/v2/edged/snapshots/.hidden")
        assert status == 400 and json.loads(body)["code"] == "invalid_input"
        # an event without a plate (a stream without lpr) has no plate picture
        assert not any(s["plate"] for s in listed)
        status, _, body = client.request("GET", f"/v2/edged/snapshots/{ended['red']}/plate")
        assert status == 404 and json.loads(body)["code"] == "snapshot_not_found"
        status, _, body = client.request("GET", "/v2/edged/snapshots/.hidden/plate")
        assert status == 400 and json.loads(body)["code"] == "invalid_input"


def test_detect_stream_with_publish_frames_true_publishes_results_and_events(
        broker: Broker, make_served: ServeFactory, video: Path) -> None:
    prefix = "t/ev3"
    results, events = f"{prefix}/streams/door/results", f"{prefix}/events"
    sub = Subscriber(broker, results, events)
    try:
        make_served(cache="preload: [grid_det]", mqtt=mqtt(broker, prefix),
                    streams=f"[{door(video, ', publish: {frames: true}')}]")
        got = sub.collect(until=lambda got: bool(payloads(got, results))
                          and bool(payloads(got, events)), timeout=60,
                          what="results and an event")
    finally:
        sub.close()
    for raw in payloads(got, results):
        jsonschema.validate(json.loads(raw), RESULT)


def retained(broker: Broker, topic_filter: str) -> list[Received]:
    """What the broker keeps under `topic_filter`: a new subscriber gets it first, then a
    marker published after it subscribed."""
    marker = topic_filter.replace("#", "marker")
    fresh = Subscriber(broker, topic_filter)
    try:
        fresh.client.publish(marker, b"after the retained ones", qos=1)
        got = fresh.collect(until=lambda got: got[-1].topic == marker, timeout=10,
                            what="the marker")
    finally:
        fresh.close()
    return got[:-1]


def test_reload_when_the_stream_goes_removes_its_home_assistant_entities(
        broker: Broker, make_served: ServeFactory, video: Path) -> None:
    prefix = "t/ev4"
    new: list[DaemonConfig] = []
    sub = Subscriber(broker, f"{prefix}ha/#")
    try:
        served = make_served(cache="preload: [grid_det]", mqtt=mqtt(broker, prefix),
                             streams=f"[{door(video, ', loop: true')}]",
                             reload_config=lambda: new[0])
        # Each label: a count and a camera; in the zone: a count and occupancy; on the line:
        # in and out.
        announced = sub.collect(until=lambda got: len(got) >= 2 * (2 + 2 + 2), timeout=30,
                                what="discovery configs")
        topics = {m.topic for m in announced}
        assert len(topics) == 12
        kept = retained(broker, f"{prefix}ha/#")
        assert {m.topic for m in kept} == topics and all(m.retain for m in kept)
        new.append(dataclasses.replace(served.daemon.config, streams=[]))
        served.daemon.request_reload_threadsafe()
        sub.collect(until=lambda got: {m.topic for m in got if not m.payload} >= topics,
                    timeout=30, what="every config removed")
    finally:
        sub.close()
    assert retained(broker, f"{prefix}ha/#") == []
    wait_until(lambda: served.daemon.reloads["ok"] == 1, timeout=10, what="reload done")
    assert served.daemon.pipelines == ()


def test_detect_stream_whose_labels_the_model_lacks_is_not_started_and_says_why(
        make_served: ServeFactory, video: Path, caplog: pytest.LogCaptureFixture) -> None:
    served = make_served(cache="preload: [grid_det]",
                         streams=f"[{door(video).replace('[red, blue]', '[red, cat]')}]")
    assert served.daemon.pipelines == ()
    assert "stream door is not started: labels[1]: the model has no label 'cat' (red, " \
           "green, blue)" in caplog.text
