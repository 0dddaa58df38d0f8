"""The gate's verdict on disk: `<model>/<version>/model.int8.report.json` beside the INT8 file.

An accepted variant is `model.int8.onnx`; a refused one is kept for inspection as
`model.int8.refused.onnx`, a name nothing loads. The report names the sha256 of both the INT8
file and the FP32 file it was made from, so a report never vouches for other bytes.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edged.core.errors import InvalidModel
from edged.core.fsutil import write_atomically

REPORT_FILE = "model.int8.report.json"
ACCEPTED_FILE = "model.int8.onnx"  # = repository.INT8_FILE
REFUSED_FILE = "model.int8.refused.onnx"


@dataclass(frozen=True)
class Check:
    """One threshold of the gate and how the variant fared against it."""

    name: str  # the model.yaml key, e.g. "min_top1_agreement"
    threshold: float
    value: float | None
    passed: bool


@dataclass(frozen=True)
class QuantReport:
    model: str
    version: int
    accepted: bool
    file: str  # the INT8 file, in the version's folder
    sha256: str  # of that file
    source_sha256: str  # of the model.onnx it was made from
    kind: str  # "classify" (top-1 compared) | "outputs" (output error statistics)
    checks: list[Check]
    metrics: dict[str, float | None]  # top1_agreement, fp32/int8_accuracy, errors, cosine
    latency: dict[str, float]  # fp32_ms_p50, int8_ms_p50, ratio (int8 / fp32)
    calibration: dict[str, Any]  # samples, held_out, sources, seed
    settings: dict[str, Any]  # activation/weight type, per channel, method, opset
    onnxruntime: str
    created: str
    reasons: list[str] = field(default_factory=list)  # the failed checks, in words

    @property
    def decision(self) -> str:
        return "accepted" if self.accepted else "refused"


def report_path(version_dir: Path) -> Path:
    return version_dir / REPORT_FILE


def write_report(version_dir: Path, report: QuantReport) -> Path:
    """Write the report atomically (a reader sees the old one or the new one)."""
    path = report_path(version_dir)
    doc = {"decision": report.decision, **dataclasses.asdict(report)}
    write_atomically(path, json.dumps(doc, indent=2) + "\n")
    return path


def read_report(version_dir: Path) -> QuantReport | None:
    """The version's report, None when it has none; InvalidModel when it cannot be read."""
    path = report_path(version_dir)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise InvalidModel(f"{path}: unreadable quantization report: {exc}") from exc
    try:
        doc.pop("decision", None)
        doc["checks"] = [Check(**c) for c in doc["checks"]]
        return QuantReport(**doc)
    except (TypeError, KeyError, AttributeError) as exc:
        raise InvalidModel(f"{path}: not a quantization report: {exc}") from exc

