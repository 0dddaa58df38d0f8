"""What a backend is handed for a model version: the options (the daemon's, with the model's
overrides), the load spec (file, precision, signature, and the batcher's hints for backends
that build ahead), and the inputs that warm it up. Pure functions of config and model."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import BackendOptions, LoadSpec, ShapeRange
from edged.backends.config import OrtConfig, TensorRTConfig
from edged.backends.profiles import opt_batch_size
from edged.inference.instances import instance_count
from edged.model.repository import ModelVersion


def options_for(model: ModelVersion, base: BackendOptions) -> BackendOptions:
    """The daemon's options with the model's own `onnxruntime:` overrides and its
    `tensorrt: {dla_core, gpu_fallback}` from model.yaml."""
    o = model.config.onnxruntime
    changes: dict[str, Any] = {k: v for k, v in dataclasses.asdict(o).items() if v is not None}
    if "providers" in changes:
        changes["providers"] = tuple(changes["providers"])
    trt = model.config.tensorrt
    if trt.dla_core is not None:
        changes["dla_core"] = trt.dla_core
    changes["dla_gpu_fallback"] = trt.gpu_fallback
    return dataclasses.replace(base, **changes)


def backend_options(ort: OrtConfig, cache_dir: Path, *, memory: str = "auto",
                    tensorrt: TensorRTConfig | None = None) -> BackendOptions:
    """The daemon's backend settings as backend options."""
    trt = tensorrt or TensorRTConfig()
    return BackendOptions(tuple(ort.providers), ort.intra_op_threads, ort.inter_op_threads,
                          ort.allow_spinning, ort.graph_optimization, cache_dir, memory=memory,
                          workspace_mb=trt.workspace_mb, dla_core=trt.dla_core)


def load_spec(model: ModelVersion, path: Path | None = None,
              precision: str = "fp32") -> LoadSpec:
    """What a backend loads: `path` (default model.onnx) at `precision`, with the model's
    signature and the batcher's hints."""
    return LoadSpec(model.name, model.version, path or model.onnx_path, model.inputs,
                    model.outputs, model.max_batch_size, precision, **engine_hints(model))


def engine_hints(model: ModelVersion) -> dict[str, Any]:
    """What the batcher will send the model, for backends that build ahead (TensorRT
    profiles): the batch size to tune for, the instances, dynamic dims' ranges."""
    batching = model.config.batching_params
    preferred = batching.preferred_batch_sizes if batching else []
    ranges = {name: ShapeRange(tuple(r.min), tuple(r.opt), tuple(r.max))
              for name, r in model.config.tensorrt.shapes.items()}
    # A fixed batch dim leaves nothing to tune: every batch is padded to it.
    opt = model.fixed_batch or opt_batch_size(model.max_batch_size, preferred)
    return {"opt_batch_size": opt,
            # Only TensorRT builds per instance (a context each), and it runs on the GPU.
            "instances": instance_count(model.config.instances, on_gpu=True),
            "shape_ranges": ranges}


def warmup_inputs(model: ModelVersion) -> dict[str, np.ndarray]:
    """Zeros of the declared shapes: batch dim from warmup.batch_size (the graph's own size
    when its batch dim is fixed: the session is run directly, with no batcher to pad), dynamic
    dims from warmup.shapes or 32 (a size most vision graphs accept)."""
    warm = model.config.warmup
    batch = model.fixed_batch or (
        min(warm.batch_size, model.max_batch_size) if model.max_batch_size else None)
    inputs = {}
    for spec in model.inputs:
        dims = list(spec.shape[1:] if batch else spec.shape)
        given = warm.shapes.get(spec.name)
        if given is not None and len(given) == len(dims):
            dims = list(given)
        dims = [32 if d == -1 else d for d in dims]
        shape = ([batch] if batch else []) + dims
        inputs[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return inputs
