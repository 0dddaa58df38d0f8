"""Zones and lines: an object is in a zone by its anchor point, after `inertia` frames; it
remembers every zone it entered. A line counts one crossing per pass, in the direction it was
crossed, however the box jitters on it, and nothing for a pass beside its end."""

from __future__ import annotations

import numpy as np
from support.events import Box, path

from edged.events.config import LineConfig, ZoneConfig
from edged.events.geometry import inside
from edged.events.zones import LineCounts, Lines, LineState, Zones

RIGHT_HALF = [[320, 0], [640, 0], [640, 480], [320, 480]]


def observe_zones(zones: Zones, boxes: list[Box]) -> list[tuple[list[str], list[str]]]:
    """One object through frames → (current zones, entered zones) after each."""
    state = zones.new_state()
    out = []
    for box in boxes:
        zones.observe(state, zones.inside(np.array([box], float))[0].tolist())
        out.append((zones.current(state), list(state.entered)))
    return out


def crossings(lines: Lines, boxes: list[Box]) -> list[tuple[str, str]]:
    """One object through frames → every (line, direction) it crossed."""
    state: LineState = lines.new_state()
    out = []
    for box in boxes:
        (crossed,) = lines.observe([state], np.array([box], float))
        out += [(lines.names[line], direction) for line, direction in crossed]
    return out


def test_zone_when_the_anchor_stays_inside_for_inertia_frames_the_object_enters() -> None:
    zones = Zones([ZoneConfig("right", RIGHT_HALF, inertia=2)])
    walk = path((250, 100, 290, 200), (20, 0), 5)  # bottom centre x: 270, 290, 310, 330, 350
    assert observe_zones(zones, walk) == [
        ([], []), ([], []), ([], []),
        ([], []),  # the first frame inside
        (["right"], ["right"])]


def test_zone_when_the_object_leaves_it_is_no_longer_current_but_was_entered() -> None:
    zones = Zones([ZoneConfig("right", RIGHT_HALF, inertia=1),
                   ZoneConfig("top", [[0, 0], [640, 0], [640, 150], [0, 150]], inertia=1)])
    walk = [(400, 100, 440, 200), (200, 100, 240, 200), (200, 20, 240, 120)]
    assert observe_zones(zones, walk) == [
        (["right"], ["right"]), ([], ["right"]), (["top"], ["right", "top"])]


def test_zone_when_a_box_jitters_on_the_edge_inertia_keeps_it_put() -> None:
    zones = Zones([ZoneConfig("right", RIGHT_HALF, inertia=3)])
    jitter = [(300 + dx, 100, 340 + dx, 200) for dx in (-5, 5, -5, 5, -5, 5, 5, 5)]
    assert [current for current, _e in observe_zones(zones, jitter)] == [[]] * 7 + [["right"]]


def test_zone_anchor_when_centre_is_inside_but_feet_are_not_only_center_zone_has_it() -> None:
    band = [[0, 100], [640, 100], [640, 200], [0, 200]]
    zones = Zones([ZoneConfig("feet", band, inertia=1),
                   ZoneConfig("middle", band, anchor="center", inertia=1)])
    person: Box = (300, 80, 340, 240)  # centre y 160 inside, bottom y 240 below the band
    assert observe_zones(zones, [person]) == [(["middle"], ["middle"])]


def test_inside_when_the_polygon_is_concave_follows_its_outline() -> None:
    u_shape = np.array([[0, 0], [30, 0], [30, 30], [20, 30], [20, 10], [10, 10], [10, 30],
                        [0, 30]], float)
    points = np.array([[5, 20], [15, 20], [25, 20], [15, 5], [40, 5]], float)
    assert inside(points, u_shape).tolist() == [True, False, True, True, False]


def test_line_when_crossed_from_its_left_to_its_right_counts_in() -> None:
    lines = Lines([LineConfig("road", [[0, 240], [640, 240]])])  # drawn left to right
    down = path((300, 100, 340, 180), (0, 20), 10)  # feet from y 180 to 360
    up = list(reversed(down))
    assert crossings(lines, down) == [("road", "in")]
    assert crossings(lines, up) == [("road", "out")]


def test_line_when_the_box_jitters_on_it_counts_one_crossing_per_pass() -> None:
    lines = Lines([LineConfig("road", [[0, 240], [640, 240]])])
    approach = path((300, 100, 340, 180), (0, 20), 4)  # feet 180 .. 240
    jitter = [(300, 160 + dy, 340, 240 + dy) for dy in (-3, 3, -2, 4, -4, 3, -3, 2)]
    leave = path((300, 170, 340, 250), (0, 20), 5)
    assert crossings(lines, approach + jitter + leave) == [("road", "in")]


def test_line_when_an_object_turns_back_on_it_counts_nothing() -> None:
    lines = Lines([LineConfig("road", [[0, 240], [640, 240]])])
    there = path((300, 100, 340, 180), (0, 20), 4)
    assert crossings(lines, there + list(reversed(there))) == []


def test_line_when_passed_beside_its_end_counts_nothing() -> None:
    lines = Lines([LineConfig("gate", [[200, 240], [400, 240]])])
    beside = path((480, 100, 520, 180), (0, 20), 10)  # crosses y 240 at x 500
    through = path((280, 100, 320, 180), (0, 20), 10)
    assert crossings(lines, beside) == []
    assert crossings(lines, through) == [("gate", "in")]


def test_line_when_a_fast_object_jumps_across_in_one_frame_still_counts() -> None:
    lines = Lines([LineConfig("gate", [[200, 240], [400, 240]])])
    assert crossings(lines, [(280, 300, 320, 380), (280, 60, 320, 140)]) == [("gate", "out")]


def test_line_counts_when_crossed_report_the_whole_line_once() -> None:
    counts = LineCounts(["gate", "road"], ["person"])
    assert counts.take_changed() == {"gate": {"person": {"in": 0, "out": 0}},
                                     "road": {"person": {"in": 0, "out": 0}}}
    counts.add("gate", "car", "in")
    counts.add("gate", "car", "in")
    assert counts.take_changed() == {"gate": {"person": {"in": 0, "out": 0},
                                              "car": {"in": 2, "out": 0}}}
    assert counts.take_changed() == {}
