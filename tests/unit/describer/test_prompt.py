"""What the describer asks: the event's data for a text model, and the snapshot as an image
data URL for a vision model; what the answers are cached under."""

from __future__ import annotations

import base64
import json

from edged.describer.prompt import Subject, cache_key, facts, messages, thin

EVENT = {"id": "1718000000.000-door-3", "label": "person", "sub_label": "alice",
         "top_score": 0.91, "start_time": 1718000000.0, "end_time": 1718000012.5,
         "entered_zones": ["porch"], "box": [10.2, 20.7, 50.0, 120.0]}
PATH = tuple((i * 0.5, 10.0 + i, 100.0) for i in range(40))


def subject(jpeg: bytes | None = b"\xff\xd8picture", **changes: object) -> Subject:
    return Subject("1718000000.000-door-3", "door", {**EVENT, **changes}, jpeg, PATH,
                   (("gate", "in"),))


def test_messages_when_text_model_send_the_event_data_only() -> None:
    system, user = messages(subject(), vision=False)
    assert system["role"] == "system" and "JSON" in system["content"]
    assert isinstance(user["content"], str)
    data = json.loads(user["content"].removeprefix("Event: "))
    assert data["object"] == "person" and data["identified_as"] == "alice"
    assert data["camera"] == "door" and data["zones_entered"] == ["porch"]
    assert data["duration_s"] == 12.5 and data["start_time"].startswith("2024-06-10T")
    assert len(data["path"]) == 16 and data["path"][0] == [0.0, 10, 100]
    assert data["lines_crossed"] == [{"line": "gate", "direction": "in"}]


def test_messages_when_vision_model_carry_the_snapshot_as_a_data_url() -> None:
    _system, user = messages(subject(), vision=True, instructions="Deliveries are normal.")
    text, image = user["content"]
    assert text["type"] == "text" and image["type"] == "image_url"
    url = image["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == b"\xff\xd8picture"
    assert "Deliveries are normal." in _system["content"]


def test_messages_when_vision_but_no_snapshot_send_the_text_alone() -> None:
    assert isinstance(messages(subject(jpeg=None), vision=True)[1]["content"], str)


def test_cache_key_when_vision_follows_the_snapshot_not_the_times() -> None:
    key = cache_key(subject(), vision=True, model="m", instructions="")
    assert key == cache_key(subject(start_time=1.0, end_time=2.0), vision=True, model="m",
                            instructions="")
    assert key != cache_key(subject(b"\xff\xd8other"), vision=True, model="m", instructions="")
    assert key != cache_key(subject(), vision=True, model="other", instructions="")
    assert key != cache_key(subject(), vision=True, model="m", instructions="be brief")


def test_cache_key_when_text_follows_the_data_without_id_or_times() -> None:
    key = cache_key(subject(), vision=False, model="m", instructions="")
    later = subject(start_time=1718000100.0, end_time=1718000112.5, id="other")
    assert key == cache_key(later, vision=False, model="m", instructions="")
    assert key != cache_key(subject(entered_zones=[]), vision=False, model="m",
                            instructions="")
    assert "start_time" not in facts(subject(), times=False)


def test_thin_when_long_keeps_the_ends_and_the_limit() -> None:
    points = thin(PATH, 5)
    assert len(points) == 5 and points[0] == PATH[0] and points[-1] == PATH[-1]
    assert thin(PATH[:3], 5) == list(PATH[:3])
