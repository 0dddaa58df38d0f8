"""The TensorRT backend: engines built from ONNX in the background and kept in the engine cache,
run with TensorRT's tensor API (`set_input_shape`, `set_tensor_address`, `execute_async_v3`)
on one execution context and CUDA stream per model instance.

`load()` returns a session when a valid engine is cached. Otherwise it starts (or joins) a
background build and raises `EngineBuilding`: the cache serves the model on ONNX Runtime
meanwhile and swaps it onto TensorRT when the build's future completes. A model TensorRT
cannot take (no profile for its dynamic dims, a failed build, an engine that will not run)
raises `FallBack` and stays on ONNX Runtime. `import tensorrt` happens here only."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import numpy as np

from edged.backends import dla, engine_cache
from edged.backends.base import (
    BackendOptions,
    EngineBuilding,
    FallBack,
    LoadSpec,
)
from edged.backends.engine_cache import EngineFiles, EngineKey
from edged.backends.profiles import ProfileError, derive_profile
from edged.backends.trt_build import (
    BuildPlan,
    build_engine,
    inspect_qdq,
    plan_precision,
    trt_logger,
    weakly_typed,
)
from edged.core.errors import BackendUnavailable, InferenceFailed, InvalidInput
from edged.core.fsutil import file_sha256
from edged.hardware import gpu, memory
from edged.model.tensor import TensorSpec

logger = logging.getLogger(__name__)

CONTEXT_WAIT_S = 60.0  # an infer() finds every context busy only if callers outnumber instances
ALIGNMENT = 256  # TensorRT wants device tensors 256-byte aligned (what cudaMalloc returns)


def _tensorrt() -> ModuleType:
    import tensorrt

    return tensorrt


class TensorRTBackend:
    name = "tensorrt"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._building: dict[str, Future[None]] = {}  # key digest -> the build in flight
        self._failed: dict[str, str] = {}  # key digest -> why its build failed (this process)
        self._build_slot = threading.Lock()  # one build at a time: each wants the whole GPU
        self.cancelled = threading.Event()  # set: builds in flight stop at their next step

    def unavailable_reason(self) -> str | None:
        try:
            _tensorrt()
        except ImportError as exc:
            return f"the tensorrt module is not installed ({exc})"
        return gpu.unavailable_reason()

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        """FP16 is TensorRT's usual floor; INT8 when the variant is TensorRT's kind (signed,
        symmetric Q/DQ)."""
        if int8 is None:
            return "fp16", f"auto on TensorRT: {why}"
        _qdq, refusal = inspect_qdq(int8)
        if refusal is not None:
            return "fp16", ("auto on TensorRT: the INT8 variant is not TensorRT's kind "
                            f"({refusal}; quantize with quantization.symmetric and "
                            "activation_type: int8)")
        return "int8", f"auto on TensorRT: {why}"

    def load(self, spec: LoadSpec, options: BackendOptions) -> TrtSession:
        try:
            trt = _tensorrt()
        except ImportError as exc:
            raise BackendUnavailable(f"tensorrt cannot be imported: {exc}") from exc
        device = gpu.device()
        if device is None:
            raise BackendUnavailable(f"no CUDA device: {gpu.unavailable_reason()}")
        options = dla.resolve(trt, spec.label, options)  # a DLA this machine lacks: the GPU
        try:
            plan, key = self.plan(trt, spec, options, device)  # FallBack: not for TensorRT
        except ProfileError as exc:
            raise FallBack(str(exc)) from exc
        files = engine_cache.files_for(options.cache_dir, spec.name, spec.version, key)
        with self._lock:
            failed, building = self._failed.get(key.digest), self._building.get(key.digest)
        if failed is not None:
            raise FallBack(f"{spec.label}: its TensorRT engine build failed: {failed}")
        if building is not None:
            raise EngineBuilding(f"{spec.label}: its TensorRT engine is being built", building)
        engine = engine_cache.read_engine(files, key)
        if engine is not None:
            try:
                return TrtSession(trt, spec, options, engine, plan.precision.precision)
            except StaleEngine as exc:
                logger.warning("%s: %s; rebuilding it", spec.label, exc)
                engine_cache.discard(files)
            except Exception as exc:  # TensorRT or CUDA refusing: serve elsewhere, never crash
                logger.exception("%s: the TensorRT engine cannot run", spec.label)
                raise FallBack(f"{spec.label}: the TensorRT engine cannot run: {exc}") from exc
        return self._raise_building(trt, plan, key, files, options)

    def plan(self, trt: Any, spec: LoadSpec, options: BackendOptions,
             device: gpu.Device) -> tuple[BuildPlan, EngineKey]:
        """What would be built for `spec` here, and the engine cache key naming it."""
        sha = file_sha256(spec.path)
        has_qdq, refused = _qdq(spec, sha)
        if refused is not None:
            raise FallBack(f"{spec.label}: TensorRT runs symmetric INT8 Q/DQ only (int8, zero "
                           f"points 0), and in {spec.path.name} {refused}")
        precision = plan_precision(spec.precision, has_qdq=has_qdq,
                                   weak_typing=weakly_typed(trt),
                                   dla=options.dla_core is not None,
                                   gpu_fallback=options.dla_gpu_fallback)
        profile = derive_profile(spec)
        # Contexts running at once need a profile each when shapes vary (TensorRT binds the
        # shapes to the profile); with fixed shapes they share one, and the engine stays one
        # engine whatever the instance count.
        fixed = all(p.min == p.max for p in profile)
        profiles = (profile,) * (1 if fixed else max(spec.instances, 1))
        # The flags carry GPU_FALLBACK too: a DLA engine without it is another engine.
        flags = precision.flags + tuple(f"-{f}" for f in precision.cleared)
        key = EngineKey(sha, str(trt.__version__), device.name, device.compute_capability,
                        precision.precision, profiles, options.dla_core, options.workspace_mb,
                        flags)
        return BuildPlan(spec, precision, profiles,
                         engine_cache.timing_cache_path(options.cache_dir, key)), key

    def _raise_building(self, trt: Any, plan: BuildPlan, key: EngineKey, files: EngineFiles,
                        options: BackendOptions) -> NoReturn:
        """Start the engine's build (or find it running) and say so with EngineBuilding."""
        with self._lock:
            future = self._building.get(key.digest)
            if future is None:
                future = Future()
                future.set_running_or_notify_cancel()
                self._building[key.digest] = future
                threading.Thread(target=self._build, args=(trt, plan, key, files, options,
                                                           future),
                                 name=f"edged-trt-build-{plan.spec.name}", daemon=True).start()
        raise EngineBuilding(f"{plan.spec.label}: building its TensorRT engine in the "
                             f"background ({plan.precision.precision})", future)

    def _build(self, trt: Any, plan: BuildPlan, key: EngineKey, files: EngineFiles,
               options: BackendOptions, future: Future[None]) -> None:
        label = plan.spec.label
        try:
            with self._build_slot:
                if plan.precision.note:
                    logger.warning("%s: %s", label, plan.precision.note)
                started = time.monotonic()
                engine = build_engine(trt, plan, options, self.cancelled)
                engine_cache.write_engine(files, key, engine, label=label,
                                          build_seconds=time.monotonic() - started,
                                          note=plan.precision.note)
        except Exception as exc:  # TensorRT's errors, a full disk: the model stays where it is
            logger.exception("%s: the TensorRT engine build failed; it stays on its fallback",
                             label)
            with self._lock:
                self._failed[key.digest] = (str(exc).splitlines() or [type(exc).__name__])[0]
                self._building.pop(key.digest, None)
            future.set_exception(exc)
            return
        with self._lock:  # before the callbacks run: their load must find the engine, not this
            self._building.pop(key.digest, None)
        future.set_result(None)


