"""How far two versions of a model agree on the same inputs, in the model's own kind: top-1
agreement for classifiers, box matching (IoU >= 0.5 F1, and label agreement of the matched
boxes) for detectors, cosine and error statistics for every floating-point output.

The INT8 gate (`edged quantize`, edged/ops/quantize/quantize.py: FP32 against INT8 on
held-out samples) and the shadow run of an OTA candidate (edged/ota/shadow.py: serving against
candidate on live inputs) share these measures; `Agreement` takes one sample at a time (a
shadow keeps no outputs), and `compare` is it over a list.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edged.model.config import QuantizationConfig
from edged.model.int8_report import Check
from edged.model.repository import ModelVersion
from edged.processing.boxes import iou_matrix

Outputs = dict[str, np.ndarray]  # one sample's outputs, batch dim removed
Metrics = dict[str, float | None]
BOX_IOU = 0.5  # a candidate box matches a reference box at this overlap or more


def classify_output(model: ModelVersion) -> str | None:
    """The output whose argmax is the class: `postprocess: {kind: classify}`'s output, or the
    only output when it is [N, C]. None for every other model."""
    post = model.config.postprocess
    if post is not None and post.kind == "classify":
        return post.output or model.outputs[0].name
    if len(model.outputs) == 1 and model.max_batch_size > 0:
        out = model.outputs[0]
        if len(out.shape) == 2 and out.shape[1] != 1 and np.issubdtype(out.dtype, np.floating):
            return out.name
    return None


def flat(outputs: Outputs) -> np.ndarray:
    """Every floating-point output of one sample, flattened and concatenated (by name)."""
    parts = [np.asarray(v, np.float64).ravel() for _, v in sorted(outputs.items())
             if np.issubdtype(np.asarray(v).dtype, np.floating)]
    return np.concatenate(parts) if parts else np.zeros(0)


def match_boxes(ref_boxes: np.ndarray, ref_classes: np.ndarray, boxes: np.ndarray,
                classes: np.ndarray, iou: float = BOX_IOU) -> tuple[int, int]:
    """Greedy one-to-one matching, best overlap first, of candidate boxes to reference boxes
    at `iou` or more. Returns (matched pairs, of which with the same class)."""
    if not len(ref_boxes) or not len(boxes):
        return 0, 0
    overlaps = iou_matrix(np.asarray(ref_boxes, np.float64), np.asarray(boxes, np.float64))
    pairs = np.argwhere(overlaps >= iou)
    order = np.argsort(-overlaps[pairs[:, 0], pairs[:, 1]], kind="stable")
    used_ref: set[int] = set()
    used: set[int] = set()
    matched = same = 0
    for i, j in pairs[order].tolist():
        if i in used_ref or j in used:
            continue
        used_ref.add(i)
        used.add(j)
        matched += 1
        same += int(ref_classes[i] == classes[j])
    return matched, same


class Agreement:
    """The measures, one sample at a time: `add` a reference's outputs and the other's (and,
    for detectors, both decoded box sets); `metrics()` whenever."""

    def __init__(self, classify: str | None = None) -> None:
        self.classify = classify
        self.samples = 0
        self._max_abs = 0.0
        self._sum_abs = 0.0
        self._values = 0
        self._sq_diff = 0.0
        self._sq_ref = 0.0
        self._cos_sum = 0.0
        self._cos_min = 1.0
        self._top1_same = 0
        self._labelled = 0
        self._ref_right = 0
        self._other_right = 0
        self._ref_boxes = self._boxes = self._box_matched = self._box_same = 0
        self._box_samples = 0

    def add(self, ref: Outputs, other: Outputs, *, label: int | None = None) -> None:
        a, b = flat(ref), flat(other)
        if a.shape != b.shape:
            raise ValueError(f"outputs differ in size: {a.size} and {b.size} values")
        self.samples += 1
        if a.size:
            diff = np.abs(a - b)
            self._max_abs = max(self._max_abs, float(diff.max()))
            self._sum_abs += float(diff.sum())
            self._values += a.size
            self._sq_diff += float(np.dot(a - b, a - b))
            self._sq_ref += float(np.dot(a, a))
        norms = float(np.linalg.norm(a) * np.linalg.norm(b))
        cosine = float(np.dot(a, b)) / norms if norms > 0 else 1.0  # two zero outputs agree
        self._cos_sum += cosine
        self._cos_min = min(self._cos_min, cosine)
        if self.classify is not None:
            top_a, top_b = int(np.argmax(ref[self.classify])), int(np.argmax(other[self.classify]))
            self._top1_same += int(top_a == top_b)
            if label is not None:
                self._labelled += 1
                self._ref_right += int(top_a == label)
                self._other_right += int(top_b == label)

    def add_boxes(self, ref: tuple[np.ndarray, np.ndarray],
                  other: tuple[np.ndarray, np.ndarray]) -> None:
        """One sample's decoded detections, (boxes [N, 4], classes [N]) of each."""
        matched, same = match_boxes(ref[0], ref[1], other[0], other[1])
        self._box_samples += 1
        self._ref_boxes += len(ref[0])
        self._boxes += len(other[0])
        self._box_matched += matched
        self._box_same += same

    def metrics(self) -> Metrics:
        n = self.samples
        metrics: Metrics = {
            "samples": float(n),
            "max_abs_error": self._max_abs,
            "mean_abs_error": self._sum_abs / self._values if self._values else 0.0,
            "relative_error": math.sqrt(self._sq_diff / self._sq_ref) if self._sq_ref > 0
            else 0.0,
            "cosine": self._cos_sum / n if n else None,
            "cosine_min": self._cos_min if n else None,
            "top1_agreement": None, "fp32_accuracy": None, "int8_accuracy": None,
        }
        if self.classify is not None and n:
            metrics["top1_agreement"] = self._top1_same / n
            if self._labelled == n:
                metrics["fp32_accuracy"] = self._ref_right / n
                metrics["int8_accuracy"] = self._other_right / n
        if self._box_samples:
            total = self._ref_boxes + self._boxes
            # Both empty on every frame: nothing to disagree about.
            metrics["box_f1"] = 2 * self._box_matched / total if total else 1.0
            metrics["label_agreement"] = self._box_same / self._box_matched \
                if self._box_matched else (1.0 if not total else 0.0)
        return metrics


