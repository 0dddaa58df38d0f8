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


# A served image whose size is the camera frame's (a model that resizes what it is given, as
# TF's detectors do): timed and warmed at a VGA frame unless warmup.shapes names a size.
FRAME_SIZE = (640, 480)
DYNAMIC_DIM = 32  # other dynamic dims: a size most vision graphs accept


def warmup_inputs(model: ModelVersion) -> dict[str, np.ndarray]:
    """Zeros of the shapes the model will serve: batch dim from warmup.batch_size (the graph's
    own size when its batch dim is fixed: the session is run directly, with no batcher to
    pad); an image input's dynamic height and width at the size its frames are made
    (`served_size`), other dynamic dims from warmup.shapes or 32. Thread and precision choices
    time these same inputs, so they are made on the workload that is served."""
    warm = model.config.warmup
    batch = model.fixed_batch or (
        min(warm.batch_size, model.max_batch_size) if model.max_batch_size else None)
    inputs = {}
    for i, spec in enumerate(model.inputs):
        dims = list(spec.shape[1:] if batch else spec.shape)
        given = warm.shapes.get(spec.name)
        if given is not None and len(given) == len(dims):
            dims = list(given)
        elif i == 0:
            dims = _image_dims(model, dims)
        dims = [DYNAMIC_DIM if d == -1 else d for d in dims]
        shape = ([batch] if batch else []) + dims
        inputs[spec.name] = np.zeros(shape, dtype=spec.dtype)
    return inputs


def served_size(model: ModelVersion) -> tuple[int, int] | None:
    """(width, height) of the image tensors a model's frames become: preprocess.resize (from
    model.yaml, or the metadata's imgsz), else the input's own fixed size, else a camera
    frame's (FRAME_SIZE); None for a model with no pre-processing (tensors from clients)."""
    pre = model.config.preprocess
    if pre is None or not model.inputs:
        return None
    if pre.resize is not None:
        return pre.resize[0], pre.resize[1]
    shape = model.inputs[0].shape
    if len(shape) >= 3:
        height, width = shape[-2:] if pre.layout == "nchw" else shape[-3:-1]
        if height > 0 and width > 0:
            return width, height
    return FRAME_SIZE


def describe_inputs(inputs: dict[str, np.ndarray]) -> str:
    """`images [1, 3, 320, 320]` for the log lines of choices timed on these inputs."""
    return ", ".join(f"{name} {list(a.shape)}" for name, a in inputs.items())


def _image_dims(model: ModelVersion, dims: list[int]) -> list[int]:
    """An image input's dims (no batch) with dynamic height and width at the served size."""
    size = served_size(model)
    pre = model.config.preprocess
    if size is None or pre is None or len(dims) != 3:
        return dims
    width, height = size
    if pre.layout == "nchw":
        return [dims[0], height if dims[1] == -1 else dims[1], width if dims[2] == -1 else dims[2]]
    return [height if dims[0] == -1 else dims[0], width if dims[1] == -1 else dims[1], dims[2]]
