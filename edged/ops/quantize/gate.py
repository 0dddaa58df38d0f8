"""The accuracy gate: INT8 outputs against FP32's on held-out samples, reduced to a few numbers
(top-1 agreement and accuracy for classifiers, error statistics for every model), and the
thresholds of `model.yaml`'s `quantization:` section applied to them.

The measures themselves live on the runtime side (edged/model/agreement.py), where the
device's shadow runs of OTA candidates use them too; the daemon never imports edged/ops/."""

from __future__ import annotations

from edged.model.agreement import Outputs, classify_output, compare, decide

__all__ = ["Outputs", "classify_output", "compare", "decide"]
