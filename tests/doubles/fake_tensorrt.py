"""A double of the `tensorrt` Python module (10.x, or 11.x without precision flags), covering
the calls edged makes: Builder/OnnxParser/BuilderConfig/optimisation profiles/timing cache/
IProgressMonitor to build, Runtime/ICudaEngine/IExecutionContext to run.

A "built" engine is bytes: a magic, a JSON header (version, flags, profiles) and the ONNX
file itself. `Runtime.deserialize_cuda_engine` returns None for anything else, or for an
engine of another version, as the real one does for a foreign plan. Contexts run the ONNX
file on ONNX Runtime's CPU EP, reading inputs from and writing outputs to the addresses set
with `set_tensor_address` (real memory: see fake_cudart), so outputs can be compared.

With fake_cudart installed it enforces what the real runtime does: device tensors need
256-byte aligned addresses the GPU can reach from the launching stream (managed memory's
attach rules included), HOST-location tensors (`Knobs.host_tensors`: shape tensors) need host
addresses and are read at enqueue, and the kernel runs in stream order when the stream is
synchronized. Classes record the surface edged uses (doubles.surface), which tests/gpu_api
holds against the real bindings."""

from __future__ import annotations

import base64
import ctypes
import enum
import json
import sys
import threading
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from doubles import fake_cudart
from doubles.surface import Recorded

MAGIC = b"FAKETRT1"


class DataType(enum.IntEnum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    INT64 = 8


_NP = {DataType.FLOAT: np.float32, DataType.HALF: np.float16, DataType.INT8: np.int8,
       DataType.INT32: np.int32, DataType.BOOL: np.bool_, DataType.INT64: np.int64}
_FROM_ONNX = {onnx.TensorProto.FLOAT: DataType.FLOAT, onnx.TensorProto.FLOAT16: DataType.HALF,
              onnx.TensorProto.INT8: DataType.INT8, onnx.TensorProto.INT32: DataType.INT32,
              onnx.TensorProto.INT64: DataType.INT64, onnx.TensorProto.BOOL: DataType.BOOL}


class TensorIOMode(enum.IntEnum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class TensorLocation(enum.IntEnum):
    DEVICE = 0
    HOST = 1


class MemoryPoolType(enum.IntEnum):
    WORKSPACE = 0


class DeviceType(enum.IntEnum):
    GPU = 0
    DLA = 1


class ILogger:
    class Severity(enum.IntEnum):
        INTERNAL_ERROR = 0
        ERROR = 1
        WARNING = 2
        INFO = 3
        VERBOSE = 4

    def __init__(self) -> None:
        pass


class IProgressMonitor:
    def __init__(self) -> None:
        pass


@dataclass
class Knobs:
    """What a test controls and observes across the module."""

    version: str = "10.13.0"
    weak_typing: bool = True  # TensorRT 10: FP16/INT8 builder flags exist
    fail_build: bool = False  # build_serialized_network returns None
    dla_cores: int = 0  # Builder.num_DLA_cores: 0 on a discrete GPU, 2 on an AGX Orin
    build_gate: threading.Event | None = None  # set to let builds finish
    run_barrier: threading.Barrier | None = None  # contexts meet here inside execute
    builds: list[dict[str, Any]] = field(default_factory=list)
    runs: list[tuple[int, int, str]] = field(default_factory=list)  # (context id, stream, thread)
    phases: list[str] = field(default_factory=list)
    timing_caches_loaded: list[bytes] = field(default_factory=list)
    host_tensors: set[str] = field(default_factory=set)  # tensors whose location is HOST
    faults: list[str] = field(default_factory=list)  # what the real runtime would refuse
    lock: threading.Lock = field(default_factory=threading.Lock)


# -- building ---------------------------------------------------------------------------------
@dataclass
class ITensor(Recorded):
    name: str
    shape: tuple[int, ...]
    dtype: DataType


class INetworkDefinition(Recorded):
    def __init__(self) -> None:
        self.inputs: list[ITensor] = []
        self.outputs: list[ITensor] = []
        self.onnx = b""

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, i: int) -> ITensor:
        return self.inputs[i]


def _tensors(values: Any) -> list[ITensor]:
    out = []
    for v in values:
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1
                     for d in v.type.tensor_type.shape.dim)
        out.append(ITensor(v.name, dims, _FROM_ONNX[v.type.tensor_type.elem_type]))
    return out


