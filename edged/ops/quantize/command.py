"""`edged quantize MODEL`: samples from the command line's files, folders or stream, the
gate's verdict as a short summary, and the exit code: 0 accepted, 1 refused by the gate (the
variant kept as model.int8.refused.onnx, which nothing loads), 2 usage or input errors,
3 quantization itself failed."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import BackendOptions
from edged.core.errors import ConfigError, EdgedError, InvalidInput, QuantizationFailed
from edged.model.int8_report import QuantReport, report_path
from edged.model.repository import ModelRepository, ModelVersion
from edged.ops.quantize.calibration import Sample, load_samples, split, stream_samples, subset
from edged.ops.quantize.quantize import quantize

EXIT_ACCEPTED, EXIT_REFUSED, EXIT_USAGE, EXIT_FAILED = 0, 1, 2, 3


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="model name in the repository")
    parser.add_argument("--models-dir", type=Path, required=True, help="the model repository")
    parser.add_argument("--version", type=int, help="model version (default: the active one)")
    parser.add_argument("--calibration", type=Path, nargs="+", action="extend", default=[],
                        metavar="PATH", help="images (pre-processed as model.yaml says) or "
                        ".npy/.npz files, or folders of them")
    parser.add_argument("--held-out", type=Path, nargs="+", action="extend", default=[],
                        metavar="PATH", help="samples for the gate, in class folders (0/, 1/ "
                        "or label names) for accuracy; default: part of the calibration set")
    parser.add_argument("--calibration-stream", metavar="URI",
                        help="also calibrate on frames of this stream (file://, rtsp://, ...)")
    parser.add_argument("--frames", type=int, default=64, help="frames read from the stream")
    parser.add_argument("--frame-step", type=int, default=1, help="keep every Nth frame")
    parser.add_argument("--samples", type=int,
                        help="most calibration samples (default: quantization."
                             "calibration_samples)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the split and the subset")


def run(args: argparse.Namespace) -> int:
    try:
        repository = ModelRepository(args.models_dir)
        model = (repository.get(args.model, args.version) if args.version is not None
                 else repository.resolve(args.model))
        if args.frames < 1 or args.frame_step < 1 or (args.samples is not None
                                                      and args.samples < 1):
            raise InvalidInput("--frames, --frame-step and --samples must be at least 1")
        calibration, held_out, details = gather(
            model, args.calibration, args.held_out, stream=args.calibration_stream,
            frames=args.frames, step=args.frame_step, samples=args.samples, seed=args.seed)
    except EdgedError as exc:  # no such model, bad model.yaml, unreadable samples
        return _fail(exc, EXIT_USAGE)
    print(f"{model.label}: {len(calibration)} calibration and {len(held_out)} held-out samples",
          file=sys.stderr)
    # The gate's reference is ONNX Runtime's CPU EP, wherever the model will run.
    options = BackendOptions(providers=("cpu",),
                             intra_op_threads=model.config.onnxruntime.intra_op_threads or 0)
    try:
        report = quantize(model, calibration, held_out, options=options, progress=_progress,
                          details=details)
    except QuantizationFailed as exc:
        return _fail(exc, EXIT_FAILED)
    except EdgedError as exc:  # ORT's quantization tools missing
        return _fail(exc, EXIT_USAGE)
    print(summary(report, model))
    return EXIT_ACCEPTED if report.accepted else EXIT_REFUSED


def gather(model: ModelVersion, calibration: list[Path], held_out: list[Path], *,
           stream: str | None = None, frames: int = 64, step: int = 1,
           samples: int | None = None, seed: int = 0
           ) -> tuple[list[Sample], list[Sample], dict[str, Any]]:
    """(calibration, held-out, where they came from). Without a held-out set, a seeded share
    of the calibration samples is held out (`quantization.held_out_fraction`)."""
    cfg = model.config.quantization
    rng = np.random.default_rng(seed)
    labels = read_labels(model)
    pool = load_samples(model, calibration, labels) if calibration else []
    if stream:
        pool += stream_samples(model, stream, frames, step)
    if not pool:
        raise InvalidInput("no calibration samples: give --calibration files or folders "
                           "(images, .npy, .npz) or --calibration-stream")
    if held_out:
        held = load_samples(model, held_out, labels)
        if not held:
            raise InvalidInput(f"no samples in --held-out {' '.join(map(str, held_out))}")
    else:
        pool, held = split(pool, cfg.held_out_fraction, rng)
    chosen = subset(pool, samples or cfg.calibration_samples, rng)
    details = {"seed": seed, "sources": [str(p) for p in calibration] + ([stream] if stream
                                                                         else []),
               "held_out_from": [str(p) for p in held_out] or "calibration split",
               "labelled_held_out": sum(s.label is not None for s in held)}
    return chosen, held, details


def read_labels(model: ModelVersion) -> list[str]:
    """The class names: `postprocess.names` (model.yaml's, or the ONNX metadata's), else the
    `postprocess.labels` file beside model.yaml; [] when there are none."""
    post = model.config.postprocess
    if post is not None and post.names is not None:
        return list(post.names)
    if post is None or not post.labels:
        return []
    for folder in (model.dir, model.dir.parent):
        path = folder / post.labels
        if path.is_file():
            return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    return []


def summary(report: QuantReport, model: ModelVersion) -> str:
    m, lat = report.metrics, report.latency
    lines = [f"{model.label}: INT8 variant {report.decision.upper()} -> "
             f"{model.dir / report.file}"]
    for check in report.checks:
        value = "n/a" if check.value is None else f"{check.value:.4f}"
        sign = ">=" if check.name.startswith("min") else "<="
        lines.append(f"  {'ok  ' if check.passed else 'FAIL'} {check.name}: {value} "
                     f"(must be {sign} {check.threshold:g})")
    if m.get("fp32_accuracy") is not None:
        lines.append(f"  accuracy on {report.calibration.get('labelled_held_out')} labelled "
                     f"held-out samples: FP32 {m['fp32_accuracy']:.4f}, "
                     f"INT8 {m['int8_accuracy']:.4f}")
    lines.append(f"  outputs: cosine {m['cosine']:.5f} (min {m['cosine_min']:.5f}), mean abs "
                 f"error {m['mean_abs_error']:.3g}, max {m['max_abs_error']:.3g}, relative "
                 f"{m['relative_error']:.3g}")
    lines.append(f"  p50 at batch 1 on this CPU: FP32 {lat['fp32_ms_p50']:.3f} ms, INT8 "
                 f"{lat['int8_ms_p50']:.3f} ms (INT8/FP32 {lat['ratio']:.2f})")
    lines.append(f"  report: {report_path(model.dir)}")
    return "\n".join(lines)


def _progress(stage: str, done: int, total: int) -> None:
    print(f"edged quantize: {stage} {done}/{total}", file=sys.stderr, flush=True)


def _fail(exc: EdgedError, code: int) -> int:
    if isinstance(exc, ConfigError):
        for issue in exc.issues:
            print(f"edged quantize: {issue}", file=sys.stderr)
    else:
        print(f"edged quantize: {exc}", file=sys.stderr)
    return code