_qdq_memo: dict[str, tuple[bool, str | None]] = {}  # file sha256 -> inspect_qdq's answer


def _qdq(spec: LoadSpec, sha: str) -> tuple[bool, str | None]:
    if sha not in _qdq_memo:
        _qdq_memo[sha] = inspect_qdq(spec.path)
    return _qdq_memo[sha]


# -- running ----------------------------------------------------------------------------------
class StaleEngine(RuntimeError):
    """The engine file cannot be deserialized here (another TensorRT or GPU, or damaged)."""


@dataclass
class _Slot:
    """One execution context with its stream and profile, and the buffers it runs through:
    staging for inputs that arrive in plain memory, and outputs."""

    context: Any
    stream: int
    profile: int
    staged: dict[str, memory.DeviceBuffer] = field(default_factory=dict)
    outputs: dict[str, memory.DeviceBuffer] = field(default_factory=dict)


class TrtSession:
    """A deserialized engine and one slot per instance; `infer` checks a slot out, so instance
    threads run at once, each on its own context and stream."""

    def __init__(self, trt: Any, spec: LoadSpec, options: BackendOptions, plan: bytes,
                 precision: str) -> None:
        self.spec = spec
        self._runtime = trt.Runtime(trt_logger(trt))
        if options.dla_core is not None:
            self._runtime.DLA_core = options.dla_core
        try:
            engine = self._runtime.deserialize_cuda_engine(plan)
        except Exception as exc:  # pybind's RuntimeError and kin
            raise StaleEngine(f"TensorRT could not deserialize its engine: {exc}") from exc
        if engine is None:
            raise StaleEngine("TensorRT could not deserialize its engine (built by another "
                              "TensorRT or for another GPU, or damaged)")
        self._engine = engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        specs = [TensorSpec(n, np.dtype(trt.nptype(engine.get_tensor_dtype(n))),
                            tuple(engine.get_tensor_shape(n))) for n in names]
        is_input = [engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names]
        self.inputs = [s for s, i in zip(specs, is_input, strict=True) if i]
        self.outputs = [s for s, i in zip(specs, is_input, strict=True) if not i]
        # Shape tensors live on the host: TensorRT reads them at enqueue, from host memory.
        self._on_host = {n: engine.get_tensor_location(n) == trt.TensorLocation.HOST
                         for n in names}
        self.providers = [f"TensorRT {trt.__version__} {precision}" + dla.shown(options)]
        self._kind = memory.device_kind(options.memory)
        self._slots: queue.Queue[_Slot] = queue.Queue()
        self._all: list[_Slot] = []
        try:
            for i in range(max(spec.instances, 1)):
                self._all.append(self._new_slot(i))
        except Exception:
            self.close()
            raise
        for slot in self._all:
            self._slots.put(slot)
        # Each context's scratch memory (device_memory_size_v2 from TensorRT 10 on).
        scratch = getattr(engine, "device_memory_size_v2", None) or getattr(
            engine, "device_memory_size", 0)
        self.nbytes = len(plan) + len(self._all) * int(scratch or 0)

    def _new_slot(self, index: int) -> _Slot:
        context = self._engine.create_execution_context()
        if context is None:
            raise RuntimeError("TensorRT could not create an execution context (GPU memory?)")
        stream = gpu.create_stream()
        slot = _Slot(context, stream, index % max(self._engine.num_optimization_profiles, 1))
        if self._engine.num_optimization_profiles > 1 and \
                not context.set_optimization_profile_async(slot.profile, stream):
            raise RuntimeError(f"TensorRT refused optimisation profile {slot.profile}")
        return slot

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            slot = self._slots.get(timeout=CONTEXT_WAIT_S)
        except queue.Empty:
            raise InferenceFailed(f"{self.spec.label}: no TensorRT execution context came "
                                  f"free in {CONTEXT_WAIT_S:.0f}s") from None
        try:
            return self._run(slot, inputs)
        finally:
            self._slots.put(slot)

    def _run(self, slot: _Slot, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        context, stream = slot.context, slot.stream
        held: list[np.ndarray] = []  # host inputs TensorRT reads at enqueue: alive until then
        lent: list[memory.DeviceBuffer] = []  # pool buffers to give back to the CPU after
        for tensor in self.inputs:
            if tensor.name not in inputs:
                raise InvalidInput(f"{self.spec.label}: input {tensor.name} is missing")
            array = np.ascontiguousarray(inputs[tensor.name], dtype=tensor.dtype)
            if not context.set_input_shape(tensor.name, array.shape):
                raise InvalidInput(f"{self.spec.label}: input {tensor.name} of shape "
                                   f"{list(array.shape)} is outside the engine's profile")
            held.append(array)
            self._address(context, tensor.name, self._upload(slot, tensor.name, array, lent))
        shapes = {}
        for tensor in self.outputs:
            shape = tuple(context.get_tensor_shape(tensor.name))
            if any(d < 0 for d in shape):
                raise InferenceFailed(f"{self.spec.label}: output {tensor.name} has a "
                                      f"data-dependent shape {list(shape)}; not supported")
            shapes[tensor.name] = shape
            nbytes = int(np.prod(shape)) * tensor.dtype.itemsize
            buffer = self._buffer(slot.outputs, tensor.name, nbytes)
            if self._on_host[tensor.name]:
                self._address(context, tensor.name, buffer.host_ptr)
                continue
            buffer.attach(stream)
            self._address(context, tensor.name, buffer.address())
        if not context.execute_async_v3(stream):
            raise InferenceFailed(f"{self.spec.label}: TensorRT could not enqueue the batch")
        del held  # enqueued: TensorRT has read the host inputs
        for tensor in self.outputs:
            if not self._on_host[tensor.name]:
                slot.outputs[tensor.name].to_host(
                    stream, 0, int(np.prod(shapes[tensor.name])) * tensor.dtype.itemsize)
        for buffer in lent:  # managed: back to the host, or the worker's next write faults
            buffer.detach(stream)
        gpu.synchronize(stream)
        # Copies: the slot's buffers are reused by the next batch, and callers own outputs.
        return {t.name: slot.outputs[t.name].view(shapes[t.name], t.dtype).copy()
                for t in self.outputs}

    def _address(self, context: Any, name: str, address: int) -> None:
        if not context.set_tensor_address(name, address):
            raise InferenceFailed(f"{self.spec.label}: TensorRT refused the address "
                                  f"{address:#x} of {name}")

    def _upload(self, slot: _Slot, name: str, array: np.ndarray,
                lent: list[memory.DeviceBuffer]) -> int:
        """The address TensorRT reads `array` at: a host one for a HOST tensor; else in place
        when it lies, aligned, in a CUDA buffer (the batcher's pool), else through this
        slot's staging buffer (the one copy)."""
        found = memory.locate(array)
        if self._on_host[name]:
            return int(array.ctypes.data)  # pool buffers are host memory too
        if found is not None and (found[0].address() + found[1]) % ALIGNMENT == 0:
            buffer, offset = found
            lent.append(buffer)
        else:
            buffer, offset = self._buffer(slot.staged, name, array.nbytes), 0
            buffer.view(array.shape, array.dtype)[...] = array
        buffer.to_device(slot.stream, offset, array.nbytes)
        return buffer.address() + offset

    def _buffer(self, store: dict[str, memory.DeviceBuffer], name: str,
                nbytes: int) -> memory.DeviceBuffer:
        buffer = store.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            grown = nbytes
            if buffer is not None:  # batches grow a step at a time: double, not step
                grown = max(nbytes, 2 * buffer.nbytes)
                buffer.free()
            buffer = store[name] = memory.allocate(self._kind, grown)
        return buffer

    def close(self) -> None:
        for slot in self._all:
            for buffer in [*slot.staged.values(), *slot.outputs.values()]:
                try:
                    buffer.free()
                except gpu.CudaError as exc:
                    logger.warning("%s: freeing a buffer failed: %s", self.spec.label, exc)
            try:
                gpu.destroy_stream(slot.stream)
            except gpu.CudaError as exc:
                logger.warning("%s: destroying a stream failed: %s", self.spec.label, exc)
            slot.context = None
        self._all.clear()
        self._engine = None