class OnnxParser(Recorded):
    def __init__(self, network: INetworkDefinition, logger: ILogger) -> None:
        self.network = network
        self.errors: list[str] = []

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    def get_error(self, i: int) -> str:
        return self.errors[i]

    def parse_from_file(self, path: str) -> bool:
        try:
            data = Path(path).read_bytes()
            model = onnx.load_from_string(data)
            onnx.checker.check_model(model)
        except Exception as exc:
            self.errors.append(f"ModelImporter: {exc}")
            return False
        init = {i.name for i in model.graph.initializer}
        self.network.inputs = _tensors(v for v in model.graph.input if v.name not in init)
        self.network.outputs = _tensors(model.graph.output)
        self.network.onnx = data
        return True


class IOptimizationProfile(Recorded):
    def __init__(self) -> None:
        self.shapes: dict[str, list[list[int]]] = {}

    def set_shape(self, name: str, min: Any, opt: Any, max: Any) -> None:
        self.shapes[name] = [list(min), list(opt), list(max)]


class ITimingCache(Recorded):
    def __init__(self, entries: int) -> None:
        self.entries = entries

    def serialize(self) -> bytes:
        return b"TC" + str(self.entries).encode()


class IBuilderConfig(Recorded):
    def __init__(self, knobs: Knobs) -> None:
        self.knobs = knobs
        self.flags: list[Any] = []
        self.pools: dict[MemoryPoolType, int] = {}
        self.profiles: list[IOptimizationProfile] = []
        self.timing_cache: ITimingCache | None = None
        self.progress_monitor: IProgressMonitor | None = None
        self.default_device_type = DeviceType.GPU
        self.DLA_core = -1

    def set_memory_pool_limit(self, pool: MemoryPoolType, size: int) -> None:
        self.pools[pool] = size

    def set_flag(self, flag: Any) -> None:
        self.flags.append(flag)

    def clear_flag(self, flag: Any) -> None:
        self.flags = [f for f in self.flags if f != flag]
        self.cleared = [*getattr(self, "cleared", []), flag]

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, data: bytes) -> ITimingCache:
        with self.knobs.lock:
            self.knobs.timing_caches_loaded.append(bytes(data))
        if data and not data.startswith(b"TC"):
            raise RuntimeError("timing cache: bad header")
        return ITimingCache(int(data[2:]) if data else 0)

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self.timing_cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache | None:
        return self.timing_cache


class Builder(Recorded):
    knobs: Knobs  # set on the module's class

    def __init__(self, logger: ILogger) -> None:
        self.logger = logger

    @property
    def num_DLA_cores(self) -> int:
        return self.knobs.dla_cores

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition()

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig(self.knobs)

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_serialized_network(self, network: INetworkDefinition,
                                 config: IBuilderConfig) -> bytes | None:
        knobs, monitor = self.knobs, config.progress_monitor
        if monitor is not None:
            monitor.phase_start("Building engine", None, 2)
            with knobs.lock:
                knobs.phases.append("Building engine")
        if knobs.build_gate is not None and not knobs.build_gate.wait(10):
            raise RuntimeError("test build gate never opened")
        if monitor is not None:
            keep_going = monitor.step_complete("Building engine", 0)
            monitor.phase_finish("Building engine")
            if not keep_going:
                return None
        header = {"version": knobs.version, "flags": [f.name for f in config.flags],
                  "cleared": [f.name for f in getattr(config, "cleared", [])],
                  "profiles": [p.shapes for p in config.profiles],
                  "workspace": config.pools.get(MemoryPoolType.WORKSPACE),
                  "dla_core": config.DLA_core if config.default_device_type == DeviceType.DLA
                  else None,
                  "inputs": [[t.name, list(t.shape), int(t.dtype)] for t in network.inputs],
                  "outputs": [[t.name, list(t.shape), int(t.dtype)] for t in network.outputs],
                  "onnx": base64.b64encode(network.onnx).decode()}
        with knobs.lock:
            knobs.builds.append(header)
        if knobs.fail_build:
            return None
        if config.timing_cache is not None:
            config.timing_cache.entries += 1
        blob = json.dumps(header).encode()
        return MAGIC + len(blob).to_bytes(4, "little") + blob


