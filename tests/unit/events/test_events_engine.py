"""A stream's events frame by frame: new once an object is confirmed, update only when zones,
top score, sub label or snapshot changed (and not more often than update_interval_s), end when
it is gone; counts and line totals only when they change, back to 0 when empty; every payload
as its published schema says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
from support.events import T0, Box, det, frame, path, stream

from edged.events.engine import Changes, StreamEvents
from edged.processing.detections import Detections

SCHEMAS = Path(__file__).resolve().parents[3] / "docs" / "schemas"
FPS = 10.0


def run(events: StreamEvents, frames: list[list[dict[str, Any]]], *, start: int = 0,
        pictures: list[np.ndarray] | None = None) -> list[Changes]:
    return [events.update(T0 + (start + i) / FPS, Detections.from_rows(dets),
                          pictures[i] if pictures else None)
            for i, dets in enumerate(frames)]


def kinds(changes: list[Changes]) -> list[tuple[int, str]]:
    return [(i, e["type"]) for i, c in enumerate(changes) for e in c.events]


def walker(box: Box, step: tuple[float, float], frames: int, **extra: Any) -> list[list[dict]]:
    return [[det(b, **extra)] for b in path(box, step, frames)]


def test_events_when_an_object_walks_through_a_zone_come_new_update_end_in_order() -> None:
    events = StreamEvents("door", stream("""
        track: {min_hits: 2, max_age_s: 0.5, update_interval_s: 0}
        zones: [{name: right, polygon: [[320, 0], [640, 0], [640, 480], [320, 480]],
                 inertia: 1}]
    """))
    walk = walker((100, 100, 140, 200), (30, 0), 12) + [[]] * 8  # then leaves the picture
    changes = run(events, walk)
    assert kinds(changes) == [(1, "new"), (7, "update"), (17, "end")]
    new, update, end = (e for c in changes for e in c.events)
    assert new["before"] is None and new["after"]["current_zones"] == []
    assert update["before"] == new["after"]
    assert update["after"]["current_zones"] == update["after"]["entered_zones"] == ["right"]
    assert end["before"] == update["after"]
    assert end["after"]["end_time"] == end["after"]["frame_time"] == T0 + 11 / FPS
    assert end["after"]["start_time"] == T0
    assert new["after"]["id"] == end["after"]["id"] == f"{T0:.3f}-door-1"
    assert events.objects() == []


def test_events_when_watched_things_change_fast_update_at_most_every_interval() -> None:
    events = StreamEvents("door", stream("track: {min_hits: 1, update_interval_s: 1.0}"))
    rising = [[det((100, 100, 140, 200), score=0.5 + i * 0.01)] for i in range(30)]
    changes = run(events, rising)  # a better top score every frame
    assert kinds(changes) == [(0, "new"), (10, "update"), (20, "update")]
    assert changes[20].events[0]["after"]["top_score"] == 0.7


def test_events_when_only_the_box_moves_send_no_update() -> None:
    events = StreamEvents("door", stream("track: {min_hits: 1, update_interval_s: 0}"))
    assert kinds(run(events, walker((100, 100, 140, 200), (5, 3), 30))) == [(0, "new")]


def test_events_when_a_sub_label_arrives_the_most_confident_one_sticks() -> None:
    events = StreamEvents("door", stream("track: {min_hits: 1, update_interval_s: 0}"))
    box: Box = (100, 100, 140, 200)
    readings = [[det(box)], [det(box, sub_label="AB123", sub_label_score=0.8)],
                [det(box, sub_label="A8123", sub_label_score=0.4)], [det(box)]]
    changes = run(events, readings)
    assert kinds(changes) == [(0, "new"), (1, "update")]
    assert changes[1].events[0]["after"]["sub_label"] == "AB123"
    assert events.objects()[0]["sub_label_score"] == 0.8


def test_counts_when_objects_come_and_go_report_changes_and_fall_back_to_zero() -> None:
    events = StreamEvents("door", stream("""
        labels: [person, car]
        track: {min_hits: 1, max_age_s: 0.25}
        zones: [{name: left, polygon: [[0, 0], [320, 0], [320, 480], [0, 480]], inertia: 1}]
    """))
    a: Box = (100, 100, 140, 200)
    b: Box = (400, 100, 440, 200)
    frames = [[], [det(a)], [det(a), det(b)], [det(a), det(b)], [], [], [], []]
    changes = run(events, frames)
    assert [c.counts for c in changes] == [
        {"car": 0, "person": 0}, {"person": 1}, {"person": 2}, {}, {}, {}, {"person": 0}, {}]
    assert [c.zone_counts for c in changes] == [
        {"left": {"car": 0, "person": 0}}, {"left": {"person": 1}}, {}, {}, {}, {},
        {"left": {"person": 0}}, {}]
    assert events.counts() == {"car": 0, "person": 0}


def test_events_when_labels_and_min_score_filter_only_those_become_objects() -> None:
    events = StreamEvents("door", stream("""
        labels: [person]
        min_score: 0.6
        track: {min_hits: 1}
    """))
    # (A row without a box, or with a label that is no string, cannot be made a Detections:
    # the type holds a box and a label for every detection.)
    frames = [[det((0, 0, 40, 80), "car"), det((100, 0, 140, 80), score=0.55),
               det((200, 0, 240, 80), score=0.7), det((50, 50, 40, 90))]]
    (changes,) = run(events, frames)
    assert [e["after"]["box"] for e in changes.events] == [[200.0, 0.0, 240.0, 80.0]]


def test_lines_when_crossed_while_still_tentative_count_once_announced() -> None:
    events = StreamEvents("door", stream("""
        track: {min_hits: 3}
        lines: [{name: road, points: [[0, 240], [640, 240]]}]
    """))
    fast = walker((300, 120, 340, 200), (0, 40), 6)  # feet 200, 240, 280: crossed at frame 2
    changes = run(events, fast)
    assert changes[0].lines == {"road": {}}  # where the line starts
    assert kinds(changes) == [(2, "new")]
    assert changes[2].lines == {"road": {"person": {"in": 1, "out": 0}}}
    assert events.line_totals() == {"road": {"person": {"in": 1, "out": 0}}}


def test_events_when_flushed_end_every_object_and_counts_go_to_zero() -> None:
    events = StreamEvents("door", stream("track: {min_hits: 1}"))
    run(events, [[det((0, 0, 40, 80)), det((100, 0, 140, 80), "car")]])
    flushed = events.flush()
    assert [(e["type"], e["after"]["label"]) for e in flushed.events] == [
        ("end", "person"), ("end", "car")]
    assert flushed.counts == {"car": 0, "person": 0}
    assert events.flush() == Changes()  # nothing left to end


def test_events_when_the_capture_clock_goes_back_objects_still_age_out() -> None:
    events = StreamEvents("door", stream("track: {min_hits: 1, max_age_s: 0.5}"))
    box: Box = (100, 100, 140, 200)
    events.update(T0, Detections.from_rows([det(box)]))
    events.update(T0 - 3600, Detections.empty())  # NTP set the clock back an hour
    ends = [e for i in range(1, 8)
            for e in events.update(T0 - 3600 + i / FPS, Detections.empty()).events]
    assert [e["type"] for e in ends] == ["end"]


def test_snapshots_when_an_object_is_announced_come_with_its_label_and_id() -> None:
    events = StreamEvents("door", stream("track: {min_hits: 2, update_interval_s: 0.5}"))
    boxes = path((100, 100, 140, 200), (0, 0), 12)
    grow = [(x1, y1, x2 + i * 4, y2 + i * 4) for i, (x1, y1, x2, y2) in enumerate(boxes)]
    pictures = [frame(red=b) for b in grow]
    changes = run(events, [[det(b)] for b in grow], pictures=pictures)
    announced = changes[1].events[0]["after"]
    assert announced["has_snapshot"] is True
    assert changes[1].snapshots["person"][0] == announced["id"]
    # A better view every frame, encoded at most every update_interval_s (0.5 s = 5 frames).
    assert [i for i, c in enumerate(changes) if c.object_snapshots] == [1, 6, 11]
    assert not changes[6].events  # has_snapshot was already true: no update for a better one


def test_payloads_when_published_match_their_schemas() -> None:
    schemas = {name: json.loads((SCHEMAS / f"{name}.schema.json").read_text())
               for name in ("events", "object-count", "line-counts")}
    events = StreamEvents("door", stream("""
        track: {min_hits: 2, max_age_s: 0.3, update_interval_s: 0}
        zones: [{name: right, polygon: [[320, 0], [640, 0], [640, 480], [320, 480]]}]
        lines: [{name: gate, points: [[320, 0], [320, 480]]}]
    """))
    walk = [[det(b, sub_label="red", sub_label_score=0.7), det(moved_b, "car", 0.8)]
            for b, moved_b in zip(path((100, 100, 140, 200), (25, 0), 16),
                                  path((600, 300, 660, 340), (-25, 0), 16), strict=True)]
    pictures = [frame(red=(100, 100, 140, 200))] * (len(walk) + 6)
    changes = [*run(events, [*walk, *[[]] * 6], pictures=pictures), events.flush()]
    published = [e for c in changes for e in c.events]
    assert {e["type"] for e in published} == {"new", "update", "end"}
    for event in published:
        jsonschema.validate(json.loads(json.dumps(event)), schemas["events"])
    for c in changes:
        for count in [*c.counts.values(), *(n for z in c.zone_counts.values()
                                            for n in z.values())]:
            jsonschema.validate(count, schemas["object-count"])
        for totals in c.lines.values():
            jsonschema.validate(totals, schemas["line-counts"])
    assert events.line_totals()["gate"] == {"person": {"in": 0, "out": 1},
                                            "car": {"in": 1, "out": 0}}
