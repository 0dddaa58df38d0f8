"""A stream with `masks: rle` publishes its objects' masks in events as COCO RLE too, drawn at
the size of the frame they were found in (a held frame, without pixels, keeps the last size):
the same bitmap the polygon draws, in the events schema, in `before` as published, in the
recent events' listing; the zones still test the polygon. An empty or degenerate mask is an
empty mask's RLE, a mask that is not finite numbers leaves the event without one; neither
breaks the event. Without `masks: rle` events keep the polygon."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from support.events import T0, det, frame, stream

from edged.events.engine import StreamEvents
from edged.events.publish import EventPublisher
from edged.events.tally import RecentEvents
from edged.processing.detections import Detections
from edged.tasks import rle

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "docs" / "schemas" /
                     "events.schema.json").read_text())
SIZE = (120, 160)  # height, width
BOX = (40.0, 30.0, 100.0, 90.0)
POLYGON = [[40.0, 30.0], [100.0, 30.0], [100.0, 90.0], [40.0, 90.0]]


class Sent:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        if suffix == "events":
            self.events.append(json.loads(payload))


def run(masks: list[Any], extra: str = "masks: rle\n", sizes: list[tuple[int, int] | None]
        | None = None) -> tuple[list[dict[str, Any]], RecentEvents]:
    """One object seen in a frame per mask given (its detection carrying that mask), then
    gone; its events as published, and the recent events' listing."""
    engine = StreamEvents("door", stream(
        "track: {min_hits: 1, max_age_s: 0.2, update_interval_s: 0}\n"
        "zones: [{name: left, polygon: [[0, 0], [80, 0], [80, 120], [0, 120]], "
        "anchor: mask, inertia: 1}]\n" + extra))
    sent, recent = Sent(), RecentEvents()
    publisher = EventPublisher("door", sent, None)
    sizes = sizes or [SIZE] * len(masks)
    for i, (mask, size) in enumerate(zip(masks, sizes, strict=True)):
        found = Detections.from_rows([det(BOX, "person", mask=mask)])
        changes = engine.update(T0 + i * 0.1, found, None if size is None else frame(size))
        publisher.changes(changes)
        recent.add(changes, T0)
    changes = engine.update(T0 + 1.0, Detections.empty(), frame(SIZE))
    publisher.changes(changes)
    recent.add(changes, T0)
    for event in sent.events:
        jsonschema.validate(event, SCHEMA)
    return sent.events, recent


def test_events_when_the_stream_asks_rle_carry_each_mask_as_coco_rle_at_frame_size() -> None:
    events, recent = run([POLYGON])
    assert [e["type"] for e in events] == ["new", "end"]
    expected = rle.encode(POLYGON, *SIZE)
    for event in events:
        mask = event["after"]["mask"]
        assert mask == expected and mask["size"] == [120, 160]
        np.testing.assert_array_equal(rle.decode(mask), rle.raster(POLYGON, *SIZE))
    assert events[1]["before"]["mask"] == expected  # the object as last published
    [row] = recent.rows()
    assert row["object"]["mask"] == expected  # the events listing (/v2/edged/events)
    # the zone tested the polygon (by its mask, half of it left of x 80: entered)
    assert events[-1]["after"]["entered_zones"] == ["left"]


def test_events_without_masks_rle_keep_the_polygon() -> None:
    events, _ = run([POLYGON], extra="")
    assert all(e["after"]["mask"] == POLYGON for e in events)


def test_events_when_a_frame_has_no_pixels_draw_at_the_last_frames_size() -> None:
    """A held frame (the gate kept it from the model) repeats the last answer, no pixels."""
    moved = [[x + 10, y] for x, y in POLYGON]
    events, _ = run([POLYGON, moved], sizes=[SIZE, None])
    assert events[-1]["after"]["mask"] == rle.encode(moved, *SIZE)


def test_events_when_no_frame_ever_had_pixels_leave_the_mask_out() -> None:
    events, _ = run([POLYGON], sizes=[None])
    assert events and all("mask" not in e["after"] for e in events)


@pytest.mark.parametrize("mask", [[], [[10.0, 10.0]], [[10.0, 10.0], [50.0, 50.0]],
                                  [[500.0, 500.0], [600.0, 500.0], [600.0, 600.0]]],
                         ids=["empty", "point", "segment", "outside"])
def test_events_when_the_mask_is_empty_or_degenerate_carry_an_empty_masks_rle(
        mask: list[list[float]]) -> None:
    events, _ = run([mask])
    for event in events:
        encoded = event["after"]["mask"]
        assert encoded == {"size": [120, 160], "counts": rle.counts_string([120 * 160])}
        assert not rle.decode(encoded).any()


def test_events_when_the_mask_has_no_area_carry_what_the_results_draw() -> None:
    """Three points in a line are drawn as OpenCV fills them (a line of pixels), as the
    stream's per-frame results draw the same polygon."""
    line = [[10.0, 10.0], [20.0, 20.0], [30.0, 30.0]]
    events, _ = run([line])
    assert all(e["after"]["mask"] == rle.encode(line, *SIZE) for e in events)
    assert 0 < rle.decode(events[0]["after"]["mask"]).sum() <= 25


@pytest.mark.parametrize("mask", [[[float("nan"), 1.0], [2.0, 3.0], [4.0, 5.0]],
                                  [[1.0, 2.0, 3.0]], [["a", "b"]], [[1.0, float("inf")]] * 3])
def test_events_when_the_mask_is_not_finite_numbers_leave_it_out(mask: Any) -> None:
    events, _ = run([mask])
    assert [e["type"] for e in events] == ["new", "end"]
    assert all("mask" not in e["after"] for e in events)
