"""A face cascade's identity on tracked objects: carried into the events, a known name
outranking an unknown group, and Frigate's `tracked_object_update` (`type: face`) said once
when a face is first told and again only when it becomes someone else."""

from __future__ import annotations

from typing import Any

from support.events import T0, det, path, stream

from edged.events.engine import Changes, StreamEvents
from edged.processing.detections import Detections

FPS = 10.0


def said(identity: dict[str, Any] | None) -> dict[str, Any]:
    """What the face cascade puts on a detection: the identity, a known name as sub_label."""
    if identity is None:
        return {}
    if identity["name"] is None:
        return {"identity": identity}
    return {"identity": identity, "sub_label": identity["name"],
            "sub_label_score": identity["similarity"]}


def frames(identities: list[dict[str, Any] | None]) -> list[list[dict[str, Any]]]:
    boxes = path((100, 100, 200, 220), (2.0, 0.0), len(identities))
    return [[det(box, "face", **said(i))] for box, i in zip(boxes, identities, strict=True)]


def run(identities: list[dict[str, Any] | None]) -> list[Changes]:
    events = StreamEvents("door", stream("track: {min_hits: 1, update_interval_s: 0}"))
    return [events.update(T0 + i / FPS, Detections.from_rows(rows))
            for i, rows in enumerate(frames(identities))]


def updates(changes: list[Changes]) -> list[dict[str, Any]]:
    return [u for c in changes for u in c.updates]


UNKNOWN = {"name": None, "similarity": 0.2, "group": 3}
ANA = {"name": "Ana", "similarity": 0.81}


def test_face_updates_when_an_unknown_face_becomes_known_say_each_once() -> None:
    changes = run([UNKNOWN, UNKNOWN, ANA, {**ANA, "similarity": 0.7}, UNKNOWN, None])
    said = updates(changes)
    assert [(u["type"], u["name"], u["group"]) for u in said] == [
        ("face", None, 3), ("face", "Ana", None)]
    assert said[1]["score"] == 0.81 and said[1]["camera"] == said[1]["stream"] == "door"
    assert said[1]["id"] == changes[0].events[0]["after"]["id"]
    last = [e for c in changes for e in c.events][-1]["after"]
    assert last["identity"] == ANA  # the best known verdict holds over later unknowns


def test_face_updates_when_a_name_changes_say_the_new_one() -> None:
    bo = {"name": "Bo", "similarity": 0.9}
    assert [u["name"] for u in updates(run([ANA, ANA, bo, bo]))] == ["Ana", "Bo"]


def test_events_when_no_face_cascade_ran_carry_no_identity_and_say_nothing() -> None:
    changes = run([None, None, None])
    assert not updates(changes)
    assert all("identity" not in e["after"] for c in changes for e in c.events)
