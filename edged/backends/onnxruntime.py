"""ONNX Runtime backend: provider chain TensorRT EP → CUDA EP → CPU EP, with what really runs read
back from the session (onnxruntime-gpu silently falls back to CPU when CUDA is missing). On a
GPU provider, inputs already in CUDA memory (the batcher's pool, `edged.hardware.memory`) are
bound by address (IOBinding) instead of being copied by ONNX Runtime."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends.base import BackendOptions, LoadSpec
from edged.backends.profiles import ProfileError, derive_profile, ort_trt_profile_options
from edged.core.errors import ModelLoadError
from edged.hardware import gpu, memory
from edged.model.tensor import TensorSpec

logger = logging.getLogger(__name__)

PROVIDER_NAMES = {
    "tensorrt": "TensorrtExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
}
_OPT_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC",
               "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}
# onnxruntime-gpu without CUDA prints every failed provider library as C++ error lines on
# stderr and, for TensorRT, a Python banner on stdout before retrying. edged silences both
# (severity 4 = fatal only, process-wide; exceptions still carry the details), retries the
# chain itself, and logs one line comparing what was asked with what runs.
_QUIET_SEVERITY = 4


class OrtBackend:
    name = "onnxruntime"

    def __init__(self) -> None:
        import onnxruntime  # fails here, inside the registry, when it is missing

        onnxruntime.set_default_logger_severity(_QUIET_SEVERITY)

    def unavailable_reason(self) -> str | None:
        return None  # the CPU EP is always there

    def load(self, spec: LoadSpec, options: BackendOptions) -> OrtSession:
        return OrtSession(spec, options)

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        # INT8 is slower than FP32 on CPUs without fast INT8 kernels: measure when there is one.
        return None if int8 is not None else ("fp32", f"auto: {why}")


def provider_chain(spec: LoadSpec, options: BackendOptions,
                   available: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """The providers to ask for, best first, with their options; absent ones are left out."""
    chain = []
    for short in options.providers:
        name = PROVIDER_NAMES[short]
        if name not in available:
            continue
        provider_options: dict[str, Any] = {}
        if short == "tensorrt":
            engines = options.cache_dir / "ort-trt" / spec.name / str(spec.version)
            provider_options = {
                "trt_engine_cache_enable": True,
                "trt_engine_cache_path": str(engines),
                "trt_timing_cache_enable": True,
                "trt_timing_cache_path": str(options.cache_dir / "ort-trt"),
                "trt_fp16_enable": spec.precision in ("fp16", "int8"),
                # A Q/DQ file: TensorRT takes the scales from its nodes, no calibration table.
                "trt_int8_enable": spec.precision == "int8",
                "trt_max_workspace_size": options.workspace_mb << 20,
                **_trt_profile_options(spec),
            }
            if options.dla_core is not None:
                # The EP ignores the DLA unless fp16 or int8 is on; DLA cores run no fp32, so
                # fp32 runs fp16 there, as on the TensorRT backend.
                provider_options.update(trt_dla_enable=True, trt_dla_core=options.dla_core,
                                        trt_fp16_enable=True)
        elif short == "cuda":
            provider_options = cuda_options(options)
        chain.append((name, provider_options))
    if not any(name == PROVIDER_NAMES["cpu"] for name, _ in chain):
        chain.append((PROVIDER_NAMES["cpu"], {}))  # never leave a model with nowhere to run
    return chain


def _trt_profile_options(spec: LoadSpec) -> dict[str, str]:
    """The TensorRT backend's profile for the inputs with dynamic dims: the EP then builds
    one engine for every batch the batcher can send, instead of one per new shape. A fixed
    batch dim is not dynamic: an input whose other dims are fixed too gets no profile, one
    with dynamic H/W gets min = opt = max = N rows."""
    try:
        profile = derive_profile(spec)
    except ProfileError as exc:
        logger.info("%s: TensorRT EP without explicit profiles: %s", spec.label, exc)
        return {}
    dynamic = {t.name for t in spec.inputs if any(d < 0 for d in t.shape)}
    return ort_trt_profile_options(tuple(p for p in profile if p.name in dynamic))


def cuda_options(options: BackendOptions) -> dict[str, Any]:
    """CUDA EP options from the daemon config and model.yaml (`onnxruntime:` overrides)."""
    cuda: dict[str, Any] = {}
    if options.gpu_mem_limit_mb is not None:
        cuda["gpu_mem_limit"] = options.gpu_mem_limit_mb << 20
    if options.cudnn_conv_algo_search is not None:
        cuda["cudnn_conv_algo_search"] = options.cudnn_conv_algo_search.upper()
    return cuda


def session_options(options: BackendOptions) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads or (os.cpu_count() or 1)
    so.inter_op_num_threads = options.inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel,
                                          _OPT_LEVELS[options.graph_optimization])
    # Spinning threads of several sessions fight over few cores (PP-OCR det: 62 ms → 178 ms).
    spin = "1" if options.allow_spinning else "0"
    so.add_session_config_entry("session.intra_op.allow_spinning", spin)
    so.add_session_config_entry("session.inter_op.allow_spinning", spin)
    return so


class OrtSession:
    def __init__(self, spec: LoadSpec, options: BackendOptions) -> None:
        import onnxruntime as ort

        self.spec = spec
        chain = provider_chain(spec, options, ort.get_available_providers())
        for name, provider_options in chain:
            if name == PROVIDER_NAMES["tensorrt"]:
                Path(provider_options["trt_engine_cache_path"]).mkdir(parents=True, exist_ok=True)
        self._so, self._chain = session_options(options), chain
        self._fallback_lock = threading.Lock()
        self._session, dropped = _create_session(spec, self._so, chain)
        self.providers: list[str] = list(self._session.get_providers())
        asked = [name for name, _ in chain]
        if self.providers[:1] != asked[:1]:
            logger.warning("%s: asked for %s but runs on %s (%s)", spec.label, ", ".join(asked),
                           ", ".join(self.providers),
                           "; ".join(dropped) or "their libraries or a GPU are missing")
        else:
            logger.info("%s: onnxruntime running on %s", spec.label, ", ".join(self.providers))
        self.inputs = [_spec_of(i) for i in self._session.get_inputs()]
        self.outputs = [_spec_of(o) for o in self._session.get_outputs()]
        self._output_names = [o.name for o in self.outputs]
        self._text = any(i.dtype == np.object_ for i in self.inputs)  # string inputs
        self.nbytes = spec.path.stat().st_size
        self._on_gpu = self.providers[0] in (PROVIDER_NAMES["tensorrt"], PROVIDER_NAMES["cuda"])

    @property
    def ort_session(self) -> Any:
        """The underlying onnxruntime.InferenceSession (IOBinding users, benchmarks)."""
        return self._session

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        session = self._session
        try:
            return self._infer(session, inputs)
        except Exception as exc:  # a lazy TensorRT EP build fails on the first run: EPFail
            if not self._drop_tensorrt(session, exc):
                raise
        return self._infer(self._session, inputs)

    def _infer(self, session: Any, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self._on_gpu:
            placed = device_inputs(inputs)
            if placed is not None:
                return self._run_bound(session, placed)
        # ORT releases the GIL inside run(), so instance threads truly overlap.
        results = session.run(self._output_names,
                              _text_inputs(inputs) if self._text else inputs)
        return dict(zip(self._output_names, results, strict=True))

    def _drop_tensorrt(self, failed: Any, exc: Exception) -> bool:
        """After `failed` (a session on the TensorRT EP) raised from run(): serve on the rest
        of the chain from now on. False when that is not the case (the error stands)."""
        if not _provider_failure(exc) or self.providers[0] != PROVIDER_NAMES["tensorrt"]:
            return False
        with self._fallback_lock:
            if self._session is failed:  # the first thread here rebuilds; others reuse it
                rest = [p for p in self._chain if p[0] != PROVIDER_NAMES["tensorrt"]]
                logger.warning("%s: the TensorRT EP failed at run time (%s); dropping to %s",
                               self.spec.label, str(exc).splitlines()[0][-160:],
                               ", ".join(name for name, _ in rest))
                self._session, _ = _create_session(self.spec, self._so, rest)
                self.providers = list(self._session.get_providers())
                self._on_gpu = self.providers[0] == PROVIDER_NAMES["cuda"]
        return True

    def _run_bound(self, session: Any, placed: Mapping[str, tuple[np.ndarray, int]]
                   ) -> dict[str, np.ndarray]:
        binding = session.io_binding()  # one per call: a binding is not thread-safe
        for name, (array, address) in placed.items():
            binding.bind_input(name, "cuda", 0, array.dtype, list(array.shape), address)
        for name in self._output_names:
            binding.bind_output(name, "cpu")
        session.run_with_iobinding(binding)
        return dict(zip(self._output_names, binding.copy_outputs_to_cpu(), strict=True))

    def close(self) -> None:
        self._session = None


def _text_inputs(inputs: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
    """String inputs (BYTES: object arrays of bytes) as text: ONNX Runtime's Python API turns
    a bytes element into its repr (b'..'), while it reads str as UTF-8, which ONNX strings
    are (the batcher refused elements that are not UTF-8). Its string outputs come back as
    str, which the API sends as UTF-8."""
    if not any(a.dtype == np.object_ for a in inputs.values()):
        return inputs
    converted = dict(inputs)
    for name, array in inputs.items():
        if array.dtype == np.object_:
            text = np.empty(array.shape, dtype=np.object_)
            text.reshape(-1)[:] = [bytes(v).decode() if not isinstance(v, str) else v
                                   for v in array.reshape(-1)]
            converted[name] = text
    return converted


def device_inputs(inputs: Mapping[str, np.ndarray]
                  ) -> dict[str, tuple[np.ndarray, int]] | None:
    """Each input with the CUDA address it can be read at, when every one lies in a mapped or
    pinned buffer (pinned ones are copied to their device mirror first); else None. Managed
    buffers are left to the plain path: ONNX Runtime's streams are not the one they are
    attached to."""
    placed = {}
    pinned = False
    for name, array in inputs.items():
        found = memory.locate(array)
        if found is None or found[0].kind not in ("mapped", "pinned"):
            return None
        buffer, offset = found
        buffer.to_device(0, offset, array.nbytes)
        pinned = pinned or buffer.kind == "pinned"
        placed[name] = (array, buffer.address() + offset)
    if pinned:
        gpu.synchronize(0)  # the copies ran on the default stream; ORT reads on its own
    return placed


def _create_session(spec: LoadSpec, so: Any,
                    chain: list[tuple[str, dict[str, Any]]]) -> tuple[Any, list[str]]:
    """Create the session, dropping a provider whose plugins cannot register (TensorRT without
    its libraries raises RuntimeError before the model is even read) and trying the rest."""
    import onnxruntime as ort

    dropped: list[str] = []
    while True:
        try:
            # enable_fallback=0: no silent retry with a stdout banner; this loop retries.
            return ort.InferenceSession(str(spec.path), so, providers=chain,
                                        enable_fallback=0), dropped
        except Exception as exc:
            # A provider failing (RuntimeError when its libraries are missing, EPFail when the
            # TensorRT EP cannot build an engine, ...) drops to the next; a file ONNX Runtime
            # cannot read fails the load whatever runs it.
            if len(chain) <= 1 or not _provider_failure(exc):
                raise ModelLoadError(f"{spec.path}: ONNX Runtime cannot load it: {exc}") from exc
            dropped.append(f"{chain[0][0]} failed: {str(exc).splitlines()[0][-160:]}")
            chain = chain[1:]


# ORT's pybind exceptions that say the model or file is bad, not the provider.
_MODEL_ERRORS = ("InvalidProtobuf", "NoSuchFile", "NoModel", "InvalidGraph", "InvalidArgument")


def _provider_failure(exc: Exception) -> bool:
    """Whether `exc` is a provider's failure (worth trying the next one): a RuntimeError, or
    one of ORT's pybind exceptions (EPFail, Fail, RuntimeException, EngineError, ...; none of
    them RuntimeErrors) other than those about the model itself."""
    if isinstance(exc, RuntimeError):
        return True
    kind = type(exc)
    return kind.__module__.endswith("onnxruntime_pybind11_state") and \
        kind.__name__ not in _MODEL_ERRORS


_ORT_TYPES = {
    "tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
    "tensor(int8)": np.int8, "tensor(uint8)": np.uint8, "tensor(int16)": np.int16,
    "tensor(uint16)": np.uint16, "tensor(int32)": np.int32, "tensor(int64)": np.int64,
    "tensor(uint32)": np.uint32, "tensor(uint64)": np.uint64, "tensor(bool)": np.bool_,
    "tensor(string)": np.object_,
}


def _spec_of(node: Any) -> TensorSpec:
    dims = tuple(d if isinstance(d, int) and d > 0 else -1 for d in node.shape)
    return TensorSpec(node.name, np.dtype(_ORT_TYPES.get(node.type, np.float32)), dims)
