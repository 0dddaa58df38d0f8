"""The live view's drawing of tasks beyond boxes: a segment model's mask tinted in its label's
colour and outlined (the pixels outside it untouched), a pose model's sure keypoints as dots
joined by COCO's skeleton (unsure ones left out), scaled with the picture; and the live view
takes them from the frame's detections."""

from __future__ import annotations

import numpy as np

from edged.processing.detections import Detections
from edged.processing.draw import LINE_COLOUR, MASK_FILL_ALPHA, Overlay, annotate, colour_of
from edged.streams.live import Seen, answer_of, masks_of, poses_of
from edged.tasks.keypoints import COCO_KEYPOINTS

SIDE = 256
TRIANGLE = [[40.0, 200.0], [128.0, 40.0], [216.0, 200.0]]


def test_annotate_when_a_mask_is_given_tints_inside_it_only() -> None:
    frame = np.full((SIDE, SIDE, 3), 100, np.uint8)
    out = annotate(frame, Overlay(masks=[("person", TRIANGLE)]))
    tint = np.array(colour_of("person")) * MASK_FILL_ALPHA + 100 * (1 - MASK_FILL_ALPHA)
    assert np.abs(out[150, 128].astype(int) - tint).max() <= 2  # inside: tinted
    assert np.array_equal(out[20, 20], frame[20, 20])  # outside: untouched
    assert np.array_equal(out[150, 10], frame[150, 10])
    small = annotate(frame, Overlay(masks=[("person", TRIANGLE)]), height=128)
    assert np.abs(small[75, 64].astype(int) - tint).max() <= 2  # scaled with the picture


def test_annotate_when_keypoints_are_given_dots_the_sure_ones_and_joins_the_skeleton() -> None:
    points = {name: [0.0, 0.0, 0.1] for name in COCO_KEYPOINTS}
    points["left_shoulder"] = [60.0, 100.0, 0.9]
    points["right_shoulder"] = [200.0, 100.0, 0.9]
    points["nose"] = [128.0, 30.0, 0.2]  # unsure: not drawn
    frame = np.zeros((SIDE, SIDE, 3), np.uint8)
    out = annotate(frame, Overlay(poses=[("person", points)]))
    assert tuple(out[100, 60]) == LINE_COLOUR
    assert tuple(out[100, 200]) == LINE_COLOUR
    assert tuple(out[100, 130]) == colour_of("person")  # the shoulders' bone
    assert not out[30, 128].any()


def test_live_view_when_the_detections_carry_masks_and_keypoints_draws_them() -> None:
    found = Detections.of([[40, 40, 216, 200], [0, 0, 10, 10]], [0.9, 0.8], [0, 0],
                          ["person", "person"])
    found.masks = [TRIANGLE, None]
    found.keypoints = [None, {"a": [1.0, 2.0, 0.9]}]
    seen = Seen(1, 0.0, np.zeros((SIDE, SIDE, 3), np.uint8), {"detections": found}, None)
    assert masks_of(seen) == [("person", TRIANGLE)]
    assert poses_of(seen) == [("person", {"a": [1.0, 2.0, 0.9]})]


def test_answer_of_when_a_recogniser_read_text_says_it_in_the_corner() -> None:
    assert answer_of({"text": {"text": "A12345", "score": 0.98}}) == "'A12345' 0.98"
    assert answer_of({"classes": [{"index": 0, "label": "red", "score": 1.0}]}) == "red 1.00"
    assert answer_of({"detections": []}) is None
