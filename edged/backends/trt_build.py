"""Building a TensorRT engine from ONNX: parsing, precision flags, one optimisation profile per
execution context, the workspace limit, the timing cache, and progress in the log. The
`tensorrt` module is handed in by the backend, so nothing here imports it."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import BackendOptions, LoadSpec
from edged.backends.profiles import InputProfile
from edged.core.fsutil import write_atomically

logger = logging.getLogger(__name__)

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")


class BuildError(RuntimeError):
    """TensorRT could not parse the model or build an engine from it."""


@dataclass(frozen=True)
class PrecisionPlan:
    precision: str  # what the engine runs: fp32 | fp16 | int8
    flags: tuple[str, ...]  # BuilderFlag names to set
    note: str | None = None  # why it differs from what was asked (log, sidecar)
    cleared: tuple[str, ...] = ()  # BuilderFlag names to clear (TensorRT sets TF32 itself)


def weakly_typed(trt: Any) -> bool:
    """TensorRT 10 picks layer precisions from builder flags; TensorRT 11 removed those flags
    (networks are strongly typed: the file's types are the engine's)."""
    return hasattr(trt.BuilderFlag, "FP16")


def plan_precision(asked: str, *, has_qdq: bool, weak_typing: bool,
                   dla: bool = False, gpu_fallback: bool = True) -> PrecisionPlan:
    """Builder flags for `asked` (fp32 | fp16 | int8). INT8 is explicit quantization only: a
    Q/DQ file, whose nodes say where INT8 runs (implicit calibration is deprecated in
    TensorRT 10 and removed in 11). TensorRT 10 needs the INT8 flag to honour Q/DQ nodes, and
    FP16 beside it lets the layers between Q/DQ islands run in half (ONNX Runtime's TensorRT EP
    sets both too); TensorRT 11 has no precision flags at all. An fp32 engine clears TF32,
    which TensorRT enables by default: on Ampere and Orin it rounds matmul and convolution
    inputs to 10 mantissa bits, outside fp32's tolerance."""
    notes = []
    if asked == "int8" and not has_qdq:
        notes.append("int8 needs a Q/DQ (explicitly quantized) ONNX file and this one has no "
                     "Q/DQ nodes; building fp16")
        asked = "fp16"
    if dla and asked == "fp32":
        notes.append("DLA cores run fp16 or int8, not fp32; building fp16")
        asked = "fp16"
    flags: list[str] = []
    if has_qdq:
        precision = "int8"
        if weak_typing:
            flags.append("INT8")
            if asked in ("fp16", "int8"):
                flags.append("FP16")  # layers between the Q/DQ islands may run in half
    elif asked == "fp16" and not weak_typing:
        notes.append("this TensorRT has no FP16 builder flag (strongly typed networks); the "
                     "engine keeps the ONNX file's types")
        precision = "fp32"
    else:
        precision = asked
        flags += ["FP16"] if asked == "fp16" else []
    if dla and gpu_fallback:
        flags.append("GPU_FALLBACK")  # layers a DLA cannot run go to the GPU
    cleared = ("TF32",) if precision == "fp32" else ()
    return PrecisionPlan(precision, tuple(flags), "; ".join(notes) or None, cleared)


def inspect_qdq(path: Path) -> tuple[bool, str | None]:
    """Whether the ONNX file is explicitly quantized (QuantizeLinear/DequantizeLinear nodes),
    and why TensorRT cannot take them, if it cannot: it runs signed INT8 with zero points of
    0 only (symmetric), so a file quantized for CPUs (uint8, asymmetric) is refused."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    nodes = [node for node in model.graph.node if node.op_type in QDQ_OPS]
    if not nodes:
        return False, None
    constants = {t.name: t for t in model.graph.initializer}
    constants.update({node.output[0]: attr.t for node in model.graph.node
                      if node.op_type == "Constant" for attr in node.attribute
                      if attr.name == "value"})
    for node in nodes:
        zero_point = constants.get(node.input[2]) if len(node.input) > 2 else None
        if zero_point is None:
            continue  # absent (0) or computed: nothing to say
        values = numpy_helper.to_array(zero_point)
        if values.dtype == np.uint8:
            return True, f"{node.op_type} {node.name or node.input[0]} is uint8"
        if np.any(values != 0):
            return True, f"{node.op_type} {node.name or node.input[0]} has non-zero zero points"
    return True, None


@dataclass(frozen=True)
class BuildPlan:
    spec: LoadSpec
    precision: PrecisionPlan
    profiles: tuple[tuple[InputProfile, ...], ...]  # one per context (one if shapes are fixed)
    timing_cache: Path


_logger_lock = threading.Lock()
_loggers: dict[int, Any] = {}


def trt_logger(trt: Any) -> Any:
    """One ILogger per process (TensorRT ignores a second one), writing to edged's log."""
    with _logger_lock:
        if id(trt) not in _loggers:
            severity = trt.ILogger.Severity

            class _Log(trt.ILogger):
                def __init__(self) -> None:
                    trt.ILogger.__init__(self)

                def log(self, level: Any, msg: str) -> None:
                    if level in (severity.INTERNAL_ERROR, severity.ERROR):
                        logger.error("TensorRT: %s", msg)
                    elif level == severity.WARNING:
                        logger.warning("TensorRT: %s", msg)
                    else:
                        logger.debug("TensorRT: %s", msg)

            _loggers[id(trt)] = _Log()
        return _loggers[id(trt)]


