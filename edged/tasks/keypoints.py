"""Keypoints (Ultralytics pose): each kept detection's points, `kpt_shape` [K, 2 or 3] values
after its class scores (x, y in input pixels, and a visibility score the export has already
passed through its sigmoid), mapped into frame pixels as Ultralytics' `scale_coords` maps
them (padding undone, divided by the ratio, clipped to the frame), under their names."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.core.errors import InvalidModel
from edged.tasks.placement import Placement, to_frame_points

# COCO's 17 person keypoints, in the order every COCO-trained pose model writes them.
COCO_KEYPOINTS = ("nose", "left_eye", "right_eye", "left_ear", "right_ear", "left_shoulder",
                  "right_shoulder", "left_elbow", "right_elbow", "left_wrist", "right_wrist",
                  "left_hip", "right_hip", "left_knee", "right_knee", "left_ankle",
                  "right_ankle")
# A face's five landmarks, in RetinaFace's (and SCRFD's, YuNet's) order.
FACE_LANDMARKS = ("left_eye", "right_eye", "nose", "mouth_left", "mouth_right")
# Pairs of COCO keypoints drawn as a skeleton (Ultralytics' own list, 0-based).
COCO_SKELETON = ((15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6),
                 (5, 7), (6, 8), (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4),
                 (3, 5), (4, 6))

Keypoints = dict[str, list[float]]


def point_names(count: int, names: Sequence[str] | None) -> list[str]:
    """The names of `count` points: `names` when given (InvalidModel when their number is
    not the count), COCO's for 17, a face's for 5, else their index."""
    if names is not None:
        if len(names) != count:
            raise InvalidModel(f"pose: {len(names)} keypoint names for {count} keypoints")
        if len(set(names)) != len(names):
            raise InvalidModel("pose: keypoint names repeat")
        return list(names)
    if count == len(COCO_KEYPOINTS):
        return list(COCO_KEYPOINTS)
    if count == len(FACE_LANDMARKS):
        return list(FACE_LANDMARKS)
    return [str(i) for i in range(count)]


def keypoints(values: np.ndarray, kpt_shape: Sequence[int], names: Sequence[str],
              geometry: Placement | None) -> list[Keypoints]:
    """One {name: [x, y(, score)]} per detection from `values` [K, points * dims]."""
    count, dims = kpt_shape
    if values.shape[1] != count * dims:
        raise InvalidModel(f"pose: {values.shape[1]} values per detection, but kpt_shape "
                           f"{list(kpt_shape)} needs {count * dims}")
    points = values.reshape(len(values), count, dims).astype(np.float64)
    # A point the model gave no number for (NaN, inf) is a point not seen: 0, 0, score 0;
    # published JSON never carries NaN.
    lost = ~np.isfinite(points).all(axis=2)
    points[lost] = 0.0
    if geometry is not None:
        points = to_frame_points(points, geometry)
    found = []
    for row in points.tolist():
        found.append({name: [round(p[0], 1), round(p[1], 1)] + (
            [round(p[2], 4)] if dims == 3 else []) for name, p in zip(names, row, strict=True)})
    return found
