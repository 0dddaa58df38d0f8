"""Zones that test a segment model's mask (`anchor: mask`): an object is in the zone when at
least `min_overlap` of its mask's area is, whatever its box's bottom centre says; an object
without a mask falls back to the bottom centre; the share is measured on a raster of the
mask's bounding box."""

from __future__ import annotations

import numpy as np
import pytest

from edged.config import parse_config
from edged.core.errors import ConfigError
from edged.events.config import ZoneConfig
from edged.events.geometry import mask_share
from edged.events.zones import Zones

ZONE = [[0, 0], [100, 0], [100, 100], [0, 100]]
# a tall object whose box reaches down out of the zone (bottom centre at y 140), but whose
# mask is mostly inside it: a person leaning over a counter
MASK = [[40, 10], [80, 10], [80, 90], [62, 140], [58, 140], [40, 90]]
BOX = np.array([[40.0, 10.0, 80.0, 140.0]])


def test_mask_share_when_polygons_overlap_measures_the_masks_share_inside() -> None:
    assert mask_share(np.array(MASK, float), np.array(ZONE, float)) == pytest.approx(0.83,
                                                                                     abs=0.03)
    square = np.array([[0, 0], [10, 0], [10, 10], [0, 10]], float)
    assert mask_share(square, square + np.array([5, 0])) == pytest.approx(0.5, abs=0.06)
    assert mask_share(square, square + np.array([50, 50])) == 0.0


def test_zone_when_anchored_on_the_mask_takes_the_object_the_box_point_would_not() -> None:
    by_point = Zones([ZoneConfig("counter", ZONE)])
    by_mask = Zones([ZoneConfig("counter", ZONE, anchor="mask")])
    assert by_point.inside(BOX, [MASK]).tolist() == [[False]]
    assert by_mask.inside(BOX, [MASK]).tolist() == [[True]]
    strict = Zones([ZoneConfig("counter", ZONE, anchor="mask", min_overlap=0.95)])
    assert strict.inside(BOX, [MASK]).tolist() == [[False]]


def test_zone_anchored_on_the_mask_when_an_object_has_none_tests_its_bottom_centre() -> None:
    zones = Zones([ZoneConfig("counter", ZONE, anchor="mask")])
    inside_box = np.array([[10.0, 10.0, 50.0, 90.0]])
    assert zones.inside(np.concatenate([BOX, inside_box]), [None, None]).tolist() == [
        [False], [True]]
    assert zones.inside(inside_box).tolist() == [[True]]


def test_zone_config_when_min_overlap_is_out_of_range_names_the_key() -> None:
    text = ("streams:\n  - {name: s, source: 'file:///x.avi', model: m,\n"
            "     zones: [{name: z, polygon: [[0, 0], [9, 0], [9, 9]], anchor: mask, "
            "min_overlap: 0}]}\n")
    with pytest.raises(ConfigError) as caught:
        parse_config(text)
    assert caught.value.issues[0].path == "streams[0].zones[0].min_overlap"
