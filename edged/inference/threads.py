"""How many intra-op threads an ONNX Runtime session on the CPU gets when the config leaves it
to edged (`intra_op_threads: 0`, the default): one, or one per core, whichever runs the model
faster here. Timed once on the real sessions (one of each, interleaved) and remembered in the
cache directory like `precision: auto`, keyed by the file's sha256, the runtime, the CPU, the
cores and the inputs, so later loads do not measure again.

Neither count wins everywhere. ONNX Runtime's intra-op threads split each operator; without
spinning (edged's default: spinning threads of several sessions fight over few cores) every
split wakes the pool's threads and waits for them, which a small operator does not repay.
Measured on this project's 2-core machine: PP-OCR cls (1x3x48x192) took 824 us p50 on one
thread and 1249 us on two, and 8 callers on one session ran 2285 infer/s against 1827;
PP-OCR det (1x3x640x640) took 88 ms on one thread and 52 ms on two. More threads are taken
only when they make the model at least MIN_GAIN faster: where they barely help, one thread
leaves the other cores to the other instances (`instances: auto` is one per core).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import Backend, BackendOptions, LoadSpec
from edged.core.fsutil import file_sha256
from edged.inference.instances import cores, runs_on_gpu
from edged.inference.precision import (
    cpu_fingerprint,
    remember,
    remembered,
    runtime_version,
    sample_inputs,
    time_loads,
)
from edged.model.repository import ModelVersion

logger = logging.getLogger(__name__)

MEMO_DIR = "threads"
NAMES = ("one_ms", "many_ms")
MIN_GAIN = 1.15  # one per core only where it runs the model at least this much faster
# (spec, one thread, many threads) -> (p50 ms on one, p50 ms on many); tests inject timings.
Measure = Callable[[LoadSpec, BackendOptions, BackendOptions], tuple[float, float]]


def choose_threads(model: ModelVersion, backend: Backend, spec: LoadSpec,
                   options: BackendOptions, *, measure: Measure | None = None
                   ) -> BackendOptions:
    """`options` with the intra-op threads to load `spec` with: as configured when the config
    names a count or the session is not an ONNX Runtime one on the CPU; else timed (or
    remembered). A failed timing loads with one per core, as before this choice existed."""
    if options.intra_op_threads or backend.name != "onnxruntime" or runs_on_gpu(options):
        return options
    many = cores()
    if many <= 1:
        return replace(options, intra_op_threads=1)
    one_opts = replace(options, intra_op_threads=1)
    many_opts = replace(options, intra_op_threads=many)
    memo = memo_path(options.cache_dir, model)
    key = memo_key(model, spec, options, many)
    timings = remembered(memo, key, NAMES)
    source = "remembered"
    if timings is None:
        try:
            timings = (measure or measure_sessions(backend, sample_inputs(model)))(
                spec, one_opts, many_opts)
        except Exception as exc:  # a session that cannot be made twice: load as configured
            logger.warning("%s: timing intra-op threads failed, loading with %d: %s",
                           model.label, many, exc, exc_info=True,
                           extra={"model": model.name, "version": model.version})
            return many_opts
        remember(memo, key, dict(zip(NAMES, timings, strict=True)))
        source = "measured"
    one_ms, many_ms = timings
    chosen = replace(options, intra_op_threads=threads_for(one_ms, many_ms, many))
    logger.info("%s: %d intra-op thread(s) (%s p50 %.3f ms on 1, %.3f ms on %d)", model.label,
                chosen.intra_op_threads, source, one_ms, many_ms, many,
                extra={"model": model.name, "version": model.version, "code": "threads"})
    return chosen


def measure_sessions(backend: Backend, inputs: Mapping[str, np.ndarray]) -> Measure:
    """The real measurement: the file loaded twice, once per thread count, timed interleaved."""
    def measure(spec: LoadSpec, one: BackendOptions, many: BackendOptions
                ) -> tuple[float, float]:
        a, b = time_loads(backend, [(spec, one), (spec, many)], inputs)
        return a, b
    return measure


def remembered_threads(cache_dir: Path, model: ModelVersion) -> int | None:
    """The count a load chose for `model` and remembered, or None (for benchmarks that build
    a direct session the way edged built its own)."""
    try:
        doc = json.loads(memo_path(cache_dir, model).read_text())
        return threads_for(float(doc["one_ms"]), float(doc["many_ms"]), int(doc["key"]["cores"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def threads_for(one_ms: float, many_ms: float, many: int) -> int:
    """The count to run with, given the p50 on one thread and on `many`."""
    return many if one_ms >= many_ms * MIN_GAIN else 1


def memo_path(cache_dir: Path, model: ModelVersion) -> Path:
    return cache_dir / MEMO_DIR / f"{model.name}.{model.version}.json"


def memo_key(model: ModelVersion, spec: LoadSpec, options: BackendOptions,
             many: int) -> dict[str, Any]:
    """Everything the answer depends on; a change in any of it measures again."""
    return {
        "model_sha256": file_sha256(spec.path),
        "precision": spec.precision,
        "runtime": runtime_version("onnxruntime"),
        "providers": list(options.providers),
        "inter_op_threads": options.inter_op_threads,
        "allow_spinning": options.allow_spinning,
        "graph_optimization": options.graph_optimization,
        "inputs": {k: list(v.shape) for k, v in sample_inputs(model).items()},
        "cpu": cpu_fingerprint(),
        "cores": many,
    }
