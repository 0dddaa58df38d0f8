"""Presence of names: on at once while any stream's live objects carry the name, off only when
none has for the off delay (a flicker does not toggle it); any Unicode name becomes one safe
topic level and Home Assistant id, no two names the same, and never a wildcard or a level
in Home Assistant's configs."""

from __future__ import annotations

import json
import re

from support.events import T0, det, stream

from edged.events.discovery import DeviceInfo, presence_configs
from edged.events.engine import StreamEvents
from edged.events.presence import Presence, token
from edged.processing.detections import Detections

DEVICE = DeviceInfo("edge-01", "edged/edge-01", "homeassistant", "1.0")
ANA, CAR = ("face", "Ana"), ("plate", "Neighbour")


def test_presence_when_a_name_leaves_turns_off_only_after_the_delay() -> None:
    presence = Presence(off_delay_s=5.0)
    assert presence.update("door", {ANA}, 0.0) == [("face", "Ana", True)]
    assert presence.update("yard", {ANA}, 1.0) == []  # already on: said once
    assert presence.update("door", set(), 2.0) == []  # the yard still has her
    assert presence.update("yard", set(), 3.0) == []  # gone: off at 8
    assert presence.next_due() == 8.0 and presence.present(*ANA)
    assert presence.due(7.9) == []
    assert presence.update("door", {ANA}, 7.0) == []  # back within the delay: no toggle
    assert presence.next_due() is None
    presence.update("door", set(), 10.0)
    assert presence.due(15.0) == [("face", "Ana", False)] and not presence.present(*ANA)
    assert presence.update("door", {ANA, CAR}, 16.0) == [("face", "Ana", True),
                                                        ("plate", "Neighbour", True)]


def test_presence_when_the_delay_is_zero_turns_off_at_once() -> None:
    presence = Presence(off_delay_s=0.0)
    presence.update("door", {ANA}, 0.0)
    assert presence.update("door", set(), 1.0) == [("face", "Ana", False)]


def test_token_when_a_name_is_any_unicode_is_one_safe_level_and_never_shared() -> None:
    names = ["Ana", "ana", "Ana Lopez", "Ana_Lopez", "Ana/Lopez", "Ana+Lopez", "Ana#Lopez",
             "José", "Jose", "张伟", "李娜", "+", "#", "/", "a/+/#", "O'Brien", "x" * 64,
             "x" * 65, "-lead", "Ana Lopez ", "\u0000", "e\u0301"]
    tokens = [token(n) for n in names]
    assert len(set(tokens)) == len(names)
    for made in tokens:
        assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", made) and len(made) <= 64, made
    assert token("Ana") == "Ana" and token("Ana_Lopez") == "Ana_Lopez"
    assert token("Ana Lopez").startswith("Ana_Lopez_") and token("张伟").startswith("x_")
    assert token("José") == token("José")  # stable across runs (a hash of the name)


def test_engine_when_objects_carry_names_says_them_while_they_live() -> None:
    events = StreamEvents("door", stream("""
        track: {min_hits: 2, max_age_s: 0.3}
        lpr: {enabled: true, min_score: 0.5, known_plates: {Neighbour: [MLB803]}}
        secondary: [{model: plate_rec, labels: [car], as: text}]
    """))
    face = {"name": "Ana", "similarity": 0.8}
    for i in range(2):
        found = Detections.from_rows([det((10, 10, 100, 100), label="person",
                                          identity=face),
                                      det((300, 100, 500, 200), label="car", text="MLB803",
                                          text_score=0.9)])
        events.update(T0 + i / 10, found)
    assert events.present() == {ANA, CAR}
    events.update(T0 + 1.0, Detections.empty())
    assert events.present() == frozenset()


def test_presence_configs_when_a_name_has_mqtt_wildcards_keep_them_out_of_topics() -> None:
    names = [("face", "a/+/#"), ("plate", "Van #2"), ("face", "+")]
    configs = presence_configs(DEVICE, names)
    for topic, raw in configs.items():
        state = json.loads(raw)["state_topic"]
        for where in (topic, state):
            assert "+" not in where and "#" not in where
        assert topic.count("/") == 3 and state.count("/") == 4