# -- running ----------------------------------------------------------------------------------
class Runtime(Recorded):
    knobs: Knobs

    def __init__(self, logger: ILogger) -> None:
        self.DLA_core = -1

    def deserialize_cuda_engine(self, data: bytes) -> ICudaEngine | None:
        if not data.startswith(MAGIC):
            return None
        size = int.from_bytes(data[8:12], "little")
        try:
            header = json.loads(data[12:12 + size])
        except ValueError:
            return None
        if header.get("version") != self.knobs.version or len(data) != 12 + size:
            return None
        return ICudaEngine(header, self.knobs)


class ICudaEngine(Recorded):
    def __init__(self, header: dict[str, Any], knobs: Knobs) -> None:
        self.header, self.knobs = header, knobs
        self.tensors = {name: (tuple(shape), DataType(dt), TensorIOMode.INPUT)
                        for name, shape, dt in header["inputs"]}
        self.tensors.update({name: (tuple(shape), DataType(dt), TensorIOMode.OUTPUT)
                             for name, shape, dt in header["outputs"]})
        self.names = list(self.tensors)
        self.device_memory_size_v2 = 1 << 20
        import onnxruntime

        self.session = onnxruntime.InferenceSession(base64.b64decode(header["onnx"]),
                                                    providers=["CPUExecutionProvider"])

    @property
    def num_io_tensors(self) -> int:
        return len(self.names)

    @property
    def num_optimization_profiles(self) -> int:
        return max(len(self.header["profiles"]), 1)

    def get_tensor_name(self, i: int) -> str:
        return self.names[i]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self.tensors[name][2]

    def get_tensor_dtype(self, name: str) -> DataType:
        return self.tensors[name][1]

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name][0]

    def get_tensor_location(self, name: str) -> TensorLocation:
        return TensorLocation.HOST if name in self.knobs.host_tensors else TensorLocation.DEVICE

    def create_execution_context(self) -> IExecutionContext:
        return IExecutionContext(self)


