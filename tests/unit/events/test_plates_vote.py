"""Licence plates on tracked objects: a text cascade's reads voted per object (a misread does
not flicker the plate, three good reads beat one lucky one), known plates matched literally
within match_distance or by regex and named as the sub_label, Frigate's
`recognized_license_plate` fields on events and one `lpr` tracked_object_update per plate,
all in the published schemas; the config refuses what cannot work; the plate's own picture is
its voted plate's best read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import jsonschema
import numpy as np
import pytest
from support.events import T0, det, stream

from edged.core.errors import ConfigError
from edged.events.engine import StreamEvents
from edged.events.plates import (
    MAX_VIEW_SIDE,
    MAX_VIEWS,
    KnownPlates,
    LprConfig,
    PlateVote,
    edit_distance,
    normalise,
)
from edged.processing.detections import Detections

SCHEMAS = Path(__file__).resolve().parents[3] / "docs" / "schemas"
EVENT = json.loads((SCHEMAS / "events.schema.json").read_text())
UPDATE = json.loads((SCHEMAS / "tracked-object-update.schema.json").read_text())
LPR = """
    lpr: {enabled: true, min_score: 0.5,
          known_plates: {Wife's Car: [MLB803], Vans: ['^VAN[0-9]+$']}}
    secondary: [{model: plate_rec, labels: [car], as: text}]
    track: {min_hits: 2, max_age_s: 0.3, update_interval_s: 0}
"""


def test_vote_when_one_read_is_wrong_keeps_the_plate_most_reads_say() -> None:
    vote = PlateVote(LprConfig(enabled=True, min_score=0.5))
    changed = [vote.add(text, score) for text, score in (
        ("MLB803", 0.9), ("MLB8O3", 0.95), ("MLB 803", 0.9), ("M1B803", 0.6))]
    assert changed == [True, False, False, False]
    assert vote.plate == "MLB803" and vote.score == 0.9
    assert vote.reads == {"MLB803": 2, "MLB8O3": 1, "M1B803": 1}


def test_vote_when_a_better_supported_text_comes_takes_it_over() -> None:
    vote = PlateVote(LprConfig(enabled=True, min_score=0.5))
    assert vote.add("MLB8O3", 0.7)
    assert not vote.add("MLB803", 0.6)  # one read each: the plate stays
    assert vote.add("MLB803", 0.9)  # two reads to one
    assert vote.plate == "MLB803"


def test_vote_when_reads_are_weak_short_or_off_format_ignores_them() -> None:
    vote = PlateVote(LprConfig(enabled=True, min_score=0.8, min_length=4,
                               format="^[A-Z]{3}[0-9]{3}$"))
    assert not vote.add("MLB803", 0.5)  # weak
    assert not vote.add("AB1", 0.99)  # short
    assert not vote.add("12ABCD", 0.99)  # off format
    assert not vote.add(None, None)
    assert vote.plate is None and vote.score is None
    assert vote.add("mlb-803", 0.9) and vote.plate == "MLB803"


def test_known_plates_when_a_read_is_a_character_off_or_fits_a_regex_name_it() -> None:
    known = KnownPlates({"Wife's Car": ["ABC-1234"], "Vans": ["^VAN[0-9]{3}$"]}, 1)
    assert known.match("abc 1234") == "Wife's Car"
    assert known.match("ABC1284") == "Wife's Car"  # one character off
    assert known.match("ABC12") is None  # two off
    assert known.match("VAN123") == "Vans"
    assert known.match("VAN12") is None
    assert KnownPlates({"x": ["ABC123"]}, 0).match("ABC124") is None


def test_edit_distance_when_past_the_limit_stops_early() -> None:
    assert edit_distance("KITTEN", "SITTING", 5) == 3
    assert edit_distance("A", "ABCDEF", 2) == 3
    assert normalise("ab-12 c") == "AB12C"


def test_lpr_config_when_a_known_plate_regex_is_broken_names_the_key() -> None:
    with pytest.raises(ConfigError, match=r"lpr.known_plates.*not a valid regex"):
        stream("lpr: {enabled: true, known_plates: {x: ['^AB[']}}")


def test_lpr_config_when_no_text_cascade_reads_plates_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"lpr.enabled.*text cascade"):
        stream("lpr: {enabled: true}")


def frames(reads: list[tuple[str | None, float]], box: tuple[float, ...] = (100, 100, 300, 200)
           ) -> list[Detections]:
    found = []
    for text, score in reads:
        row: dict[str, Any] = det(box, label="car")
        if text is not None:
            row.update(text=text, text_score=score)
        found.append(Detections.from_rows([row]))
    return found


def test_engine_when_a_known_plate_is_read_names_the_car_and_tells_lpr_once() -> None:
    events = StreamEvents("drive", stream(LPR))
    reads = [("MLB803", 0.9), ("MLB8O3", 0.7), ("MLB803", 0.95), (None, 0.0)] + [(None, 0)] * 0
    changes = [events.update(T0 + i / 10, d) for i, d in enumerate(frames(reads))]
    changes.append(events.update(T0 + 2.0, Detections.empty()))  # gone
    published = [e for c in changes for e in c.events]
    updates = [u for c in changes for u in c.updates]
    for event in published:
        jsonschema.validate(event, EVENT)
    for update in updates:
        jsonschema.validate(update, UPDATE)
    new = published[0]
    assert new["type"] == "new"
    assert new["after"]["recognized_license_plate"] == "MLB803"
    assert new["after"]["sub_label"] == "Wife's Car"
    assert published[-1]["type"] == "end"
    assert published[-1]["after"]["recognized_license_plate"] == "MLB803"
    assert len(updates) == 1
    assert updates[0] | {"timestamp": 0} == {
        "type": "lpr", "id": new["after"]["id"], "stream": "drive", "camera": "drive",
        "name": "Wife's Car", "known": True, "plate": "MLB803", "score": 0.9,
        "timestamp": 0}


def test_engine_when_an_unknown_plate_is_read_tells_it_without_a_name() -> None:
    events = StreamEvents("drive", stream(LPR))
    changes = [events.update(T0 + i / 10, d)
               for i, d in enumerate(frames([("XYZ789", 0.9)] * 3))]
    [update] = [u for c in changes for u in c.updates]
    assert update["name"] is None and update["known"] is False and update["plate"] == "XYZ789"
    new = next(e for c in changes for e in c.events)
    assert new["after"]["sub_label"] is None


def test_engine_when_lpr_is_off_publishes_no_plate_fields() -> None:
    events = StreamEvents("drive", stream("track: {min_hits: 1}"))
    [change] = [events.update(T0, d) for d in frames([("MLB803", 0.9)])]
    assert "recognized_license_plate" not in change.events[0]["after"]
    assert change.updates == []


def test_vote_when_a_held_frame_repeats_the_last_read_counts_it_once() -> None:
    vote = PlateVote(LprConfig(enabled=True, min_score=0.5))
    assert vote.add("MLB8O3", 0.91)
    for _ in range(5):  # the change gate hands the same answer on
        assert not vote.add("MLB8O3", 0.91)
    assert vote.reads == {"MLB8O3": 1}
    assert not vote.add("MLB803", 0.9)  # one read each: the plate stays
    assert vote.add("MLB803", 0.93)  # a new read of the truth
    assert vote.plate == "MLB803"


def picture(value: int) -> np.ndarray:
    return np.full((20, 60, 3), value, np.uint8)


def test_vote_when_reads_come_with_pictures_keeps_the_winners_best_read() -> None:
    vote = PlateVote(LprConfig(enabled=True, min_score=0.5))
    frame = picture(1)
    vote.add("MLB8O3", 0.97, frame[:, :30])  # a view of the frame: copied
    frame[:] = 99  # the next frame overwrites the buffer
    assert vote.best_view() is not None and int(vote.best_view()[1].max()) == 1
    vote.add("MLB803", 0.9, picture(2))
    vote.add("MLB803", 0.95, picture(3))  # the winner now, at its best read
    vote.add("MLB803", 0.91, picture(4))  # a worse read keeps the best
    assert vote.plate == "MLB803"
    score, pixels = vote.best_view()
    assert score == 0.95 and int(pixels.max()) == 3  # never the misread's 0.97
    assert not vote.add("MLB803", 0.2, picture(5))  # a weak read keeps no picture either
    assert vote.best_view()[0] == 0.95


def test_vote_when_many_texts_are_read_keeps_pictures_of_at_most_max_views() -> None:
    vote = PlateVote(LprConfig(enabled=True, min_score=0.5))
    vote.add("AAA111", 0.9, picture(1))
    vote.add("AAA111", 0.9 + 1e-3, picture(1))
    for i in range(MAX_VIEWS + 4):
        vote.add(f"ZZZ{i:03d}", 0.99, picture(2))
    assert len(vote.views) == MAX_VIEWS and "AAA111" in vote.views  # the winner's stays
    assert vote.best_view()[0] == 0.901


def test_engine_when_a_plate_is_read_keeps_its_picture_and_flags_it_on_events() -> None:
    events = StreamEvents("drive", stream(LPR + "    snapshots: {enabled: true}\n"))
    reads = frames([("MLB803", 0.9), ("MLB803", 0.92), ("MLB803", 0.95), ("MLB803", 0.91)])
    for i, found in enumerate(reads):
        found.text_views[0] = picture(10 * (i + 1))
    changes = [events.update(T0 + i / 10, d, np.zeros((480, 640, 3), np.uint8))
               for i, d in enumerate(reads)]
    changes.append(events.update(T0 + 2.0, Detections.empty()))  # gone
    published = [e for c in changes for e in c.events]
    for event in published:
        jsonschema.validate(event, EVENT)
    assert published[0]["after"]["has_plate_snapshot"] is True
    assert published[-1]["type"] == "end" and published[-1]["after"]["has_plate_snapshot"]
    kept = [(i, jpeg) for i, c in enumerate(changes) for jpeg in c.plate_snapshots.values()]
    assert [i for i, _ in kept] == [1, 2]  # announced with its best read; its better one
    shown = cv2.imdecode(np.frombuffer(kept[-1][1], np.uint8), cv2.IMREAD_COLOR)
    assert shown.shape == (20, 60, 3) and abs(int(shown.mean()) - 30) <= 2  # the 0.95 read


def test_engine_when_snapshots_are_off_takes_no_plate_picture() -> None:
    events = StreamEvents("drive", stream(LPR + "    snapshots: {enabled: false}\n"))
    reads = frames([("MLB803", 0.9)] * 3)
    for found in reads:
        found.text_views[0] = picture(7)
    changes = [events.update(T0 + i / 10, d, np.zeros((480, 640, 3), np.uint8))
               for i, d in enumerate(reads)]
    assert not any(c.plate_snapshots for c in changes)
    assert next(e for c in changes for e in c.events)["after"]["has_plate_snapshot"] is False


def test_vote_when_the_view_is_a_whole_cars_crop_keeps_it_bounded() -> None:
    """A text cascade on whole cars reads the car's crop: the picture kept is shrunk to
    MAX_VIEW_SIDE on its longest side (8 full-size crops an object would be megabytes); a
    plate-sized view is kept as it is (a copy)."""
    vote = PlateVote(LprConfig(enabled=True, min_score=0.5))
    car = np.full((500, 900, 3), 90, np.uint8)
    vote.add("MLB803", 0.9, car)
    best = vote.best_view()
    assert best is not None and max(best[1].shape[:2]) == MAX_VIEW_SIDE
    assert best[1].shape[:2] == (178, 320) and int(best[1][5, 5, 0]) == 90
    plate = np.full((48, 160, 3), 7, np.uint8)
    vote.add("MLB803", 0.95, plate)
    best = vote.best_view()
    assert best is not None and best[1].shape == plate.shape
    assert best[1] is not plate and np.array_equal(best[1], plate)