def build_engine(trt: Any, plan: BuildPlan, options: BackendOptions,
                 cancelled: threading.Event | None = None) -> bytes:
    """Build the engine `plan` describes and return its serialized bytes; BuildError if
    TensorRT cannot. Updates the shared timing cache."""
    spec, log = plan.spec, trt_logger(trt)
    started = time.monotonic()
    builder = trt.Builder(log)
    network = builder.create_network(0)  # explicit batch: the only kind since TensorRT 10
    parser = trt.OnnxParser(network, log)
    logger.info("%s: TensorRT %s: parsing %s", spec.label, trt.__version__, spec.path.name)
    if not parser.parse_from_file(str(spec.path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"{spec.path}: TensorRT cannot parse it: {errors or 'no details'}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mb << 20)
    for flag in plan.precision.flags:
        config.set_flag(getattr(trt.BuilderFlag, flag))
    for flag in plan.precision.cleared:
        config.clear_flag(getattr(trt.BuilderFlag, flag))
    if options.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = options.dla_core
    if _has_dynamic_inputs(network):  # static engines need (and take) no profile
        for ranges in plan.profiles:
            profile = builder.create_optimization_profile()
            for item in ranges:
                profile.set_shape(item.name, item.min, item.opt, item.max)
            config.add_optimization_profile(profile)
    config.set_timing_cache(_load_timing_cache(config, plan.timing_cache), False)
    monitor = None
    if hasattr(trt, "IProgressMonitor"):  # TensorRT 10+: phases as they happen
        monitor = _progress_monitor(trt, spec.label, cancelled or threading.Event())
        config.progress_monitor = monitor
    else:
        logger.info("%s: TensorRT: building (no progress reports from this version)",
                    spec.label)
    serialized = builder.build_serialized_network(network, config)
    del monitor  # TensorRT holds no reference; it had to outlive the build
    if serialized is None:
        raise BuildError(f"{spec.label}: TensorRT built no engine (its errors are logged above)")
    _save_timing_cache(config.get_timing_cache(), plan.timing_cache)
    engine = bytes(memoryview(serialized))
    logger.info("%s: TensorRT engine built in %.1fs (%s, %.1f MB)", spec.label,
                time.monotonic() - started, plan.precision.precision, len(engine) / 1e6)
    return engine


def _has_dynamic_inputs(network: Any) -> bool:
    return any(d < 0 for i in range(network.num_inputs) for d in network.get_input(i).shape)


def _load_timing_cache(config: Any, path: Path) -> Any:
    """The timing cache from `path`, or a new empty one when there is none or it is unusable
    (another TensorRT wrote it, or it was cut short)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as exc:
        logger.warning("cannot read the timing cache %s: %s", path, exc)
        data = b""
    if data:
        try:
            cache = config.create_timing_cache(data)
            if cache is not None:
                return cache
        except Exception as exc:  # TensorRT's own error types: start afresh
            logger.warning("ignoring the timing cache %s: %s", path, exc)
    return config.create_timing_cache(b"")


def _save_timing_cache(cache: Any, path: Path) -> None:
    if cache is None:
        return
    try:
        data = bytes(memoryview(cache.serialize()))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)
    except OSError as exc:  # builds still work, only slower next time
        logger.warning("cannot save the timing cache %s: %s", path, exc)


def _progress_monitor(trt: Any, label: str, cancelled: threading.Event) -> Any:
    """An IProgressMonitor that logs top-level phases (nested ones at debug) and cancels the
    build when `cancelled` is set. TensorRT calls it from its own threads."""

    class _Monitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None,
                        num_steps: int) -> None:
            level = logging.INFO if parent_phase is None else logging.DEBUG
            logger.log(level, "%s: TensorRT build: %s (%d steps)", label, phase_name,
                       num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return not cancelled.is_set()  # False asks TensorRT to cancel the build

        def phase_finish(self, phase_name: str) -> None:
            logger.debug("%s: TensorRT build: %s done", label, phase_name)

    return _Monitor()
