"""Face alignment: the similarity transform (rotation, uniform scale, translation) that takes a
face's five landmarks onto the embedder's template, least squares (Umeyama 1991, as
scikit-image's `SimilarityTransform.estimate`, which InsightFace's `face_align.norm_crop`
calls), and the crop it warps out of the frame (`cv2.warpAffine`, bilinear, black outside),
as InsightFace makes the 112 x 112 crops ArcFace was trained on."""

from __future__ import annotations

from collections.abc import Sequence

import cv2
import numpy as np

from edged.core.errors import InvalidInput


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 2 x 3 matrix M minimising sum |M [src, 1] - dst|^2 over similarities (`src`, `dst`:
    [K, 2] points, K >= 2). InvalidInput for points that span nothing (all equal)."""
    src = np.asarray(src, np.float64)
    dst = np.asarray(dst, np.float64)
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 2 or len(src) < 2:
        raise InvalidInput(f"alignment needs matching [K, 2] points, got {src.shape} and "
                           f"{dst.shape}")
    count = len(src)
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    variance = float((src_c ** 2).sum()) / count
    if variance <= 1e-12:
        raise InvalidInput("the landmarks are all one point: no face to align")
    cov = dst_c.T @ src_c / count
    u, s, vt = np.linalg.svd(cov)
    sign = np.ones(2)
    if np.linalg.det(cov) < 0:
        sign[1] = -1
    rotation = u @ np.diag(sign) @ vt
    scale = float((s * sign).sum()) / variance
    matrix = np.empty((2, 3))
    matrix[:, :2] = scale * rotation
    matrix[:, 2] = dst_mean - scale * rotation @ src_mean
    return matrix


def apply(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The points [K, 2] moved by a 2 x 3 matrix."""
    points = np.asarray(points, np.float64)
    return points @ matrix[:, :2].T + matrix[:, 2]


def align(frame: np.ndarray, landmarks: Sequence[Sequence[float]],
          template: Sequence[Sequence[float]], size: tuple[int, int]) -> np.ndarray:
    """The face cut out of `frame` (H x W x 3) so that its `landmarks` (frame pixels) land on
    `template` in a crop of `size` (width, height). A new array (the crop is kept)."""
    matrix = similarity_transform(np.asarray(landmarks, np.float64)[:, :2],
                                  np.asarray(template, np.float64))
    return cv2.warpAffine(frame, matrix, size, flags=cv2.INTER_LINEAR,
                          borderMode=cv2.BORDER_CONSTANT, borderValue=0.0)
