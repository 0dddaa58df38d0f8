"""Pillow's bilinear resize, ported (edged.processing.resample): the bytes Pillow 13.0.0 itself
made (sha256 pinned in tests/support/ultralytics_classify.py), shrinking and growing, both
pass orders, odd sizes; a window of the resize is that part of the whole; the reference port
(a dense weight matrix, written apart) agrees, so the classifier tests can lean on it."""

from __future__ import annotations

import numpy as np
import pytest
from support import ultralytics_classify as ref

from edged.processing import resample


@pytest.mark.parametrize("case", sorted(ref.PILLOW_DIGESTS), ids=str)
def test_resize_when_pillow_made_it_gives_pillows_bytes(
        case: tuple[int, int, int, int]) -> None:
    width, height, out_w, out_h = case
    frame = ref.pattern(width, height)
    expected = ref.PILLOW_DIGESTS[case]
    assert ref.digest(resample.resize(frame, out_w, out_h)) == expected
    assert ref.digest(ref.pil_bilinear(frame, out_w, out_h)) == expected


def test_resize_when_a_window_is_asked_gives_that_part_of_the_whole() -> None:
    rng = np.random.default_rng(3)
    for _ in range(60):
        width, height = (int(v) for v in rng.integers(1, 400, 2))
        out_w, out_h = (int(v) for v in rng.integers(1, 300, 2))
        frame = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        left, top = int(rng.integers(0, out_w)), int(rng.integers(0, out_h))
        w, h = int(rng.integers(1, out_w - left + 1)), int(rng.integers(1, out_h - top + 1))
        whole = resample.resize(frame, out_w, out_h)
        assert whole.shape == (out_h, out_w, 3)
        np.testing.assert_array_equal(resample.resize(frame, out_w, out_h, (left, top, w, h)),
                                      whole[top:top + h, left:left + w])
        np.testing.assert_array_equal(whole, ref.pil_bilinear(frame, out_w, out_h))


def test_resize_when_gray_or_the_same_size_keeps_the_channels_and_the_pixels() -> None:
    frame = ref.pattern(50, 30)
    gray = np.ascontiguousarray(frame[:, :, 1])
    np.testing.assert_array_equal(resample.resize(gray, 20, 12)[:, :, 0],
                                  resample.resize(frame, 20, 12)[:, :, 1])
    np.testing.assert_array_equal(resample.resize(frame, 50, 30), frame)
    # one side kept: only the other is resampled, and the window still cuts both
    np.testing.assert_array_equal(resample.resize(frame, 50, 15, (10, 2, 30, 10)),
                                  resample.resize(frame, 50, 15)[2:12, 10:40])


def test_coefficients_when_shrinking_widen_the_triangle_and_sum_to_one() -> None:
    first, fixed = resample.coefficients(1000, 100)  # 10x: about 20 input pixels each
    assert fixed.shape == (100, 2 * 10 + 1)
    sums = fixed.sum(axis=1)
    assert np.all(np.abs(sums - (1 << resample.PRECISION_BITS)) <= fixed.shape[1])
    assert first[0] == 0 and first[-1] + np.count_nonzero(fixed[-1]) <= 1000
