"""Lines that follow a segment model's mask (`anchor: mask`): the path followed is the mask's
centre of mass (the polygon's area centroid, supervision's CENTER_OF_MASS), not a point of
the box; an object without a mask is followed by its bottom centre, as zones fall back."""

from __future__ import annotations

import numpy as np
import pytest

from edged.config import parse_config
from edged.events.config import LineConfig
from edged.events.geometry import mask_anchors, mask_centroid
from edged.events.zones import Lines, LineState

# A short gate: x = 100 from y 0 to 100. The object is tall: its box reaches y 150, below the
# gate's end, while its mask's body (a wide top, a thin leg) sits at the gate's height.
GATE = [[100, 100], [100, 0]]  # drawn upwards: moving right is "in"


def body(x: float) -> list[list[float]]:
    """The mask at horizontal offset x: a 40 x 80 block (y 10..90) and a thin leg to y 150."""
    return [[x, 10], [x + 40, 10], [x + 40, 90], [x + 22, 90], [x + 22, 150], [x + 18, 150],
            [x + 18, 90], [x, 90]]


def box(x: float) -> list[float]:
    return [x, 10.0, x + 40.0, 150.0]


def walk(lines: Lines, xs: list[float], masked: bool = True) -> list[tuple[str, str]]:
    state: LineState = lines.new_state()
    out = []
    for x in xs:
        masks = [body(x) if masked else None]
        (crossed,) = lines.observe([state], np.array([box(x)]), masks)
        out += [(lines.names[line], direction) for line, direction in crossed]
    return out


def test_mask_centroid_when_the_polygon_has_area_is_its_centre_of_mass() -> None:
    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], float)
    np.testing.assert_allclose(mask_centroid(square), [5, 5])
    np.testing.assert_allclose(mask_centroid(square[::-1]), [5, 5])  # either winding
    triangle = np.array([[0, 0], [9, 0], [0, 9]], float)
    np.testing.assert_allclose(mask_centroid(triangle), [3, 3])
    # the block outweighs the leg: the centre is high in the box, not at its middle
    centre = mask_centroid(np.array(body(0.0)))
    assert centre is not None and 50 < centre[1] < 60 and centre[0] == pytest.approx(20)
    assert mask_centroid(np.array([[0, 0], [5, 5], [9, 9]], float)) is None  # no area


def test_mask_anchors_when_an_object_has_no_mask_take_its_bottom_centre() -> None:
    boxes = np.array([box(0.0), box(100.0)])
    points, found = mask_anchors(boxes, [body(0.0), None])
    assert points[1].tolist() == [120.0, 150.0]
    assert points[0][1] < 60 and found.tolist() == [True, False]


def test_line_anchored_on_the_mask_when_a_frame_lacks_the_mask_moves_its_centre_with_the_box(
        ) -> None:
    """A frame without the mask must not drop the point to the box's foot (y 150, below the
    gate's end: the body would 'leave' the gate's reach): its last centre moves with the box."""
    lines = Lines([LineConfig("gate", GATE, anchor="mask")])
    state: LineState = lines.new_state()
    out = []
    for x in [float(x) for x in range(20, 140, 10)]:
        masks = [body(x) if x < 60 or x > 100 else None]  # lost while it passes the gate
        (crossed,) = lines.observe([state], np.array([box(x)]), masks)
        out += crossed
    assert out == [(0, "in")]
    assert state.mask_offset is not None and state.mask_offset[1] < -90


def test_line_anchored_on_the_mask_when_the_body_passes_the_gate_counts_it() -> None:
    xs = [float(x) for x in range(20, 140, 10)]
    by_mask = Lines([LineConfig("gate", GATE, anchor="mask")])
    by_point = Lines([LineConfig("gate", GATE)])
    assert walk(by_mask, xs) == [("gate", "in")]
    # the box's bottom centre passes below the gate's end: it crossed nothing
    assert walk(by_point, xs) == []
    assert walk(by_mask, xs[::-1]) == [("gate", "out")]


def test_line_anchored_on_the_mask_when_an_object_has_none_follows_its_bottom_centre() -> None:
    low_gate = Lines([LineConfig("gate", [[100, 200], [100, 100]], anchor="mask")])
    xs = [float(x) for x in range(20, 140, 10)]
    assert walk(low_gate, xs, masked=False) == [("gate", "in")]
    assert walk(low_gate, xs) == []  # with its mask, the body passes above this one


def test_line_anchored_on_the_mask_when_the_mask_jitters_on_the_gate_counts_once() -> None:
    lines = Lines([LineConfig("gate", GATE, anchor="mask")])
    # the centre of mass at x 20 + offset: 78, 98, 102, 97, 103, 99, 101, 125
    xs = [58.0, 78.0, 82.0, 77.0, 83.0, 79.0, 81.0, 105.0]
    assert walk(lines, xs) == [("gate", "in")]


def test_line_config_when_anchored_on_the_mask_parses() -> None:
    text = ("streams:\n  - {name: s, source: 'file:///x.avi', model: m,\n"
            "     lines: [{name: gate, points: [[0, 0], [9, 9]], anchor: mask}]}\n")
    [stream] = parse_config(text).streams
    assert stream.lines[0].anchor == "mask"
