"""Which file a model version loads, and at which precision.

`model.yaml` `precision`: `fp32`/`fp16` load model.onnx; `int8` loads the INT8 variant that
`edged quantize` made and its gate accepted, or refuses to load; `auto` takes what the backend
rules (`Backend.auto_precision`: TensorRT takes an accepted INT8 variant of its kind, else FP16)
or, where it rules nothing (ONNX Runtime), times FP32 against INT8 once on the real
sessions and remembers the answer in the cache directory (INT8 is slower than FP32 on CPUs
without fast INT8 kernels), keyed by both files' sha256, the runtime, the CPU and the session
options, so later loads do not measure again.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import Backend, BackendOptions, LoadSpec, Session
from edged.core.errors import InvalidModel, ModelLoadError
from edged.core.fsutil import file_sha256, write_atomically
from edged.inference.loadspec import load_spec, warmup_inputs
from edged.model.int8_report import ACCEPTED_FILE, read_report, report_path
from edged.model.repository import ModelVersion

logger = logging.getLogger(__name__)

# (FP32 spec, INT8 spec) -> (FP32 p50 ms, INT8 p50 ms); tests inject fixed timings.
Measure = Callable[[LoadSpec, LoadSpec], tuple[float, float]]
MEMO_DIR = "precision"


@dataclass(frozen=True)
class PrecisionChoice:
    path: Path  # the ONNX file to load
    precision: str  # fp32 | fp16 | int8, as LoadSpec.precision
    reason: str  # one line for the log


def int8_variant(model: ModelVersion) -> Path | None:
    """The INT8 (QDQ) file of `model` if its gate accepted it and the report vouches for these
    very bytes (both sha256 match), else None."""
    return int8_status(model)[0]


def int8_status(model: ModelVersion) -> tuple[Path | None, str]:
    """The accepted INT8 file, or None; and why, in words that name the report."""
    try:
        report = read_report(model.dir)
    except InvalidModel as exc:
        return None, str(exc)
    where = report_path(model.dir)
    if report is None:
        return None, f"no INT8 variant (no {where.name}; `edged quantize {model.name}` makes one)"
    if not report.accepted:
        return None, (f"its INT8 variant was refused by the accuracy gate "
                      f"({'; '.join(report.reasons)}; see {where})")
    path = model.dir / ACCEPTED_FILE
    if report.file != ACCEPTED_FILE or not path.is_file():
        return None, f"{path} is missing (see {where})"
    if file_sha256(model.onnx_path) != report.source_sha256:
        return None, (f"{where} was made from another model.onnx (sha256 differs); "
                      f"run `edged quantize {model.name}` again")
    if file_sha256(path) != report.sha256:
        return None, f"{path} is not the file {where} accepted (sha256 differs)"
    return path, f"INT8 variant accepted by its gate ({where.name})"


def choose_precision(model: ModelVersion, backend: Backend, options: BackendOptions, *,
                     measure: Measure | None = None) -> PrecisionChoice:
    """The file and precision to load `model` with on `backend`; raises ModelLoadError when
    `precision: int8` is asked for and no accepted INT8 variant exists."""
    wanted = model.config.precision
    if wanted in ("fp32", "fp16"):
        choice = PrecisionChoice(model.onnx_path, wanted, "model.yaml asks for it")
    elif wanted == "int8":
        path, why = int8_status(model)
        if path is None:
            raise ModelLoadError(f"{model.label}: precision int8 asked for, but {why}")
        choice = PrecisionChoice(path, "int8", f"model.yaml asks for it; {why}")
    else:
        choice = _auto(model, backend, options, measure)
    logger.info("%s: precision %s from %s (%s)", model.label, choice.precision,
                choice.path.name, choice.reason,
                extra={"model": model.name, "version": model.version, "code": "precision"})
    return choice


def _auto(model: ModelVersion, backend: Backend, options: BackendOptions,
          measure: Measure | None) -> PrecisionChoice:
    path, why = int8_status(model)
    ruled = backend.auto_precision(path, why)
    if ruled is not None:
        precision, reason = ruled
        return PrecisionChoice(path if precision == "int8" and path else model.onnx_path,
                               precision, reason)
    if path is None:  # a backend that times only when there is something to time
        return PrecisionChoice(model.onnx_path, "fp32", f"auto: {why}")
    fp32_spec, int8_spec = load_spec(model, precision="fp32"), load_spec(model, path, "int8")
    memo = options.cache_dir / MEMO_DIR / f"{model.name}.{model.version}.json"
    key = memo_key(model, path, backend, options)
    timings = remembered(memo, key, ("fp32_ms", "int8_ms"))
    source = "remembered"
    if timings is None:
        try:
            timings = (measure or measure_sessions(backend, options, sample_inputs(model)))(
                fp32_spec, int8_spec)
        except Exception as exc:  # a backend that cannot run the INT8 file: stay on FP32
            logger.warning("%s: timing INT8 against FP32 failed, loading FP32: %s",
                           model.label, exc, extra={"model": model.name,
                                                    "version": model.version})
            return PrecisionChoice(model.onnx_path, "fp32", f"auto: timing INT8 failed: {exc}")
        remember(memo, key, {"fp32_ms": timings[0], "int8_ms": timings[1]})
        source = "measured"
    fp32_ms, int8_ms = timings
    speedup = fp32_ms / int8_ms if int8_ms > 0 else 0.0
    detail = (f"auto: {source} p50 FP32 {fp32_ms:.3f} ms, INT8 {int8_ms:.3f} ms on "
              f"{backend.name}: INT8 runs at {speedup:.2f}x FP32's speed")
    if speedup >= model.config.quantization.auto_min_speedup:
        return PrecisionChoice(path, "int8", detail)
    return PrecisionChoice(model.onnx_path, "fp32", detail)



# -- measuring --------------------------------------------------------------------------------
def sample_inputs(model: ModelVersion, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs of the warm-up shapes, floats drawn at random (all-zero inputs can take faster
    paths through some kernels than real data does)."""

    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(a.shape).astype(a.dtype)
            if np.issubdtype(a.dtype, np.floating) else a
            for name, a in warmup_inputs(model).items()}


