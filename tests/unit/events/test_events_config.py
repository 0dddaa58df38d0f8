"""The events keys of a stream: all optional with working defaults; a zone, line or label that
cannot work is a ConfigError naming its key path and line."""

from __future__ import annotations

import pytest
from support.events import stream

from edged.config import parse_config
from edged.core.errors import ConfigError
from edged.events.config import (
    LineConfig,
    PublishConfig,
    SnapshotsConfig,
    TrackConfig,
    ZoneConfig,
    check_labels,
)


def errors_of(keys: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        stream(keys)
    return [str(issue) for issue in caught.value.issues]


def test_events_config_when_absent_uses_the_defaults() -> None:
    cfg = stream()
    assert cfg.track == TrackConfig(iou_threshold=0.3, max_age_s=1.0, min_hits=2, max_tracks=64,
                                    update_interval_s=1.0, high_score=0.5)
    assert (cfg.labels, cfg.min_score, cfg.zones, cfg.lines) == ([], 0.0, [], [])
    assert cfg.snapshots == SnapshotsConfig(enabled=True, jpeg_quality=80, crop=True,
                                            draw_box=True, max_height=360)
    assert cfg.publish == PublishConfig(frames=None, events=True)  # frames: by model kind


def test_events_config_when_written_as_the_design_shows_reads_every_key() -> None:
    text = """streams:
  - name: door
    source: rtsp://10.0.0.5/stream1
    model: detector
    track: {iou_threshold: 0.3, max_age_s: 1.0, min_hits: 2}
    labels: [person, car]
    min_score: 0.5
    zones:
      - {name: entrance, polygon: [[320, 0], [640, 0], [640, 480], [320, 480]]}
    lines:
      - {name: gate, points: [[320, 0], [320, 480]]}
    secondary:
      - {model: plate_reader, labels: [car], as: sub_label}
    snapshots: {enabled: true, jpeg_quality: 80}
    publish: {frames: false, events: true}
"""
    cfg = parse_config(text).streams[0]
    assert cfg.zones == [ZoneConfig("entrance", [[320, 0], [640, 0], [640, 480], [320, 480]])]
    assert cfg.lines == [LineConfig("gate", [[320, 0], [320, 480]])]
    assert cfg.labels == ["person", "car"] and cfg.min_score == 0.5
    assert cfg.secondary[0].model == "plate_reader"
    assert cfg.publish == PublishConfig(frames=False, events=True)


def test_events_config_when_a_zone_has_two_points_names_the_polygon_and_line() -> None:
    assert errors_of("""
        zones:
          - name: a
            polygon: [[0, 0], [10, 10]]
    """) == ["streams[0].zones[0].polygon: needs at least 3 points, got 2 (line 7)"]


def test_events_config_when_points_are_out_of_range_says_which() -> None:
    errors = errors_of("""
        zones: [{name: a, polygon: [[0, 0], [-5, 10], [10, 10]]}]
        lines: [{name: b, points: [[0, 0], [200000, 5]]}]
    """)
    assert errors == [
        "streams[0].zones[0].polygon: point 1 [-5.0, 10.0] is outside 0..100000 "
        "(frame pixels) (line 5)",
        "streams[0].lines[0].points: point 1 [200000.0, 5.0] is outside 0..100000 "
        "(frame pixels) (line 6)"]


def test_events_config_when_a_line_has_zero_length_or_three_points_rejects_it() -> None:
    errors = errors_of("""
        lines:
          - {name: a, points: [[5, 5], [5, 5]]}
          - {name: b, points: [[0, 0], [5, 5], [9, 9]]}
    """)
    assert errors == [
        "streams[0].lines[0].points: the line has zero length (line 6)",
        "streams[0].lines[1].points: a line is 2 points [[x1, y1], [x2, y2]], got 3 (line 7)"]


def test_events_config_when_a_polygon_crosses_itself_names_the_edges() -> None:
    bow_tie = "[[0, 0], [100, 100], [100, 0], [0, 100]]"
    assert errors_of(f"zones: [{{name: a, polygon: {bow_tie}}}]") == [
        "streams[0].zones[0].polygon: edges 0 and 2 cross: the polygon intersects itself "
        "(line 5)"]
    (flat,) = errors_of("zones: [{name: a, polygon: [[0, 0], [5, 5], [10, 10]]}]")
    assert flat.endswith("the polygon intersects itself (line 5)")  # it folds back on itself


def test_events_config_when_names_repeat_in_a_stream_names_the_second() -> None:
    errors = errors_of("""
        labels: [person, person]
        zones:
          - {name: a, polygon: [[0, 0], [10, 0], [10, 10]]}
          - {name: a, polygon: [[0, 0], [20, 0], [20, 20]]}
        lines:
          - {name: a, points: [[0, 0], [10, 0]]}
          - {name: a, points: [[0, 0], [20, 0]]}
    """)
    assert errors == ["streams[0].zones[1].name: duplicate zone name 'a' (line 8)",
                      "streams[0].lines[1].name: duplicate line name 'a' (line 11)",
                      "streams[0].labels[1]: duplicate label 'person' (line 5)"]


def test_events_config_when_a_key_is_misspelt_or_bad_names_its_path() -> None:
    errors = errors_of("""
        track: {iou_treshold: 0.3, min_hits: 0}
        zones: [{name: "a/b", polygon: [[0, 0], [10, 0], [10, 10]], anchor: top}]
        snapshots: {jpeg_quality: 101}
    """)
    assert errors == [
        "streams[0].track.iou_treshold: unknown key (did you mean 'iou_threshold'?) (line 5)",
        "streams[0].track.min_hits: must be between 1 and 100, got 0 (line 5)",
        "streams[0].zones[0].name: 'a/b' is not a valid name ([A-Za-z0-9_.-]) (line 6)",
        "streams[0].zones[0].anchor: expected one of 'bottom_center', 'center', 'mask', got 'top' "
        "(line 6)",
        "streams[0].snapshots.jpeg_quality: must be between 1 and 100, got 101 (line 7)"]


def test_check_labels_when_the_model_lacks_a_label_names_it_and_the_choices() -> None:
    check_labels(["person", "car"], ["person", "bicycle", "car"], path="streams[0]")
    with pytest.raises(ConfigError) as caught:
        check_labels(["person", "cat"], ["person", "car"], path="streams[2]")
    assert [str(i) for i in caught.value.issues] == [
        "streams[2].labels[1]: the model has no label 'cat' (person, car)"]
