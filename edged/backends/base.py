"""The small contract every backend meets: `load(spec, options) -> Session`, `Session.infer`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from edged.model.tensor import TensorSpec, fixed_batch


@dataclass(frozen=True)
class ShapeRange:
    """The dims (without the batch dim) an input with dynamic dims may take: TensorRT builds
    for min..max and tunes for opt."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class LoadSpec:
    """What a backend needs to load one version of one model."""

    name: str
    version: int
    path: Path  # the ONNX file to load (model.onnx or model.int8.onnx)
    inputs: tuple[TensorSpec, ...]  # first dim -1, or N for a graph whose batch is fixed
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int  # 0 = no batch dim
    precision: str = "fp32"  # fp32 | fp16 | int8
    # What the batcher will send, for engines built ahead of time (TensorRT profiles):
    opt_batch_size: int = 0  # the batch size to tune for; 0 = max_batch_size
    instances: int = 1  # execution contexts that may run at once
    shape_ranges: Mapping[str, ShapeRange] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.version}"

    @property
    def fixed_batch(self) -> int | None:
        """N when the graph's batch dim is fixed: every batch it is sent has exactly N rows."""
        return fixed_batch(self.max_batch_size, self.inputs)


@dataclass(frozen=True)
class BackendOptions:
    """Machine-level knobs, merged from the daemon config and the model's overrides."""

    providers: tuple[str, ...] = ("tensorrt", "cuda", "cpu")
    intra_op_threads: int = 0  # 0 = one per core here; the loader times 1 against it first
    inter_op_threads: int = 1
    allow_spinning: bool = False
    graph_optimization: str = "all"
    cache_dir: Path = field(default_factory=lambda: Path("/var/cache/edged"))
    memory: str = "auto"  # auto | mapped | managed | pinned | host (edged.hardware.memory)
    workspace_mb: int = 1024  # TensorRT builder workspace (the backend and ORT's TensorRT EP)
    dla_core: int | None = None  # Jetson: build TensorRT engines for this DLA core
    dla_gpu_fallback: bool = True  # on a DLA: layers it cannot run go to the GPU
    gpu_mem_limit_mb: int | None = None  # ORT CUDA EP arena limit; None = no limit
    cudnn_conv_algo_search: str | None = None  # ORT CUDA EP: exhaustive | heuristic | default


@runtime_checkable
class Session(Protocol):
    """A loaded model. `infer` may be called from several worker threads at once and returns
    arrays the caller owns (a backend that reuses output buffers copies out)."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    providers: list[str]  # what really runs, e.g. ["CPUExecutionProvider"]
    nbytes: int  # estimate charged to the cache budget

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


class Backend(Protocol):
    name: str  # "tensorrt" | "onnxruntime"

    def unavailable_reason(self) -> str | None:
        """None when usable on this machine, else why not (one line)."""
        ...

    def load(self, spec: LoadSpec, options: BackendOptions) -> Session: ...

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        """What `precision: auto` takes on this backend without timing anything, as (precision,
        reason): `int8` means the accepted INT8 variant `int8`, any other precision model.onnx.
        None: time FP32 against the INT8 variant on the real sessions and take the faster.
        `why` says why `int8` is what it is (None: no accepted variant)."""
        ...


class FallBack(Exception):
    """Raised by `Backend.load` when this backend cannot serve the model, but `fallback` can:
    the cache loads it there instead. `upgrade`, when set, completes once a load on this
    backend would succeed (an engine built in the background) or carries why it never will;
    the cache then swaps the model onto this backend."""

    def __init__(self, reason: str, *, fallback: str = "onnxruntime",
                 upgrade: Future[None] | None = None) -> None:
        super().__init__(reason)
        self.fallback = fallback
        self.upgrade = upgrade


class EngineBuilding(FallBack):
    """The engine for this model is being built in the background; `upgrade` completes when
    it is ready (or failed)."""

    def __init__(self, reason: str, upgrade: Future[None], *,
                 fallback: str = "onnxruntime") -> None:
        super().__init__(reason, fallback=fallback, upgrade=upgrade)
