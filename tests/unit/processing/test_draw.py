"""The live view's drawing: boxes in their label's colour around the object, zones tinted and
outlined, lines with the arrow on their `in` side, scaled pictures, and the frame itself never
written to."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edged.processing.draw import (
    LINE_COLOUR,
    PALETTE,
    ZONE_COLOUR,
    Box,
    Overlay,
    annotate,
    box_text,
    colour_of,
    encode_jpeg,
    short_id,
)

SIDE = 256


def close_to(pixel: np.ndarray, colour: tuple[int, int, int], tolerance: int = 40) -> bool:
    return bool(np.abs(pixel.astype(int) - np.array(colour)).max() <= tolerance)


def square_frame() -> np.ndarray:
    frame = np.zeros((SIDE, SIDE, 3), np.uint8)
    frame[64:128, 64:128] = (0, 0, 255)  # a red square, as the demo's
    return frame


def test_colour_of_when_the_demo_labels_is_stable_and_none_of_their_primaries() -> None:
    for label in ("red", "green", "blue", "person", "car"):
        assert colour_of(label) == colour_of(label)
        assert colour_of(label) in PALETTE
    primaries = {(0, 0, 255), (0, 255, 0), (255, 0, 0)}
    assert not primaries & set(PALETTE)


def test_annotate_when_a_box_is_given_draws_it_in_the_label_colour_around_the_object() -> None:
    frame = square_frame()
    before = frame.copy()
    out = annotate(frame, Overlay(boxes=[Box((64, 64, 128, 128), "red", 0.97, "1.0-cam-3")]))
    assert np.array_equal(frame, before), "the frame itself is never drawn on"
    colour = colour_of("red")
    # The box's edge, where the raw frame is black just outside the square.
    for y, x in ((96, 63), (96, 129), (130, 96)):
        assert close_to(out[y, x], colour), (y, x, out[y, x])
    # The square's middle is the square still.
    assert close_to(out[96, 96], (0, 0, 255), 5)


def test_annotate_when_zones_and_lines_are_given_tints_the_zone_and_draws_the_line() -> None:
    frame = np.zeros((SIDE, SIDE, 3), np.uint8)
    out = annotate(frame, Overlay(
        zones=[("right", [[128, 0], [256, 0], [256, 256], [128, 256]])],
        lines=[("middle", [[64, 256], [64, 0]])]))
    inside, outside = out[200, 200], out[200, 30]
    assert inside.any() and not outside.any(), (inside, outside)
    assert np.argmax(inside) == np.argmax(ZONE_COLOUR)  # tinted towards the zone's colour
    assert close_to(out[150, 64], LINE_COLOUR, 10)


def test_annotate_when_a_line_points_up_puts_its_arrow_on_the_right() -> None:
    """p1 at the bottom, p2 at the top: crossing left to right is `in`, so the arrow from the
    line's middle points right."""
    frame = np.zeros((SIDE, SIDE, 3), np.uint8)
    out = annotate(frame, Overlay(lines=[("gate", [[128, 256], [128, 0]])]))
    red = np.all(np.abs(out.astype(int) - np.array(LINE_COLOUR)) <= 30, axis=2)
    right, left = red[120:136, 134:160].sum(), red[120:136, 96:122].sum()
    assert right > 10 and left == 0, (right, left)


def test_annotate_when_a_height_is_given_scales_down_and_never_up() -> None:
    frame = square_frame()
    small = annotate(frame, Overlay(boxes=[Box((64, 64, 128, 128), "red", 0.9)]), height=128)
    assert small.shape == (128, 128, 3)
    assert close_to(small[48, 31], colour_of("red"))  # the box, at half the coordinates
    same = annotate(frame, Overlay(), height=1024)
    assert same.shape == frame.shape


def test_annotate_when_a_corner_is_given_writes_it_on_a_darkened_panel() -> None:
    frame = np.full((SIDE, SIDE, 3), 200, np.uint8)
    out = annotate(frame, Overlay(corner=["crossing  4.0 fps", "streaming"]))
    panel = out[6:40, 6:60]
    assert (panel < 120).mean() > 0.5  # darkened
    assert (panel > 220).any()  # white text on it
    assert np.array_equal(out[200:, 200:], frame[200:, 200:])


def test_box_text_when_an_object_has_an_id_and_sub_label_shows_both() -> None:
    box = Box((0, 0, 1, 1), "car", 0.914, "1718000000.123-door-17", "ABC123")
    assert box_text(box) == "car 0.91 #17 ABC123"
    assert short_id("1718000000.123-door-17") == "#17"


@pytest.mark.parametrize("quality", [50, 90])
def test_encode_jpeg_when_given_a_picture_decodes_back_to_it(quality: int) -> None:
    frame = square_frame()
    decoded = cv2.imdecode(np.frombuffer(encode_jpeg(frame, quality), np.uint8),
                           cv2.IMREAD_COLOR)
    assert decoded.shape == frame.shape
    assert close_to(decoded[96, 96], (0, 0, 255), 20)
