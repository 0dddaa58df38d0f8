"""The presence hub as the daemon runs it: it announces the names known (enrolled faces, the
streams' known plates) with their states, removes the gone (empty retained config and
state), says ON at once and OFF after the delay by its own timer, and OFF for all at close;
the events stages tell it their objects' names, a reloaded stream's two stages apart."""

from __future__ import annotations

import json

import pytest
from support.events import T0, det, stream
from support.polling import wait_until

from edged.events.discovery import DeviceInfo
from edged.events.presence import token
from edged.processing.detections import Detections
from edged.streams.events_stage import EventsHub
from edged.streams.presence_hub import PresenceHub

DEVICE = DeviceInfo("edge-01", "edged/edge-01", "homeassistant", "1.0")
ANA, CAR = ("face", "Ana"), ("plate", "Neighbour")


class Sent:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.announced: list[dict[str, bytes]] = []

    def publish(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        assert kind == "events" and retain
        self.sent.append((suffix, payload))

    def announce(self, key: str, configs: dict[str, bytes]) -> None:
        assert key == ""
        self.announced.append(configs)


def test_hub_when_names_come_and_go_announces_states_and_removes_the_gone() -> None:
    out = Sent()
    hub = PresenceHub(out.publish, DEVICE, out.announce, off_delay_s=60.0)
    hub.faces_known(["Ana", "Ana/Lopez #1"])
    hub.plates_known("drive", ["Neighbour"])
    odd = token("Ana/Lopez #1")
    assert out.sent == [("presence/face/Ana", b"OFF"), (f"presence/face/{odd}", b"OFF"),
                        ("presence/plate/Neighbour", b"OFF")]
    configs = {t: json.loads(c) for t, c in out.announced[-1].items()}
    ana = configs["homeassistant/binary_sensor/edge-01_presence_face_Ana_present/config"]
    assert ana["name"] == "Ana present" and ana["device_class"] == "presence"
    assert ana["state_topic"] == "edged/edge-01/presence/face/Ana"
    assert configs[f"homeassistant/binary_sensor/edge-01_presence_face_{odd}_present/config"][
        "name"] == "Ana/Lopez #1 present"
    assert len({c["unique_id"] for c in configs.values()}) == 3
    out.sent.clear()
    hub.seen("door", {ANA, ("face", "Stranger")})  # a name not (or no longer) enrolled
    assert out.sent == [("presence/face/Ana", b"ON")]
    hub.faces_known(["Ana/Lopez #1"])  # Ana deleted while in view
    assert out.sent[-1] == ("presence/face/Ana", b"")  # her retained state cleared
    assert len(out.announced[-1]) == 2
    hub.seen("door", set())
    hub.republish()
    assert out.sent[-2:] == [(f"presence/face/{odd}", b"OFF"),
                             ("presence/plate/Neighbour", b"OFF")]
    hub.plates_known("drive", [])  # the stream went, or its lpr
    assert out.sent[-1] == ("presence/plate/Neighbour", b"") and len(out.announced[-1]) == 1
    hub.close()


def test_hub_when_the_delay_passes_says_off_by_itself_and_on_close_says_off() -> None:
    out = Sent()
    hub = PresenceHub(out.publish, None, None, off_delay_s=0.05)  # no discovery: states only
    hub.faces_known(["Ana"])
    hub.plates_known("drive", ["Neighbour"])
    hub.seen("door", {ANA, CAR})
    hub.seen("door", {CAR})
    wait_until(lambda: ("presence/face/Ana", b"OFF") in out.sent[3:], timeout=5,
               what="Ana's off after the delay")
    hub.close()
    assert out.sent[-1] == ("presence/plate/Neighbour", b"OFF")


class Link:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        self.sent.append((suffix, payload))

    def publish_to(self, kind: str, topic: str, payload: bytes, *,
                   retain: bool = False) -> None:
        self.sent.append((topic, payload))

    def said(self, topic: str) -> list[bytes]:
        return [p for t, p in self.sent if t == topic]


def test_stages_when_a_reload_starts_the_new_one_first_the_old_ones_end_does_not_turn_off(
        ) -> None:
    link = Link()
    hub = EventsHub(link, device=None, presence_off_delay_s=0.0)
    hub.presence.faces_known(["Ana"])
    ana = Detections.from_rows([det((10, 10, 100, 100), identity={"name": "Ana",
                                                                  "similarity": 0.8})])
    old = hub.stage(stream("track: {min_hits: 1}"), ["person"])
    old.frame(T0, ana, None)
    assert link.said("presence/face/Ana") == [b"OFF", b"ON"]
    new = hub.stage(stream("track: {min_hits: 1}"), ["person"])  # the same stream, reloaded
    new.frame(T0 + 0.1, ana.take([0]), None)
    old.close()  # its objects end: not hers on the new stage
    assert link.said("presence/face/Ana") == [b"OFF", b"ON"]
    new.close()
    assert link.said("presence/face/Ana") == [b"OFF", b"ON", b"OFF"]
    hub.presence.close()


def test_stage_when_its_last_flush_fails_still_lets_its_names_go() -> None:
    """A stage whose closing flush raises (a bug in a stage) still tells presence its names
    are gone: else they stayed ON until a restart."""
    link = Link()
    hub = EventsHub(link, device=None, presence_off_delay_s=0.0)
    hub.presence.faces_known(["Ana"])
    ana = Detections.from_rows([det((10, 10, 100, 100), identity={"name": "Ana",
                                                                  "similarity": 0.8})])
    stage = hub.stage(stream("track: {min_hits: 1}"), ["person"])
    stage.frame(T0, ana, None)
    assert link.said("presence/face/Ana") == [b"OFF", b"ON"]

    def broken() -> None:
        raise RuntimeError("a bug in the engine")

    stage.engine.flush = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError):
        stage.close()
    assert link.said("presence/face/Ana") == [b"OFF", b"ON", b"OFF"]
    hub.presence.close()