def measure_sessions(backend: Backend, options: BackendOptions,
                     inputs: Mapping[str, np.ndarray]) -> Measure:
    """The real measurement: both files loaded on `backend`, timed in one interleaved run."""
    def measure(fp32: LoadSpec, int8: LoadSpec) -> tuple[float, float]:
        a, b = time_loads(backend, [(fp32, options), (int8, options)], inputs)
        return a, b
    return measure


def time_loads(backend: Backend, loads: Sequence[tuple[LoadSpec, BackendOptions]],
               inputs: Mapping[str, np.ndarray]) -> list[float]:
    """Load each (spec, options) on `backend`, time them together (`time_sessions`), close
    them again."""
    sessions: list[Session] = []
    try:
        for spec, opts in loads:
            sessions.append(backend.load(spec, opts))
        return time_sessions(sessions, inputs)
    finally:
        for session in sessions:
            session.close()


def time_sessions(sessions: Sequence[Session], inputs: Mapping[str, np.ndarray], *,
                  warm: int = 3, rounds: int = 5, per_round: int = 3,
                  budget_s: float = 10.0) -> list[float]:
    """p50 milliseconds of each session on `inputs`: a few warm runs each, then rounds that
    take the sessions in rotating order, so the machine's drift hits all alike. Stops early
    (after two rounds at least) when `budget_s` is spent."""
    for session in sessions:
        for _ in range(warm):
            session.infer(inputs)
    times: list[list[float]] = [[] for _ in sessions]
    deadline = time.perf_counter() + budget_s
    for r in range(rounds):
        for k in range(len(sessions)):
            which = (r + k) % len(sessions)
            for _ in range(per_round):
                started = time.perf_counter()
                sessions[which].infer(inputs)
                times[which].append(time.perf_counter() - started)
        if r >= 1 and time.perf_counter() > deadline:
            break
    return [statistics.median(t) * 1e3 for t in times]


# -- remembering ------------------------------------------------------------------------------
def memo_key(model: ModelVersion, int8_path: Path, backend: Backend,
             options: BackendOptions) -> dict[str, Any]:
    """Everything the FP32-vs-INT8 answer depends on; a change in any of it measures again."""
    return {
        "model_sha256": file_sha256(model.onnx_path),
        "int8_sha256": file_sha256(int8_path),
        "candidates": ["fp32", "int8"],
        "backend": backend.name,
        "runtime": runtime_version(backend.name),
        "providers": list(options.providers),
        "threads": [options.intra_op_threads, options.inter_op_threads],
        "inputs": {k: list(v.shape) for k, v in sample_inputs(model).items()},
        "cpu": cpu_fingerprint(),
    }


def runtime_version(module: str) -> str:
    try:
        return str(getattr(importlib.import_module(module), "__version__", "unknown"))
    except ImportError:
        return "unknown"


def cpu_fields() -> dict[str, str]:
    """/proc/cpuinfo as the first value of each key (the first CPU's; empty where there is
    none)."""
    fields: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_fingerprint() -> str:
    """The CPU model and a digest of its feature flags (AVX-512 VNNI and the like decide
    whether INT8 kernels are fast), plus the core count."""
    fields = cpu_fields()
    name = fields.get("model name") or platform.processor() or platform.machine()
    features = fields.get("flags") or fields.get("Features", "")
    extra = " ".join(fields.get(k, "") for k in ("CPU implementer", "CPU part")).strip()
    digest = hashlib.sha256(" ".join(sorted(features.split())).encode()).hexdigest()[:16]
    return f"{name} {extra} {platform.machine()} x{os.cpu_count()} flags:{digest}".replace(
        "  ", " ")


def remembered(memo: Path, key: dict[str, Any], names: tuple[str, str]
               ) -> tuple[float, float] | None:
    """The two timings `names` a memo file holds for `key`; None when it holds none, or
    holds them for another key (something they depend on changed)."""
    try:
        doc = json.loads(memo.read_text())
        if doc.get("key") == key:
            return float(doc[names[0]]), float(doc[names[1]])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        logger.warning("%s: ignoring an unreadable memo: %s", memo, exc)
    return None


def remember(memo: Path, key: dict[str, Any], timings: dict[str, float]) -> None:
    """Write the timings for `key`; a cache that cannot be written is measured again later."""
    doc = {"key": key, **timings,
           "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(memo, json.dumps(doc, indent=2) + "\n")
    except OSError as exc:  # a read-only cache: measure again next time, load anyway
        logger.warning("%s: cannot remember the timings: %s", memo, exc)
