"""The small contract every backend meets: `load(spec, options) -> Session`, `Session.infer`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # -1 for a dynamic dim; the batch dim included when batched

    def describe(self) -> str:
        return f"{self.name}: {self.dtype} {list(self.shape)}"


@dataclass(frozen=True)
class LoadSpec:
    """What a backend needs to load one version of one model."""

    name: str
    version: int
    path: Path  # the ONNX file to load (model.onnx or model.int8.onnx)
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int  # 0 = no batch dim
    precision: str = "fp32"  # fp32 | fp16 | int8

    @property
    def label(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class BackendOptions:
    """Machine-level knobs, merged from the daemon config and the model's overrides."""

    providers: tuple[str, ...] = ("tensorrt", "cuda", "cpu")
    intra_op_threads: int = 0  # 0 = one per core
    inter_op_threads: int = 1
    allow_spinning: bool = False
    graph_optimization: str = "all"
    cache_dir: Path = field(default_factory=lambda: Path("/var/cache/edged"))


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
