"""Face alignment: the similarity transform takes five landmarks onto ArcFace's template, as
InsightFace's `estimate_norm` (scikit-image's Umeyama) does, and the warped crop puts the
face's features where the template says."""

from __future__ import annotations

import numpy as np
import pytest

from edged.core.errors import InvalidInput
from edged.galleries.config import ARCFACE_TEMPLATE
from edged.tasks.align import align, apply, similarity_transform

TEMPLATE = np.array(ARCFACE_TEMPLATE)


def _moved(points: np.ndarray, angle: float, scale: float, shift: tuple[float, float]
           ) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return scale * points @ np.array([[c, s], [-s, c]]) + np.array(shift)


@pytest.mark.parametrize(("angle", "scale", "shift"), [(0.0, 1.0, (0, 0)),
                                                        (0.4, 2.5, (310.0, 122.0)),
                                                        (-1.2, 0.6, (12.5, 800.0))])
def test_similarity_transform_when_landmarks_are_a_moved_template_maps_them_onto_it(
        angle: float, scale: float, shift: tuple[float, float]) -> None:
    landmarks = _moved(TEMPLATE, angle, scale, shift)
    matrix = similarity_transform(landmarks, TEMPLATE)
    assert np.abs(apply(matrix, landmarks) - TEMPLATE).max() < 1e-6


def test_similarity_transform_when_landmarks_are_noisy_is_the_least_squares_fit() -> None:
    rng = np.random.default_rng(0)
    landmarks = _moved(TEMPLATE, 0.3, 1.7, (40, 60)) + rng.normal(0, 1.0, (5, 2))
    matrix = similarity_transform(landmarks, TEMPLATE)
    residual = np.abs(apply(matrix, landmarks) - TEMPLATE).max()
    assert residual < 2.0  # within the noise (1 px in a 1.7x larger face)
    # Least squares over similarities [[a, -b, tx], [b, a, ty]]: every step along a, b,
    # tx, ty from the fit grows the squared error.
    a, b, tx, ty = matrix[0, 0], matrix[1, 0], matrix[0, 2], matrix[1, 2]
    assert abs(matrix[1, 1] - a) < 1e-9 and abs(matrix[0, 1] + b) < 1e-9

    def error(p: np.ndarray) -> float:
        m = np.array([[p[0], -p[1], p[2]], [p[1], p[0], p[3]]])
        return float(((apply(m, landmarks) - TEMPLATE) ** 2).sum())

    best = np.array([a, b, tx, ty])
    for step in np.vstack([np.eye(4), -np.eye(4)]) * 1e-3:
        assert error(best + step) > error(best)


def test_similarity_transform_when_every_point_is_one_refuses() -> None:
    with pytest.raises(InvalidInput, match="one point"):
        similarity_transform(np.ones((5, 2)), TEMPLATE)


def test_align_when_dots_mark_the_landmarks_puts_them_on_the_template() -> None:
    frame = np.zeros((480, 640, 3), np.uint8)
    landmarks = _moved(TEMPLATE, 0.5, 2.0, (300.0, 100.0))
    for x, y in landmarks:
        frame[round(y) - 2:round(y) + 3, round(x) - 2:round(x) + 3] = 255
    crop = align(frame, landmarks, TEMPLATE, (112, 112))
    assert crop.shape == (112, 112, 3)
    for x, y in TEMPLATE:  # each dot's centre lands within a pixel of its template point
        window = crop[int(y) - 3:int(y) + 4, int(x) - 3:int(x) + 4, 0].astype(float)
        ys, xs = np.nonzero(window > 64)
        assert len(xs), (x, y)
        centre = np.array([xs.mean() + int(x) - 3, ys.mean() + int(y) - 3])
        assert np.abs(centre - [x, y]).max() < 1.0
