"""Where a frame landed in the input tensor (`edged.processing.pre.Geometry`, read through its
fields), and points in input-tensor pixels mapped back into frame pixels as the exporters' own
`scale_coords` maps them: the padding undone, divided by the ratio, clipped to the frame."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Placement(Protocol):
    @property
    def scale_x(self) -> float: ...
    @property
    def scale_y(self) -> float: ...
    @property
    def pad_x(self) -> int: ...
    @property
    def pad_y(self) -> int: ...
    @property
    def frame_size(self) -> tuple[int, int]: ...
    @property
    def tensor_size(self) -> tuple[int, int] | None: ...


def to_frame_points(points: np.ndarray, placement: Placement) -> np.ndarray:
    """[..., 2+] x, y in input-tensor pixels → frame pixels (in place on a float64 copy)."""
    out = np.array(points, np.float64)
    out[..., 0] = ((out[..., 0] - placement.pad_x) / placement.scale_x).clip(
        0, placement.frame_size[0])
    out[..., 1] = ((out[..., 1] - placement.pad_y) / placement.scale_y).clip(
        0, placement.frame_size[1])
    return out
