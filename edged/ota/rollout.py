"""A manifest's `rollout`: how a new version earns its place. `direct` (the default) serves it
once it has warmed and passed its golden check; `shadow` installs it beside the serving
version, runs a sampled share of live inputs through it too (edged/ota/shadow.py), and
promotes it only when, after `min_samples`, every bound of `promote_if` holds.

```json
"rollout": {"mode": "shadow", "sample": 0.1, "min_samples": 500, "max_duration_s": 3600,
            "promote_if": {"min_top1_agreement": 0.98, "max_failure_rate": 0.0}}
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from edged.model.int8_report import Check
from edged.ota.manifest import Rejected
from edged.processing.agreement import Metrics, failures

# Bound -> (the measure it reads, whether the measure must be at least or at most the bound).
BOUNDS: dict[str, tuple[str, Literal["min", "max"]]] = {
    "min_top1_agreement": ("top1_agreement", "min"),  # classifiers
    "min_box_f1": ("box_f1", "min"),  # detectors: boxes matched at IoU >= 0.5
    "min_label_agreement": ("label_agreement", "min"),  # detectors: same class when matched
    "min_cosine": ("cosine", "min"),  # every model: mean cosine of the outputs
    "min_cosine_sample": ("cosine_min", "min"),  # the worst sample's cosine
    "max_mean_abs_error": ("mean_abs_error", "max"),
    "max_abs_error": ("max_abs_error", "max"),
    "max_relative_error": ("relative_error", "max"),
    "max_failure_rate": ("failure_rate", "max"),  # candidate runs that raised
    "max_p99_ms": ("candidate_p99_ms", "max"),  # the candidate's own run time
}
KIND_BOUNDS = {"classify": {"min_top1_agreement"},
               "detect": {"min_box_f1", "min_label_agreement"}}
# What a shadow must show when the manifest names no bound, by the model's kind.
DEFAULT_BOUNDS = {"classify": {"min_top1_agreement": 0.98},
                  "detect": {"min_box_f1": 0.9, "min_label_agreement": 0.95},
                  "raw": {"min_cosine": 0.99}}
MAX_SHADOW_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Rollout:
    mode: Literal["direct", "shadow"] = "direct"
    sample: float = 0.1  # share of live inputs also run through the candidate
    min_samples: int = 500  # compared samples before the decision
    max_duration_s: float = 3600.0  # not enough samples by then: rejected
    promote_if: Mapping[str, float] = field(default_factory=dict)  # {} = the kind's defaults

    @property
    def shadow(self) -> bool:
        return self.mode == "shadow"

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "sample": self.sample, "min_samples": self.min_samples,
                "max_duration_s": self.max_duration_s, "promote_if": dict(self.promote_if)}


def parse_rollout(value: Any) -> Rollout:
    """The manifest's `rollout` object (None: direct), or Rejected('bad_manifest', why)."""
    if value is None:
        return Rollout()
    if not isinstance(value, dict):
        raise Rejected("bad_manifest", "rollout must be an object such as {\"mode\": \"shadow\"}")
    unknown = sorted(set(value) - {"mode", "sample", "min_samples", "max_duration_s",
                                   "promote_if"})
    if unknown:
        raise Rejected("bad_manifest", f"unknown rollout fields: {', '.join(unknown)}")
    mode = value.get("mode", "direct")
    if mode not in ("direct", "shadow"):
        raise Rejected("bad_manifest", f"rollout.mode must be direct or shadow, got {mode!r:.40}")
    sample = _number(value, "sample", 0.1)
    if not 0 < sample <= 1:
        raise Rejected("bad_manifest", f"rollout.sample must be in (0, 1], got {sample}")
    min_samples = value.get("min_samples", 500)
    if not isinstance(min_samples, int) or isinstance(min_samples, bool) or \
            not 1 <= min_samples <= 10_000_000:
        raise Rejected("bad_manifest", "rollout.min_samples must be an integer from 1 to 10^7")
    duration = _number(value, "max_duration_s", 3600.0)
    if not 0 < duration <= MAX_SHADOW_S:
        raise Rejected("bad_manifest", f"rollout.max_duration_s must be in (0, {MAX_SHADOW_S}]")
    bounds = value.get("promote_if", {})
    if not isinstance(bounds, dict):
        raise Rejected("bad_manifest", "rollout.promote_if must be an object of bounds")
    unknown = sorted(set(bounds) - set(BOUNDS))
    if unknown:
        raise Rejected("bad_manifest", f"unknown rollout.promote_if bounds: {', '.join(unknown)}"
                                       f" (known: {', '.join(BOUNDS)})")
    return Rollout(mode, sample, min_samples, duration,
                   {k: _number(bounds, k, 0.0, f"rollout.promote_if.{k}") for k in bounds})


def bounds_for(rollout: Rollout, kind: str) -> dict[str, float]:
    """The bounds a shadow of a model of `kind` (classify, detect, raw) is held to: the
    manifest's, else the kind's defaults; no failed run unless max_failure_rate says."""
    given = dict(rollout.promote_if) or dict(DEFAULT_BOUNDS[kind])
    for name in given:
        needs = next((k for k, names in KIND_BOUNDS.items() if name in names), None)
        if needs is not None and needs != kind:
            raise Rejected("bad_rollout", f"rollout.promote_if.{name} measures a {needs} model; "
                                          f"this one is {kind}")
    given.setdefault("max_failure_rate", 0.0)
    return given


def judge(metrics: Metrics, bounds: Mapping[str, float]) -> tuple[list[Check], list[str]]:
    """Each bound against the measures: the checks and the failed ones in words."""
    checks = []
    for name, threshold in sorted(bounds.items()):
        key, side = BOUNDS[name]
        value = metrics.get(key)
        passed = value is not None and (value >= threshold if side == "min" else
                                        value <= threshold)
        checks.append(Check(name, threshold, value, passed))
    return checks, failures(checks)


def _number(doc: Mapping[str, Any], key: str, default: float, where: str | None = None) -> float:
    value = doc.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        raise Rejected("bad_manifest", f"{where or 'rollout.' + key} must be a number, "
                                       f"got {value!r:.40}")
    return float(value)