class IExecutionContext(Recorded):
    def __init__(self, engine: ICudaEngine) -> None:
        self.engine = engine
        self.profile = 0
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self._out_shapes: dict[str, tuple[int, ...]] = {}

    def set_optimization_profile_async(self, index: int, stream: int) -> bool:
        self.profile = index
        return 0 <= index < self.engine.num_optimization_profiles

    def set_input_shape(self, name: str, shape: Any) -> bool:
        shape = tuple(shape)
        profiles = self.engine.header["profiles"]
        if profiles:
            low, _opt, high = profiles[self.profile][name]
            if len(shape) != len(low) or not all(
                    lo <= d <= hi for lo, d, hi in zip(low, shape, high, strict=True)):
                return False
        elif shape != self.engine.tensors[name][0]:
            return False
        self.shapes[name] = shape
        self._out_shapes = {}
        return True

    def _run_onnx(self) -> dict[str, np.ndarray]:
        """Output shapes come from a run on zeros of the set input shapes (the inputs' bytes
        may not be on the device yet: copies are asynchronous)."""
        feeds = {n: np.zeros(self.shapes[n], _NP[t[1]])
                 for n, t in self.engine.tensors.items() if t[2] == TensorIOMode.INPUT}
        return self._compute({}, {}, feeds)

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        if name in self.shapes:
            return self.shapes[name]
        if not self._out_shapes:
            self._out_shapes = {k: v.shape for k, v in self._run_onnx().items()}
        return self._out_shapes[name]

    def set_tensor_address(self, name: str, address: int) -> bool:
        if name not in self.engine.tensors:
            return False
        if self.engine.get_tensor_location(name) == TensorLocation.DEVICE and \
                address % fake_cudart.ALIGNMENT:
            self.engine.knobs.faults.append(f"{name}: address {address:#x} is not 256-byte "
                                            "aligned")
            return False  # TensorRT logs an error and refuses it
        self.addresses[name] = address
        return True

    def _refusal(self, stream: int) -> str | None:
        """Why the real runtime would fault on these addresses, with fake_cudart installed."""
        cuda = fake_cudart.current
        if cuda is None:
            return None
        for name in self.engine.names:
            if name not in self.addresses:
                return f"{name} has no address"
            address = self.addresses[name]
            found = cuda.kind_of(address)
            if self.engine.get_tensor_location(name) == TensorLocation.HOST:
                if found is not None and found[0] == "device":
                    return f"{name} is a HOST tensor but was given device memory {address:#x}"
            else:
                why = cuda.gpu_access(address, stream)
                if why is not None:
                    return f"{name}: {why}"
        return None

    def execute_async_v3(self, stream_handle: int) -> bool:
        knobs = self.engine.knobs
        with knobs.lock:
            knobs.runs.append((id(self), stream_handle, threading.current_thread().name))
        if knobs.run_barrier is not None:
            knobs.run_barrier.wait(5)
        refusal = self._refusal(stream_handle)
        if refusal is not None:
            knobs.faults.append(refusal)
            return False
        # HOST tensors are read now (at enqueue); device ones when the stream runs the kernel.
        host = {n: self._read(n) for n in self.engine.names if n in knobs.host_tensors}
        addresses, shapes = dict(self.addresses), dict(self.shapes)

        def kernel() -> None:
            outputs = self._compute(addresses, shapes, host)
            for name, value in outputs.items():
                ctypes.memmove(addresses[name], value.ctypes.data, value.nbytes)

        if fake_cudart.current is None:
            kernel()
        else:
            fake_cudart.current.enqueue(stream_handle, kernel)
        return True

    def _read(self, name: str, addresses: dict[str, int] | None = None,
              shapes: dict[str, tuple[int, ...]] | None = None) -> np.ndarray:
        addresses, shapes = addresses or self.addresses, shapes or self.shapes
        shape, dtype = shapes[name], _NP[self.engine.tensors[name][1]]
        count = int(np.prod(shape))
        raw = (ctypes.c_uint8 * max(count * np.dtype(dtype).itemsize, 1)).from_address(
            addresses[name])
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape).copy()

    def _compute(self, addresses: dict[str, int], shapes: dict[str, tuple[int, ...]],
                 host: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {n: host[n] if n in host else self._read(n, addresses, shapes)
                 for n, t in self.engine.tensors.items() if t[2] == TensorIOMode.INPUT}
        names = [n for n, t in self.engine.tensors.items() if t[2] == TensorIOMode.OUTPUT]
        return dict(zip(names, self.engine.session.run(names, feeds), strict=True))


def nptype(dtype: DataType) -> type:
    return _NP[dtype]


def make_module(knobs: Knobs) -> types.ModuleType:
    mod = types.ModuleType("tensorrt")
    mod.__version__ = knobs.version
    flags = ["GPU_FALLBACK", "REFIT", "TF32"] + (["FP16", "INT8"] if knobs.weak_typing
                                                 else [])
    mod.BuilderFlag = enum.Enum("BuilderFlag", flags)
    builder = type("Builder", (Builder,), {"knobs": knobs})
    runtime = type("Runtime", (Runtime,), {"knobs": knobs})
    for name, value in {"Builder": builder, "Runtime": runtime, "OnnxParser": OnnxParser,
                        "ILogger": ILogger, "IProgressMonitor": IProgressMonitor,
                        "DataType": DataType, "TensorIOMode": TensorIOMode,
                        "MemoryPoolType": MemoryPoolType, "DeviceType": DeviceType,
                        "TensorLocation": TensorLocation,
                        "nptype": nptype, "knobs": knobs}.items():
        setattr(mod, name, value)
    return mod


def install(monkeypatch: pytest.MonkeyPatch, knobs: Knobs | None = None) -> Knobs:
    knobs = knobs or Knobs()
    monkeypatch.setitem(sys.modules, "tensorrt", make_module(knobs))
    return knobs
