"""Make a model's INT8 variant and gate it: the graph converted to a recent opset and
pre-processed (ONNX Runtime's shape inference and fusions), statically quantized to QDQ with
per-channel weights on calibration samples, then run beside FP32 on held-out samples. The
variant lands as `model.int8.onnx` when the gate accepts it and as `model.int8.refused.onnx`
(which nothing loads) when it does not, with `model.int8.report.json` beside it either way."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edged.backends.base import BackendOptions
from edged.core.errors import EdgedError, QuantizationFailed, ToolError
from edged.core.fsutil import file_sha256
from edged.inference.loadspec import load_spec
from edged.inference.precision import time_sessions
from edged.model.int8_report import (
    ACCEPTED_FILE,
    REFUSED_FILE,
    QuantReport,
    write_report,
)
from edged.model.repository import ModelVersion
from edged.model.signature import read_signature
from edged.ops.quantize.calibration import Sample
from edged.processing.agreement import Outputs, classify_output, compare, decide

logger = logging.getLogger(__name__)

# (stage, done, total), called every few samples and at the end of each stage
Progress = Callable[[str, int, int], None]


class _Steps:
    """Calls `progress` every `every` samples and at the last one."""

    def __init__(self, progress: Progress | None, stage: str, total: int, every: int) -> None:
        self.progress, self.stage, self.total, self.every = progress, stage, total, every
        self.done = 0

    def step(self) -> None:
        self.done += 1
        if self.progress and (self.done % self.every == 0 or self.done == self.total):
            self.progress(self.stage, self.done, self.total)


def quantize(model: ModelVersion, calibration: Sequence[Sample], held_out: Sequence[Sample], *,
             options: BackendOptions | None = None, progress: Progress | None = None,
             every: int = 16, latency_rounds: int = 5, details: dict[str, Any] | None = None
             ) -> QuantReport:
    """Quantize `model`, gate the result on `held_out`, write the variant and its report into
    the version's folder, and return the report. `details` goes into the report's
    `calibration` section (where the samples came from, the seed)."""
    if not calibration or not held_out:
        raise ToolError("quantization needs calibration samples and held-out samples")
    cfg = model.config.quantization
    options = options or BackendOptions(providers=("cpu",))
    with tempfile.TemporaryDirectory(prefix="edged-quantize-") as tmp:
        work = Path(tmp)
        prepared = _prepare(model, work)
        int8_file = work / "model.int8.onnx"
        _quantize_static(model, prepared, int8_file,
                         _Steps(progress, "calibrating", len(calibration), every), calibration)
        _check_signature(model, int8_file)
        fp32_out, int8_out, latency = _evaluate(model, int8_file, held_out, options,
                                                _Steps(progress, "comparing", len(held_out),
                                                       every), latency_rounds)
        classify = classify_output(model)
        metrics = compare(fp32_out, int8_out, labels=[s.label for s in held_out],
                          classify=classify)
        checks, reasons = decide(metrics, cfg, classifier=classify is not None)
        accepted = not reasons
        final = model.dir / (ACCEPTED_FILE if accepted else REFUSED_FILE)
        report = QuantReport(
            model=model.name, version=model.version, accepted=accepted, file=final.name,
            sha256=file_sha256(int8_file), source_sha256=file_sha256(model.onnx_path),
            kind="classify" if classify else "outputs", checks=checks, metrics=metrics,
            latency=latency,
            calibration={"samples": len(calibration), "held_out": len(held_out),
                         **(details or {})},
            settings={"format": "QDQ", "activation_type": cfg.activation_type,
                      "weight_type": cfg.weight_type, "per_channel": cfg.per_channel,
                      "calibration_method": cfg.calibration_method,
                      "opset": _opset(prepared)},
            onnxruntime=_ort_version(),
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            reasons=reasons)
        # The other name goes first; the report last, so it never vouches for a file that
        # is not there (and int8_variant checks the sha256 anyway).
        (model.dir / (REFUSED_FILE if accepted else ACCEPTED_FILE)).unlink(missing_ok=True)
        staged = model.dir / f".{final.name}.tmp"
        shutil.copyfile(int8_file, staged)
        os.replace(staged, final)
    write_report(model.dir, report)
    logger.info("%s: INT8 variant %s (%s)", model.label, report.decision,
                "; ".join(reasons) or "every check passed")
    return report


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _opset(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)


def _prepare(model: ModelVersion, work: Path) -> Path:
    """The FP32 graph at opset >= `quantization.opset`, then ONNX Runtime's quantization
    pre-processing (without symbolic shape inference: it fails on these graphs)."""
    import onnx
    from onnx import version_converter

    try:
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as exc:  # sympy, mostly
        raise ToolError(f"ONNX Runtime's quantization tools cannot be imported ({exc}): "
                        "pip install 'edged[quantize]'") from exc
    converted = work / "opset.onnx"
    prepared = work / "prepared.onnx"
    try:
        graph = onnx.load(str(model.onnx_path))
        current = max((o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")),
                      default=0)
        if current < model.config.quantization.opset:
            graph = version_converter.convert_version(graph, model.config.quantization.opset)
        onnx.save(graph, str(converted))
        quant_pre_process(str(converted), str(prepared), skip_symbolic_shape=True)
    except Exception as exc:  # onnx and ORT raise many types; all mean "cannot prepare"
        raise QuantizationFailed(f"{model.label}: preparing the graph for quantization "
                                 f"failed: {exc}") from exc
    return prepared


def _quantize_static(model: ModelVersion, prepared: Path, out: Path, steps: _Steps,
                     calibration: Sequence[Sample]) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.samples = iter(calibration)

        def get_next(self) -> dict[str, Any] | None:
            sample = next(self.samples, None)
            if sample is None:
                return None
            steps.step()
            return sample.batch(model)

    cfg = model.config.quantization
    types = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    methods = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
               "percentile": CalibrationMethod.Percentile}
    try:
        # The histogram calibrators print their progress: keep stdout for the verdict.
        with contextlib.redirect_stdout(sys.stderr):
            quantize_static(str(prepared), str(out), Reader(), quant_format=QuantFormat.QDQ,
                            per_channel=cfg.per_channel,
                            activation_type=types[cfg.activation_type],
                            weight_type=types[cfg.weight_type],
                            calibrate_method=methods[cfg.calibration_method],
                            extra_options={"ActivationSymmetric": True, "WeightSymmetric": True}
                            if cfg.symmetric else {})
    except EdgedError:
        raise
    except Exception as exc:
        raise QuantizationFailed(f"{model.label}: ONNX Runtime quantization failed: "
                                 f"{exc}") from exc


def _check_signature(model: ModelVersion, path: Path) -> None:
    """The INT8 file must take and give what model.onnx does: callers do not know which runs."""
    signature = read_signature(path)
    want = {(s.name, s.dtype) for s in model.inputs}, {(s.name, s.dtype) for s in model.outputs}
    got = ({(s.name, s.dtype) for s in signature.inputs},
           {(s.name, s.dtype) for s in signature.outputs})
    if not (want[0] <= got[0] and want[1] <= got[1]):
        raise QuantizationFailed(f"{model.label}: the INT8 graph's inputs/outputs differ from "
                                 f"model.onnx's ({sorted(got[0])}, {sorted(got[1])})")


def _evaluate(model: ModelVersion, int8_file: Path, held_out: Sequence[Sample],
              options: BackendOptions, steps: _Steps, rounds: int
              ) -> tuple[list[Outputs], list[Outputs], dict[str, float]]:
    """Both files on real ONNX Runtime sessions: each held-out sample through each (batch of
    one, so samples of different sizes are fine), then their p50 latency on the first one."""
    from edged.backends.onnxruntime import OrtBackend

    backend = OrtBackend()
    sessions: list[Any] = []  # OrtSessions
    try:
        for path, precision in ((model.onnx_path, "fp32"), (int8_file, "int8")):
            sessions.append(backend.load(load_spec(model, path, precision), options))
        fp32_out: list[Outputs] = []
        int8_out: list[Outputs] = []
        for sample in held_out:
            feed = sample.batch(model)
            for session, sink in zip(sessions, (fp32_out, int8_out), strict=True):
                outputs = session.infer(feed)
                sink.append({k: v[0] for k, v in outputs.items()} if model.max_batch_size > 0
                            else outputs)
            steps.step()
        fp32_ms, int8_ms = time_sessions(sessions, held_out[0].batch(model), rounds=rounds,
                                         per_round=5)
    except QuantizationFailed:
        raise
    except Exception as exc:  # ModelLoadError of a graph ORT cannot load, or ORT's own errors
        raise QuantizationFailed(f"{model.label}: running FP32 and INT8 side by side failed: "
                                 f"{exc}") from exc
    finally:
        for session in sessions:
            session.close()
    return fp32_out, int8_out, {"fp32_ms_p50": fp32_ms, "int8_ms_p50": int8_ms,
                                "ratio": int8_ms / fp32_ms, "batch": 1}
