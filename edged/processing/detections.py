"""One frame's detections, column by column: what post-processing finds, cascades add to,
tracking reads and the MQTT edge serialises once (`rows()`), so no stage turns a list of dicts
back into arrays or mutates another stage's dicts.

Boxes and scores hold the values as published (boxes to 0.01 px, scores to 1e-5, rounded as
Python rounds the float32 the model gave), so tracking sees exactly what subscribers see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(eq=False)
class Detections:
    """N detections. `boxes` [N, 4] x1, y1, x2, y2 (frame pixels once mapped), `scores` [N],
    `classes` [N] (the model's class index), `labels` [N]; a cascade adds `sub_labels` (with
    their scores) or `attributes` per detection, tracking the object `ids` (not published with
    the frame's results). Tasks add columns: a segment model's `masks` (each the object's
    outer contour, a polygon [[x, y], ...] in frame pixels), a pose model's `keypoints`
    ({name: [x, y, score]} in frame pixels), a text cascade's `texts` (with their scores);
    None where a detection has none."""

    boxes: np.ndarray
    scores: np.ndarray
    classes: np.ndarray
    labels: list[str]
    sub_labels: list[str | None] = field(default_factory=list)
    sub_label_scores: list[float | None] = field(default_factory=list)
    attributes: list[dict[str, Any] | None] = field(default_factory=list)
    ids: list[str | None] = field(default_factory=list)
    masks: list[list[list[float]] | None] = field(default_factory=list)
    keypoints: list[dict[str, list[float]] | None] = field(default_factory=list)
    texts: list[str | None] = field(default_factory=list)  # a text cascade's reading
    text_scores: list[float | None] = field(default_factory=list)
    # Per detection: its attributes came before its sub_label (the cascades' order), so that
    # its row keeps the key order a subscriber saw when rows were dicts filled in place.
    _attributes_first: list[bool] = field(default_factory=list, repr=False)
    # A face cascade's verdict: {"name": str | None, "similarity": float, "group": int | None}
    # (a known face's name; an unknown one's group of look-alikes).
    identities: list[dict[str, Any] | None] = field(default_factory=list)
    # A text cascade's picture of what it read (the crop or the corners warped upright, BGR,
    # before pre-processing; possibly a view of the frame): never published, kept by the
    # events room as a plate's own snapshot (edged/events/plates.py).
    text_views: list[np.ndarray | None] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        n = len(self.labels)
        for name in ("sub_labels", "sub_label_scores", "attributes", "ids", "masks",
                     "keypoints", "texts", "text_scores", "identities", "text_views"):
            if not getattr(self, name):
                setattr(self, name, [None] * n)
        if not self._attributes_first:
            self._attributes_first = [False] * n

    @classmethod
    def empty(cls) -> Detections:
        return cls(np.zeros((0, 4)), np.zeros(0), np.zeros(0, np.int64), [])

    @classmethod
    def of(cls, boxes: Sequence[Sequence[float]], scores: Sequence[float],
           classes: Sequence[int], labels: Sequence[str]) -> Detections:
        """From Python floats already rounded as published."""
        return cls(np.array(boxes, np.float64).reshape(-1, 4), np.array(scores, np.float64),
                   np.array(classes, np.int64), list(labels))

    @classmethod
    def from_rows(cls, rows: Iterable[Mapping[str, Any]]) -> Detections:
        """From rows shaped as `rows()` makes them (JSON results, tests)."""
        rows = list(rows)
        found = cls.of([r["box"] for r in rows], [r["score"] for r in rows],
                       [r.get("class", 0) for r in rows], [r["label"] for r in rows])
        for i, row in enumerate(rows):
            keys = list(row)
            if "sub_label" in row:
                found.set_sub_label(i, row["sub_label"], row.get("sub_label_score"))
            if "mask" in row:
                found.masks[i] = row["mask"]
            if "keypoints" in row:
                found.keypoints[i] = row["keypoints"]
            if "text" in row:
                found.set_text(i, row["text"], row.get("text_score"))
            if "identity" in row:
                found.identities[i] = row["identity"]
            for model, results in (row.get("attributes") or {}).items():
                found.add_attributes(i, model, results)
            if "attributes" in row and "sub_label" in row:
                found._attributes_first[i] = keys.index("attributes") < keys.index("sub_label")
        return found

    def __len__(self) -> int:
        return len(self.labels)

    def __bool__(self) -> bool:
        return bool(self.labels)

    def take(self, index: Sequence[int] | np.ndarray) -> Detections:
        """The detections at `index`, in that order (a copy of each column)."""
        rows = [int(i) for i in index]
        return Detections(self.boxes[rows].reshape(-1, 4), self.scores[rows],
                          self.classes[rows], [self.labels[i] for i in rows],
                          [self.sub_labels[i] for i in rows],
                          [self.sub_label_scores[i] for i in rows],
                          [self.attributes[i] for i in rows], [self.ids[i] for i in rows],
                          [self.masks[i] for i in rows], [self.keypoints[i] for i in rows],
                          [self.texts[i] for i in rows], [self.text_scores[i] for i in rows],
                          [self._attributes_first[i] for i in rows],
                          identities=[self.identities[i] for i in rows],
                          text_views=[self.text_views[i] for i in rows])

    def set_sub_label(self, i: int, label: str, score: float | None) -> None:
        self.sub_labels[i] = label
        self.sub_label_scores[i] = score

    def set_text(self, i: int, text: str, score: float | None,
                 view: np.ndarray | None = None) -> None:
        """A text cascade's reading of detection `i`, and the picture it read (`view`)."""
        self.texts[i] = text
        self.text_scores[i] = score
        self.text_views[i] = view

    def add_attributes(self, i: int, model: str, results: Mapping[str, Any]) -> None:
        """A secondary model's results on detection `i`, under the model's name."""
        if self.attributes[i] is None:
            self.attributes[i] = {}
            self._attributes_first[i] = self.sub_labels[i] is None
        held = self.attributes[i]
        assert held is not None
        held[model] = results

    def rows(self) -> list[dict[str, Any]]:
        """The published form: one dict per detection, keys in the order subscribers know."""
        rows = []
        for i, (c, label, score, box) in enumerate(zip(
                self.classes.tolist(), self.labels, self.scores.tolist(),
                self.boxes.tolist(), strict=True)):
            row: dict[str, Any] = {"class": c, "label": label, "score": score, "box": box}
            if self.masks[i] is not None:
                row["mask"] = self.masks[i]
            if self.keypoints[i] is not None:
                row["keypoints"] = self.keypoints[i]
            if self.texts[i] is not None:
                row["text"] = self.texts[i]
                row["text_score"] = self.text_scores[i]
            if self.identities[i] is not None:
                row["identity"] = self.identities[i]
            attributes, sub_label = self.attributes[i], self.sub_labels[i]
            if attributes is not None and self._attributes_first[i]:
                row["attributes"] = attributes
            if sub_label is not None:
                row["sub_label"] = sub_label
                row["sub_label_score"] = self.sub_label_scores[i]
            if attributes is not None and not self._attributes_first[i]:
                row["attributes"] = attributes
            rows.append(row)
        return rows
