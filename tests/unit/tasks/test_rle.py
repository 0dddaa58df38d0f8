"""Masks as COCO run-length encoding: the polygon drawn at frame size, its column-major runs in
pycocotools' compressed string; decoded back it is the rasterised polygon bit for bit, for
polygons of every shape (seeded), and the strings are pycocotools' own for small masks whose
encoding is written out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from edged.core.errors import InvalidInput
from edged.tasks import rle
from tools.bench.masks_reference import counts_string_scalar


def test_rle_when_one_pixel_is_set_writes_cocos_string() -> None:
    bitmap = np.zeros((3, 3), bool)
    bitmap[1, 1] = True
    assert rle.runs(bitmap) == [4, 1, 4]
    assert rle.counts_string([4, 1, 4]) == "414"  # pycocotools.mask.encode gives b"414"


def test_rle_when_the_mask_starts_set_opens_with_an_empty_run() -> None:
    bitmap = np.ones((2, 2), bool)
    assert rle.runs(bitmap) == [0, 4]
    assert rle.decode({"size": [2, 2], "counts": [0, 4]}).all()


def test_rle_when_runs_are_long_or_shrink_round_trips_through_the_string() -> None:
    counts = [0, 40, 3, 1000, 2, 70000, 1, 33, 5000]
    assert rle.string_counts(rle.counts_string(counts)) == counts


@pytest.mark.parametrize("seed", range(12))
def test_rle_when_decoded_is_the_rasterised_polygon(seed: int) -> None:
    rng = np.random.default_rng(seed)
    height, width = rng.integers(20, 300, size=2).tolist()
    centre = rng.uniform([0, 0], [width, height])
    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(3, 40))))
    radii = rng.uniform(1, max(width, height) / 2, len(angles))
    polygon = np.round(np.stack([centre[0] + radii * np.cos(angles),
                                 centre[1] + radii * np.sin(angles)], 1), 1).tolist()
    encoded = rle.encode(polygon, height, width)
    assert encoded["size"] == [height, width]
    assert set(encoded["counts"]) <= {chr(c) for c in range(48, 48 + 64)}
    assert np.array_equal(rle.decode(encoded), rle.raster(polygon, height, width))


def test_rle_when_rows_are_encoded_replaces_only_their_masks() -> None:
    rows = [{"label": "a", "mask": [[1, 1], [8, 1], [8, 6]]}, {"label": "b"}]
    rle.encode_rows(rows, 10, 8)
    assert rows[0]["mask"]["size"] == [8, 10] and "mask" not in rows[1]


def test_rle_when_its_runs_do_not_fill_its_size_is_invalid() -> None:
    with pytest.raises(InvalidInput, match="not 3 x 3"):
        rle.decode({"size": [3, 3], "counts": [4, 1]})


@pytest.mark.parametrize("seed", range(40))
def test_rle_when_drawn_over_the_bounding_box_has_the_whole_frames_runs(seed: int) -> None:
    """The shortcut (the fill over the polygon's bounding box only) against the full path (the
    whole frame drawn, its runs): polygons inside, across the edges and corners, wholly
    outside, tiny, covering the frame, whole columns (a run from one column's bottom into the
    next one's top), at 0.1 px."""
    rng = np.random.default_rng(1000 + seed)
    height, width = rng.integers(1, 200, size=2).tolist()
    kind = seed % 5
    if kind == 0:  # anywhere, also beyond the frame
        points = rng.uniform([-40, -40], [width + 40, height + 40], (int(rng.integers(3, 30)), 2))
    elif kind == 1:  # tiny
        points = rng.uniform(0, 1.5, (3, 2)) + rng.uniform([0, 0], [width, height])
    elif kind == 2:  # the whole frame and more
        points = np.array([[-5, -5], [width + 5, -5], [width + 5, height + 5], [-5, height + 5]])
    elif kind == 3:  # full-height columns
        x0 = rng.uniform(0, width)
        points = np.array([[x0, 0], [x0 + rng.uniform(1, 30), 0],
                           [x0 + rng.uniform(1, 30), height], [x0, height]])
    else:  # a star about a point on the edge
        centre = np.array([rng.choice([0, width]), rng.uniform(0, height)])
        angles = np.sort(rng.uniform(0, 2 * np.pi, 24))
        radii = rng.uniform(0.5, max(width, height) / 2, 24)
        points = centre + np.stack([radii * np.cos(angles), radii * np.sin(angles)], axis=1)
    polygon = np.round(points, 1).tolist()
    expected = rle.runs(rle.raster(polygon, height, width))
    assert rle.polygon_runs(polygon, height, width) == expected
    assert sum(expected) == height * width


def test_rle_when_the_polygon_has_under_three_points_is_all_zeros() -> None:
    assert rle.polygon_runs([[1.0, 1.0], [2.0, 2.0]], 4, 5) == [20]
    assert rle.encode([], 4, 5) == {"size": [4, 5], "counts": rle.counts_string([20])}


@pytest.mark.parametrize("seed", range(8))
def test_rle_string_when_written_for_all_runs_at_once_is_the_scalar_encoders(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, [2, 40, 5000, 2_000_000, 1 << 31][seed % 5],
                          int(rng.integers(1, 400))).tolist()
    assert rle.counts_string(counts) == counts_string_scalar(counts)
    assert rle.string_counts(rle.counts_string(counts)) == counts
    assert rle.counts_string([]) == ""
