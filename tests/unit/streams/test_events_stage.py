"""The events stage and hub as the daemon runs them: a stalled source's objects end, a stopped
stream's objects end and their counts go to 0, the whole retained state goes out again after
a reconnect; Home Assistant's discovery configs name the right topics, one device, one
unique id each, and those a stream no longer has are removed."""

from __future__ import annotations

import json
from typing import Any

import pytest
from support.events import T0, det, stream

from edged.core.errors import ConfigError
from edged.events.discovery import DeviceInfo, slug, stream_configs
from edged.events.publish import EventPublisher
from edged.processing.detections import Detections
from edged.streams.events_stage import EventsHub, EventsStage

DEVICE = DeviceInfo("edge-01", "edged/edge-01", "homeassistant", "1.0")


class Link:
    """The MQTT link's two publish calls, recorded in order."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, str, bytes, bool]] = []

    def publish(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        self.sent.append((kind, suffix, payload, retain))

    def publish_to(self, kind: str, topic: str, payload: bytes, *,
                   retain: bool = False) -> None:
        self.sent.append((kind, topic, payload, retain))

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(p) for _k, s, p, _r in self.sent if s == "events"]

    def on(self, topic: str) -> list[bytes]:
        return [p for _k, s, p, _r in self.sent if s == topic]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


DOOR = """
    track: {min_hits: 2, max_age_s: 1.0}
    labels: [person]
    zones: [{name: hall, polygon: [[0, 0], [640, 0], [640, 480], [0, 480]]}]
    lines: [{name: gate, points: [[320, 0], [320, 480]]}]
