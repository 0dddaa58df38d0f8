"""Plane geometry in frame pixels (x right, y down) for zones and lines: boxes' anchor points,
which side of a directed line a point is on, whether two segments meet, whether points are
inside a polygon, and whether a polygon crosses itself (the config checks it)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Point = Sequence[float]


def anchors(boxes: np.ndarray, anchor: str) -> np.ndarray:
    """[N, 4] boxes (x1, y1, x2, y2) → [N, 2] points: the bottom centre (where a person's feet
    or a car's wheels touch the ground) or the centre."""
    x = (boxes[:, 0] + boxes[:, 2]) * 0.5
    y = boxes[:, 3] if anchor == "bottom_center" else (boxes[:, 1] + boxes[:, 3]) * 0.5
    return np.stack([x, y], axis=1)


def mask_centroid(mask: np.ndarray) -> np.ndarray | None:
    """A mask polygon's ([M, 2] frame pixels) centre of mass: the area centroid of the
    polygon (the shoelace moments; supervision's `Position.CENTER_OF_MASS` takes the mean of
    the mask's pixels, the same point up to the raster). None for a polygon without area."""
    x, y = mask[:, 0], mask[:, 1]
    x2, y2 = np.roll(x, -1), np.roll(y, -1)
    step = x * y2 - x2 * y
    area = step.sum() * 0.5
    if len(mask) < 3 or abs(area) < 1e-9:
        return None
    return np.array([((x + x2) * step).sum(), ((y + y2) * step).sum()]) / (6.0 * area)


def mask_anchors(boxes: np.ndarray, masks: Sequence[Sequence[Sequence[float]] | None] | None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """[N, 4] boxes and the objects' mask polygons → [N, 2] points: each mask's centre of
    mass, or its box's bottom centre where it has no mask (or one without area); and [N]
    bool: which points are a mask's."""
    points = anchors(boxes, "bottom_center")
    found = np.zeros(len(boxes), bool)
    for i, mask in enumerate(masks or ()):
        if mask is not None and len(mask) >= 3:
            centre = mask_centroid(np.asarray(mask, np.float64))
            if centre is not None:
                points[i], found[i] = centre, True
    return points, found


def cross(o: Point, a: Point, b: Point) -> float:
    """z of (a - o) x (b - o): > 0 when b is right of o→a as seen on the screen (y down)."""
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def segments_meet(p: Point, q: Point, a: Point, b: Point) -> bool:
    """Whether segment pq and segment ab share a point (touching counts)."""
    d1, d2 = cross(a, b, p), cross(a, b, q)
    d3, d4 = cross(p, q, a), cross(p, q, b)
    if ((d1 > 0 > d2) or (d1 < 0 < d2)) and ((d3 > 0 > d4) or (d3 < 0 < d4)):
        return True
    return ((d1 == 0 and _on_segment(a, b, p)) or (d2 == 0 and _on_segment(a, b, q))
            or (d3 == 0 and _on_segment(p, q, a)) or (d4 == 0 and _on_segment(p, q, b)))


def _on_segment(a: Point, b: Point, p: Point) -> bool:
    """p, known to be on the line ab, lies between a and b."""
    return (min(a[0], b[0]) <= p[0] <= max(a[0], b[0])
            and min(a[1], b[1]) <= p[1] <= max(a[1], b[1]))


def self_intersection(polygon: Sequence[Point]) -> tuple[int, int] | None:
    """The first pair of edges (by index, edge i runs from point i to point i+1) that meet
    where they should not, or None for a simple polygon. O(n²): polygons have few points."""
    n = len(polygon)
    edges = [(polygon[i], polygon[(i + 1) % n]) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            adjacent = j == i + 1 or (i == 0 and j == n - 1)
            (p, q), (a, b) = edges[i], edges[j]
            if adjacent:
                # Neighbours share a point; they cross only when they fold back onto each other.
                shared, far_i, far_j = (q, p, b) if j == i + 1 else (p, q, a)
                if cross(shared, far_i, far_j) == 0 and _folds_back(shared, far_i, far_j):
                    return i, j
            elif segments_meet(p, q, a, b):
                return i, j
    return None


def _folds_back(shared: Point, u: Point, v: Point) -> bool:
    """Collinear u and v seen from `shared` point the same way (the edges overlap)."""
    return (u[0] - shared[0]) * (v[0] - shared[0]) + (u[1] - shared[1]) * (v[1] - shared[1]) > 0


MASK_RASTER = 64  # the longer side a mask is drawn at to measure its share in a zone


def mask_share(mask: np.ndarray, polygon: np.ndarray) -> float:
    """The share of a mask polygon's area inside a zone polygon (both [M, 2] frame pixels),
    both drawn on a raster over the mask's bounding box, its longer side MASK_RASTER cells."""
    import cv2

    low, high = mask.min(axis=0), mask.max(axis=0)
    scale = MASK_RASTER / max(float((high - low).max()), 1.0)
    size = np.maximum(np.ceil((high - low) * scale).astype(int) + 1, 1)
    canvas = np.zeros((size[1], size[0]), np.uint8)

    def cells(points: np.ndarray) -> np.ndarray:
        return np.round((points - low) * scale).astype(np.int32).reshape(-1, 1, 2)

    cv2.fillPoly(canvas, [cells(mask)], 1)
    area = int(canvas.sum())
    if not area:
        return 0.0
    zone = np.zeros_like(canvas)
    cv2.fillPoly(zone, [cells(polygon)], 1)
    return float((canvas & zone).sum()) / area


def inside(points: np.ndarray, polygon: np.ndarray) -> np.ndarray:
    """[N, 2] points, [M, 2] polygon → [N] bool: inside by the even-odd rule (ray casting),
    every point against every edge at once."""
    x, y = points[:, :1], points[:, 1:]  # [N, 1] against [M] edges
    x1, y1 = polygon[:, 0], polygon[:, 1]
    x2, y2 = np.roll(x1, -1), np.roll(y1, -1)
    straddles = (y1 > y) != (y2 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_at_y = x1 + (y - y1) * (x2 - x1) / (y2 - y1)
    crossings = np.count_nonzero(straddles & (x < x_at_y), axis=1)
    return (crossings % 2) == 1


def sides(points: np.ndarray, p1: np.ndarray, p2: np.ndarray, band: np.ndarray) -> np.ndarray:
    """[N, 2] points → [N] int8: +1 right of p1→p2 (as seen on the screen), -1 left, 0 within
    `band` ([N] pixels) of the line (on it, for hysteresis)."""
    direction = p2 - p1
    distance = (direction[0] * (points[:, 1] - p1[1]) - direction[1] * (points[:, 0] - p1[0])
                ) / float(np.hypot(direction[0], direction[1]))
    out = np.zeros(len(points), np.int8)
    out[distance > band] = 1
    out[distance < -band] = -1
    return out


def paths_meet(starts: np.ndarray, ends: np.ndarray, p1: np.ndarray,
               p2: np.ndarray) -> np.ndarray:
    """[N, 2] path starts and ends → [N] bool: the path start→end shares a point with the
    segment p1p2 itself (not its infinite extension)."""
    d1, d2 = _z(p1, p2, starts), _z(p1, p2, ends)
    d3, d4 = _z(starts, ends, p1), _z(starts, ends, p2)
    meet = (d1 * d2 <= 0) & (d3 * d4 <= 0)
    collinear = (d1 == 0) & (d2 == 0)  # a path along the line: it must overlap the segment
    if collinear.any():
        s, e = starts[collinear], ends[collinear]
        meet[collinear] = _between(p1, p2, s) | _between(p1, p2, e) | _between(s, e, p1)
    return meet


def _z(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """cross() of points or rows of points."""
    return (a[..., 0] - o[..., 0]) * (b[..., 1] - o[..., 1]) - \
        (a[..., 1] - o[..., 1]) * (b[..., 0] - o[..., 0])


def _between(a: np.ndarray, b: np.ndarray, p: np.ndarray) -> np.ndarray:
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return np.all((lo <= p) & (p <= hi), axis=-1)
