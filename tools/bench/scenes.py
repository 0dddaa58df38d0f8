"""Synthetic scenes for the events bench: detections of objects moving across a frame, with the
truth of which object each detection is, so a tracker's id changes can be counted.

`crossing`: n objects of one label whose straight paths all cross near the frame's centre at
mid-scene (the hard case for association), with box noise, missed detections, and the
farther of two overlapping objects scored low (as a detector scores a half-hidden person).
`walkers`: n objects of two labels wandering and bouncing off the borders, all in view all
the time (steady load for timing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.processing.boxes import iou_matrix

Detection = dict[str, Any]


@dataclass(frozen=True)
class Scene:
    fps: float
    width: int
    height: int
    frames: list[list[tuple[int, Detection]]]  # per frame: (true object, detection)


def _detections(rng: np.random.Generator, boxes: np.ndarray, labels: list[str],
                miss: float, noise: float) -> list[tuple[int, Detection]]:
    """One frame's detections of the true boxes: some missed, each jittered by `noise` x its
    width, the farther (higher bottom edge) of two overlapping boxes scored low."""
    overlap = iou_matrix(boxes, boxes)
    np.fill_diagonal(overlap, 0)
    out = []
    for i, box in enumerate(boxes):
        if rng.random() < miss:
            continue
        hidden = any(overlap[i, j] > 0.2 and box[3] < boxes[j, 3] for j in range(len(boxes)))
        score = rng.uniform(0.2, 0.45) if hidden else rng.uniform(0.6, 0.95)
        jitter = rng.normal(0, noise * (box[2] - box[0]), 4)
        out.append((i, {"class": 0, "label": labels[i], "score": float(score),
                        "box": [round(float(v), 2) for v in box + jitter]}))
    return out


def crossing(rng: np.random.Generator, n: int, *, frames: int = 60, fps: float = 10.0,
             miss: float = 0.1, noise: float = 0.03) -> Scene:
    width, height = 1280, 720
    duration = frames / fps
    sizes = rng.uniform(30, 60, n)
    angles = 2 * math.pi * np.arange(n) / n + rng.normal(0, 0.3, n)
    speeds = rng.uniform(60, 160, n)
    velocity = np.stack([np.cos(angles), np.sin(angles)], 1) * speeds[:, None]
    meet = np.array([width / 2, height / 2]) + rng.normal(0, 15, (n, 2))
    out = []
    for f in range(frames):
        centre = meet + velocity * (f / fps - duration / 2)
        half = np.stack([sizes / 2, sizes * 1.25], 1)
        boxes = np.concatenate([centre - half, centre + half], 1)
        out.append(_detections(rng, boxes, ["person"] * n, miss, noise))
    return Scene(fps, width, height, out)


def walkers(rng: np.random.Generator, n: int, *, frames: int = 600, fps: float = 10.0,
            noise: float = 0.02) -> Scene:
    width, height = 1920, 1080
    labels = ["person" if i % 2 == 0 else "car" for i in range(n)]
    size = np.array([[40, 100] if label == "person" else [120, 80] for label in labels], float)
    position = rng.uniform([0, 0], [width - 120, height - 100], (n, 2))
    velocity = rng.uniform(-120, 120, (n, 2))
    out = []
    for _ in range(frames):
        position += velocity / fps
        low, high = position < 0, position + size > [width, height]
        velocity[low | high] *= -1
        position = np.clip(position, 0, np.array([width, height]) - size)
        boxes = np.concatenate([position, position + size], 1)
        out.append(_detections(rng, boxes, labels, 0.0, noise))
    return Scene(fps, width, height, out)
