"""The accuracy gate: INT8 outputs against FP32's on held-out samples, reduced to a few numbers
(top-1 agreement and accuracy for classifiers, error statistics for every model), and the
thresholds of `model.yaml`'s `quantization:` section applied to them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edged.model.config import QuantizationConfig
from edged.model.int8_report import Check
from edged.model.repository import ModelVersion

Outputs = dict[str, np.ndarray]  # one sample's outputs, batch dim removed


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


def compare(fp32: Sequence[Outputs], int8: Sequence[Outputs], *,
            labels: Sequence[int | None] = (), classify: str | None = None
            ) -> dict[str, float | None]:
    """Agreement and error statistics of INT8 against FP32 over held-out samples.

    Errors are over every floating-point output, flattened per sample: max and mean absolute
    error, the relative L2 error of the whole set, and the cosine similarity per sample (its
    mean and its minimum). For classifiers, top-1 agreement; with a label for every sample,
    each precision's accuracy too."""
    if not fp32 or len(fp32) != len(int8):
        raise ValueError(f"need matching held-out outputs, got {len(fp32)} and {len(int8)}")
    a = np.stack([_flat(o) for o in fp32])
    b = np.stack([_flat(o) for o in int8])
    diff = np.abs(a - b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    # Two all-zero outputs are the same output: cosine 1.
    cosines = np.where(norms > 0, dots / np.where(norms > 0, norms, 1), 1.0)
    total = float(np.linalg.norm(a))
    metrics: dict[str, float | None] = {
        "samples": float(len(fp32)),
        "max_abs_error": float(diff.max()) if diff.size else 0.0,
        "mean_abs_error": float(diff.mean()) if diff.size else 0.0,
        "relative_error": float(np.linalg.norm(a - b)) / total if total > 0 else 0.0,
        "cosine": float(cosines.mean()),
        "cosine_min": float(cosines.min()),
        "top1_agreement": None, "fp32_accuracy": None, "int8_accuracy": None,
    }
    if classify is not None:
        top_a = np.array([int(np.argmax(o[classify])) for o in fp32])
        top_b = np.array([int(np.argmax(o[classify])) for o in int8])
        metrics["top1_agreement"] = float(np.mean(top_a == top_b))
        if labels and len(labels) == len(fp32) and all(x is not None for x in labels):
            truth = np.array(labels)
            metrics["fp32_accuracy"] = float(np.mean(top_a == truth))
            metrics["int8_accuracy"] = float(np.mean(top_b == truth))
    return metrics


def _flat(outputs: Outputs) -> np.ndarray:
    parts = [np.asarray(v, np.float64).ravel() for _, v in sorted(outputs.items())
             if np.issubdtype(np.asarray(v).dtype, np.floating)]
    return np.concatenate(parts) if parts else np.zeros(0)


def decide(metrics: dict[str, float | None], cfg: QuantizationConfig,
           classifier: bool) -> tuple[list[Check], list[str]]:
    """The thresholds that apply and whether each passed; the failures in words."""
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
    reasons = [f"{c.name}: {_show(c.value)} {'<' if c.name.startswith('min') else '>'} "
               f"{c.threshold:g}" for c in checks if not c.passed]
    return checks, reasons


def _show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"
