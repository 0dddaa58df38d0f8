"""Reporting an engine's changes: each to its topic (events in order, counts, zones and lines
retained, the newest snapshot per label retained), compact JSON in the published schemas,
labels made safe as topic levels, and every object's snapshot stored under its id with its
label; which outputs a stream has by its model's kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
from support.events import T0, det, frame, path, stream

from edged.events.config import Outputs, PublishConfig, outputs
from edged.events.engine import StreamEvents
from edged.events.publish import EventPublisher
from edged.events.store import SnapshotStore, label_in, with_label
from edged.mqtt.topics import topic_level
from edged.processing.detections import Detections

SCHEMAS = Path(__file__).resolve().parents[3] / "docs" / "schemas"
FPS = 10.0
Sent = tuple[str, str, bytes, bool]


class Recorder:
    """The MQTT link's publish, as the publisher calls it: what was sent, in order."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []

    def __call__(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        self.sent.append((kind, suffix, payload, retain))

    def on(self, suffix: str) -> list[bytes]:
        return [payload for _k, s, payload, _r in self.sent if s == suffix]


def crossing(events: StreamEvents, publisher: EventPublisher, frames: int = 20,
             gone: int = 12) -> None:
    """A red box walking right across the line x=320 and into the zone, then gone."""
    boxes = path((200, 200, 260, 300), (20, 0), frames)
    for i, box in enumerate(boxes + [None] * gone):
        picture = frame(red=box) if box else frame()
        found = Detections.from_rows([det(box, "red")] if box else [])
        publisher.changes(events.update(T0 + i / FPS, found, picture))


def settings(extra: str = "") -> Any:
    return stream(f"""
        track: {{min_hits: 2, max_age_s: 0.5, update_interval_s: 0}}
        labels: [red, blue]
        zones: [{{name: right, polygon: [[320, 0], [640, 0], [640, 480], [320, 480]],
                 inertia: 1}}]
        lines: [{{name: gate, points: [[320, 480], [320, 0]]}}]
        {extra}
    """)


def test_publisher_when_an_object_crosses_sends_each_change_to_its_topic(
        tmp_path: Path) -> None:
    sent = Recorder()
    publisher = EventPublisher("door", sent, None)
    crossing(StreamEvents("door", settings()), publisher)
    assert {kind for kind, *_ in sent.sent} == {"events"}
    events = [json.loads(p) for p in sent.on("events")]
    schema = json.loads((SCHEMAS / "events.schema.json").read_text())
    for event in events:
        jsonschema.validate(event, schema)
    assert events[0]["type"] == "new" and events[-1]["type"] == "end"
    assert all(not retain for _k, s, _p, retain in sent.sent if s == "events")
    assert all(retain for _k, s, _p, retain in sent.sent if s != "events")
    assert sent.on("streams/door/red") == [b"0", b"1", b"0"]
    assert sent.on("streams/door/blue") == [b"0"]  # configured: reported once, at 0
    assert sent.on("streams/door/zones/right/red") == [b"0", b"1", b"0"]
    assert [json.loads(p) for p in sent.on("streams/door/lines/gate")] == [
        {"red": {"in": 0, "out": 0}, "blue": {"in": 0, "out": 0}},
        {"red": {"in": 1, "out": 0}, "blue": {"in": 0, "out": 0}}]
    assert b" " not in sent.on("events")[0]  # compact JSON
    snapshots = sent.on("streams/door/red/snapshot")
    assert snapshots and all(p.startswith(b"\xff\xd8") for p in snapshots)
    assert publisher.messages == len(sent.sent)


def test_publisher_when_objects_have_snapshots_stores_each_under_its_id_with_its_label(
        tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path / "snapshots", 1 << 20)
    events = StreamEvents("door", settings())
    crossing(events, EventPublisher("door", None, store))  # MQTT off: still stored
    (kept,) = store.list()
    assert (kept.stream, kept.label) == ("door", "red")
    assert kept.id.endswith("-door-1")
    jpeg = store.read(kept.id)
    assert jpeg is not None
    picture = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    b, g, r = picture[picture.shape[0] // 2, picture.shape[1] // 2]
    assert r > 200 and g < 60 and b < 60
    reopened = SnapshotStore(tmp_path / "snapshots", 1 << 20)  # a restart: the file says
    assert [(s.id, s.label) for s in reopened.list()] == [(kept.id, "red")]


def test_publisher_when_a_label_holds_mqtt_separators_makes_it_one_topic_level() -> None:
    sent = Recorder()
    publisher = EventPublisher("door", sent, None)
    events = StreamEvents("door", stream("track: {min_hits: 1}"))
    found = Detections.from_rows([det((10, 10, 50, 50), "a/b+#")])
    publisher.changes(events.update(T0, found, None))
    assert sent.on("streams/door/a_b__") == [b"1"]
    assert topic_level("traffic light") == "traffic light"  # spaces are fine in topics


def test_snapshot_label_when_written_into_a_jpeg_is_read_back_and_the_jpeg_still_decodes(
        ) -> None:
    jpeg = cv2.imencode(".jpg", np.full((8, 8, 3), 200, np.uint8))[1].tobytes()
    labelled = with_label(jpeg, "traffic light")
    assert label_in(labelled[:512]) == "traffic light"
    assert label_in(jpeg) is None
    assert cv2.imdecode(np.frombuffer(labelled, np.uint8), cv2.IMREAD_COLOR).shape == (8, 8, 3)


def test_outputs_when_the_model_detects_are_events_and_frames_only_on_request() -> None:
    assert outputs(PublishConfig(), "detect") == Outputs(False, True)
    assert outputs(PublishConfig(frames=True), "detect") == Outputs(True, True)
    assert outputs(PublishConfig(events=False), "detect") == Outputs(True, False)
    assert outputs(PublishConfig(), "classify") == Outputs(True, False)
    assert outputs(PublishConfig(), "raw") == Outputs(True, False)
    assert outputs(PublishConfig(frames=False), "classify") == Outputs(False, False)


def test_publisher_when_a_face_is_named_or_a_plate_read_keeps_it_as_the_last_recognised(
        ) -> None:
    """Frigate's integration keeps a last recognised face and plate per camera: a named face
    and every plate read (known or not) are retained on `recognized/face|plate`; an unknown
    face is told on tracked_object_update only; a reconnect sends the last ones again."""
    from edged.events.engine import Changes

    sent = Recorder()
    publisher = EventPublisher("door", sent, None)
    ana = {"type": "face", "id": "1-door-1", "name": "Ana", "score": 0.8, "group": None,
           "camera": "door", "stream": "door", "timestamp": 1.0}
    stranger = {**ana, "id": "1-door-2", "name": None, "group": 3}
    plate = {"type": "lpr", "id": "1-door-3", "stream": "door", "camera": "door", "name": None,
             "known": False, "plate": "ABC123", "score": 0.9, "timestamp": 2.0}
    publisher.changes(Changes(updates=[ana, stranger, plate]))
    assert [json.loads(p)["id"] for p in sent.on("tracked_object_update")] == [
        "1-door-1", "1-door-2", "1-door-3"]
    retained = [(s, json.loads(p)) for _k, s, p, r in sent.sent if r]
    assert retained == [("streams/door/recognized/face", ana),
                        ("streams/door/recognized/plate", plate)]
    sent.sent.clear()
    publisher.recognized()
    assert sorted(s for _k, s, _p, r in sent.sent if r) == [
        "streams/door/recognized/face", "streams/door/recognized/plate"]
