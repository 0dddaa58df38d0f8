"""Typed results: a frame's `Detections` and a stream's `StreamStats` keep the published rows
subscribers know (keys, their order, the values as rounded), whatever the stages between did."""

from __future__ import annotations

import json

import numpy as np

from edged.core.states import SourceState
from edged.processing.detections import Detections
from edged.sources import SourceStats
from edged.sources.camera import CameraStats
from edged.streams.stats import EventsStats, Percentiles, StreamStats

ROWS = [{"class": 2, "label": "car", "score": 0.91234, "box": [1.5, 2.0, 30.25, 40.0]},
        {"class": 0, "label": "person", "score": 0.5, "box": [5.0, 6.0, 7.0, 8.0]}]


def test_detections_when_made_from_rows_give_the_same_rows_back() -> None:
    found = Detections.from_rows(ROWS)
    assert found.rows() == ROWS
    assert json.dumps(found.rows()) == json.dumps(ROWS)  # key order too
    assert found.boxes.shape == (2, 4) and found.classes.tolist() == [2, 0]


def test_detections_when_cascades_annotate_keep_the_order_they_added_keys_in() -> None:
    found = Detections.from_rows(ROWS)
    found.set_sub_label(0, "AB123", 0.8)
    found.add_attributes(0, "color", {"classes": []})  # after the sub_label
    found.add_attributes(1, "color", {"classes": []})  # before the sub_label
    found.set_sub_label(1, "adult", 0.7)
    first, second = found.rows()
    assert list(first) == ["class", "label", "score", "box", "sub_label", "sub_label_score",
                           "attributes"]
    assert list(second) == ["class", "label", "score", "box", "attributes", "sub_label",
                            "sub_label_score"]
    assert Detections.from_rows(found.rows()).rows() == found.rows()


def test_detections_when_tracked_carry_ids_that_the_results_do_not_publish() -> None:
    found = Detections.from_rows(ROWS)
    found.ids[1] = "1718000000.123-door-1"
    assert "id" not in found.rows()[1]
    picked = found.take([1])
    assert picked.ids == ["1718000000.123-door-1"] and picked.rows() == [ROWS[1]]


def test_detections_when_empty_publish_an_empty_list() -> None:
    assert Detections.empty().rows() == [] and not Detections.empty()
    assert Detections.from_rows([]).boxes.shape == (0, 4)


def test_stream_stats_when_published_keep_the_rows_keys_in_order() -> None:
    source = CameraStats(SourceState.STREAMING, 10, 1, 2, 0, 0, 1, "timeout", 1, "ffmpeg")
    stats = StreamStats(9, 1, 0, "frame 3 failed", source,
                        EventsStats(5, 0, Percentiles(0.25, 1.5)), Percentiles(12.0, 30.5),
                        gated=4)
    row = stats.as_dict()
    # `gated` (issue 38) is the last key: every key before it keeps its place and bytes.
    assert list(row) == ["processed", "failed", "secondary_failed", "last_error", "state",
                         "frames_in", "dropped", "skipped", "rejected", "reconnects", "errors",
                         "queue_depth", "decoder", "events_published", "events_failed",
                         "events_ms", "latency_ms", "gated"]
    assert row["gated"] == 4
    assert row["last_error"] == "timeout"  # the source's: the one key the row has for both
    assert row["events_ms"] == {"p50": 0.25, "p99": 1.5}


def test_stream_stats_when_a_sensor_without_events_leave_those_keys_out() -> None:
    source = SourceStats(SourceState.CONNECTING, 0, 0, 0, 0, 0, 0, None, 0)
    row = StreamStats(0, 0, 0, None, source).as_dict()
    assert "decoder" not in row and "events_published" not in row and "latency_ms" not in row
    assert Percentiles.of(np.array([])) is None