"""


def staged(link: Link, clock: Clock) -> EventsStage:
    cfg = stream(DOOR)
    return EventsStage(cfg, EventPublisher("door", link.publish, None), clock=clock,
                       wall=lambda: T0 + clock.now - 100.0)


def see_someone(stage: EventsStage, clock: Clock, frames: int = 3) -> None:
    for i in range(frames):
        found = Detections.from_rows([det((100 + 5 * i, 100, 140, 200))])
        stage.frame(T0 + clock.now - 100.0, found, None)
        clock.now += 0.1


def test_stage_when_the_source_stalls_ends_its_objects_after_max_age_and_not_before() -> None:
    link, clock = Link(), Clock()
    stage = staged(link, clock)
    see_someone(stage, clock)
    assert [e["type"] for e in link.events()] == ["new"]
    clock.now += 0.5
    stage.tick(idle=True)  # not stalled long enough: a slow source keeps its objects
    clock.now += 1.0
    stage.tick(idle=False)  # a frame is in the model: its result decides
    assert [e["type"] for e in link.events()] == ["new"]
    stage.tick(idle=True)
    assert [e["type"] for e in link.events()] == ["new", "end"]
    assert link.on("streams/door/person")[-1] == b"0"
    assert stage.read_stats().as_dict()["events_ms"]["p50"] >= 0


def test_stage_when_closed_ends_every_object_publishes_counts_of_zero_and_says_so() -> None:
    link, clock = Link(), Clock()
    closed: list[EventsStage] = []
    cfg = stream(DOOR)
    stage = EventsStage(cfg, EventPublisher("door", link.publish, None), clock=clock,
                        on_close=closed.append)
    see_someone(stage, clock)
    stage.close()
    stage.close()  # once only
    assert [e["type"] for e in link.events()] == ["new", "end"]
    assert link.on("streams/door/person") == [b"0", b"1", b"0"]
    assert link.on("streams/door/zones/hall/person")[-1] == b"0"
    assert closed == [stage]


def test_stage_when_a_reconnect_asks_publishes_the_whole_retained_state_on_its_next_tick(
        ) -> None:
    link, clock = Link(), Clock()
    stage = staged(link, clock)
    see_someone(stage, clock)
    link.sent.clear()
    stage.request_republish()  # paho's thread: only a flag
    assert link.sent == []
    stage.tick(idle=False)  # the stream's thread
    assert ("events", "streams/door/person", b"1", True) in link.sent
    assert ("events", "streams/door/zones/hall/person", b"1", True) in link.sent
    assert ("events", "streams/door/lines/gate", b'{"person":{"in":0,"out":0}}', True) \
        in link.sent
    link.sent.clear()
    stage.tick(idle=False)
    assert link.sent == []  # once per request


def test_hub_when_a_stream_starts_checks_its_labels_and_announces_its_entities() -> None:
    link = Link()
    hub = EventsHub(link, device=DEVICE)
    with pytest.raises(ConfigError, match="labels\\[0\\]: the model has no label 'person'"):
        hub.stage(stream(DOOR), ["red", "green"])
    stage = hub.stage(stream(DOOR), ["person", "car"])
    topics = {s for kind, s, _p, retain in link.sent if kind == "discovery" and retain}
    assert "homeassistant/sensor/edge-01_door_person_count/config" in topics
    assert "homeassistant/sensor/edge-01_door_car_count/config" not in topics  # labels: said
    assert hub.stages() == {"door": stage}
    stage.close()
    assert hub.stages() == {}


def test_hub_when_a_stream_changes_or_goes_removes_the_entities_it_no_longer_has() -> None:
    link = Link()
    hub = EventsHub(link, device=DEVICE)
    hub.announce("door", {"a/config": b"A", "b/config": b"B"})
    link.sent.clear()
    hub.announce("door", {"a/config": b"A", "c/config": b"C"})  # a reload: b gone, c new
    assert link.sent == [("discovery", "b/config", b"", True),
                         ("discovery", "c/config", b"C", True)]
    link.sent.clear()
    hub.republish()  # a reconnect: all of them again
    assert sorted(s for _k, s, _p, _r in link.sent) == ["a/config", "c/config"]
    link.sent.clear()
    hub.rediscover("homeassistant/status", b"offline")
    assert link.sent == []
    hub.rediscover("homeassistant/status", b"online")  # Home Assistant restarted
    assert len(link.sent) == 2
    link.sent.clear()
    hub.withdraw("door")
    assert sorted((s, p) for _k, s, p, _r in link.sent) == [("a/config", b""),
                                                            ("c/config", b"")]


def test_discovery_when_a_stream_has_zones_lines_and_snapshots_makes_one_device_of_them(
        ) -> None:
    configs = {topic: json.loads(raw) for topic, raw in stream_configs(
        DEVICE, "door", ["person", "traffic light"], ["hall"], ["gate"], True).items()}
    # per label: count, camera; in the zone: count, occupancy; on the line: in, out
    assert len(configs) == 2 * 6
    count = configs["homeassistant/sensor/edge-01_door_person_count/config"]
    assert count["state_topic"] == "edged/edge-01/streams/door/person"
    assert count["unique_id"] == "edged_edge-01_door_person_count"
    assert count["state_class"] == "measurement"
    light = configs["homeassistant/sensor/edge-01_door_traffic_light_count/config"]
    assert light["state_topic"] == "edged/edge-01/streams/door/traffic light"
    occupancy = configs["homeassistant/binary_sensor/edge-01_door_hall_person_occupancy/config"]
    assert occupancy["state_topic"] == "edged/edge-01/streams/door/zones/hall/person"
    assert occupancy["device_class"] == "occupancy" and "> 0" in occupancy["value_template"]
    line_in = configs["homeassistant/sensor/edge-01_door_gate_person_in/config"]
    assert line_in["state_topic"] == "edged/edge-01/streams/door/lines/gate"
    assert line_in["value_template"] == '{{ value_json.get("person", {}).get("in", 0) }}'
    camera = configs["homeassistant/camera/edge-01_door_person_snapshot/config"]
    assert camera["topic"] == "edged/edge-01/streams/door/person/snapshot"
    for config in configs.values():
        assert config["availability_topic"] == "edged/edge-01/status"
        assert (config["payload_available"], config["payload_not_available"]) == (
            "online", "offline")
        assert config["device"] == {"identifiers": ["edged_edge-01"], "name": "edged edge-01",
                                    "manufacturer": "edged", "model": "edged inference daemon",
                                    "sw_version": "1.0"}
    assert len({c["unique_id"] for c in configs.values()}) == len(configs)
    assert not any("camera" in t for t in stream_configs(DEVICE, "door", ["person"], [], [],
                                                           False))
    assert slug("a b..c/d") == "a_b_c_d"


def test_discovery_when_a_stream_names_faces_and_reads_plates_makes_frigates_last_sensors(
        ) -> None:
    from edged.events.discovery import recognition_configs

    configs = {topic: json.loads(raw) for topic, raw in recognition_configs(
        DEVICE, "door", faces=True, plates=True).items()}
    face = configs["homeassistant/sensor/edge-01_door_recognized_face/config"]
    plate = configs["homeassistant/sensor/edge-01_door_recognized_plate/config"]
    assert face["state_topic"] == face["json_attributes_topic"] == \
        "edged/edge-01/streams/door/recognized/face"
    assert face["value_template"] == "{{ value_json.name }}"
    assert plate["state_topic"] == "edged/edge-01/streams/door/recognized/plate"
    assert plate["value_template"] == \
        "{{ value_json.name if value_json.name else value_json.plate }}"
    for config in (face, plate):
        assert config["availability_topic"] == "edged/edge-01/status"
        assert config["device"]["identifiers"] == ["edged_edge-01"]
    assert face["unique_id"] != plate["unique_id"]
    assert recognition_configs(DEVICE, "door", faces=False, plates=False) == {}
    assert list(recognition_configs(DEVICE, "door", faces=False, plates=True)) == [
        "homeassistant/sensor/edge-01_door_recognized_plate/config"]