def compare(fp32: Sequence[Outputs], int8: Sequence[Outputs], *,
            labels: Sequence[int | None] = (), classify: str | None = None) -> Metrics:
    """Agreement and error statistics of INT8 against FP32 over held-out samples.

    Errors are over every floating-point output, flattened per sample: max and mean absolute
    error, the relative L2 error of the whole set, and the cosine similarity per sample (its
    mean and its minimum). For classifiers, top-1 agreement; with a label for every sample,
    each precision's accuracy too."""
    if not fp32 or len(fp32) != len(int8):
        raise ValueError(f"need matching held-out outputs, got {len(fp32)} and {len(int8)}")
    given = list(labels) if labels and len(labels) == len(fp32) and \
        all(x is not None for x in labels) else [None] * len(fp32)
    agreement = Agreement(classify)
    for a, b, label in zip(fp32, int8, given, strict=True):
        agreement.add(a, b, label=label)
    return agreement.metrics()


def decide(metrics: Metrics, cfg: QuantizationConfig,
           classifier: bool) -> tuple[list[Check], list[str]]:
    """The INT8 gate's thresholds that apply and whether each passed; the failures in words."""
    checks: list[Check] = []

    def at_least(name: str, value: float | None, threshold: float) -> None:
        checks.append(Check(name, threshold, value, value is not None and value >= threshold))

    def at_most(name: str, value: float | None, threshold: float) -> None:
        checks.append(Check(name, threshold, value, value is not None and value <= threshold))

    if classifier:
        at_least("min_top1_agreement", metrics["top1_agreement"], cfg.min_top1_agreement)
        fp32_acc, int8_acc = metrics["fp32_accuracy"], metrics["int8_accuracy"]
        if cfg.max_accuracy_drop is not None and fp32_acc is not None and int8_acc is not None:
            at_most("max_accuracy_drop", fp32_acc - int8_acc, cfg.max_accuracy_drop)
    else:
        at_least("min_cosine", metrics["cosine"], cfg.min_cosine)
    for name, key in (("max_mean_abs_error", "mean_abs_error"), ("max_abs_error", "max_abs_error"),
                      ("max_relative_error", "relative_error")):
        threshold = getattr(cfg, name)
        if threshold is not None:
            at_most(name, metrics[key], threshold)
    return checks, failures(checks)


def failures(checks: Sequence[Check]) -> list[str]:
    """The failed checks in words: `min_cosine: 0.91 < 0.99`."""
    return [f"{c.name}: {show(c.value)} {'<' if c.name.startswith('min') else '>'} "
            f"{c.threshold:g}" for c in checks if not c.passed]


def show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
