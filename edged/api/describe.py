"""What the API says about models: KServe v2 metadata, Triton's model configuration and
repository index entries, built from a `ModelVersion` and cache status. Pure functions."""

from __future__ import annotations

import dataclasses
from typing import Any

from edged.api.protocol import triton_dtype
from edged.cache import ModelStatus
from edged.model.repository import ModelVersion
from edged.model.tensor import TensorSpec

PLATFORM = "onnxruntime_onnx"


def model_metadata(model: ModelVersion, versions: list[int]) -> dict[str, Any]:
    """`GET /v2/models/{m}`: shapes carry the batch dim as -1 when the model batches."""
    return {
        "name": model.name,
        "versions": [str(v) for v in versions],
        "platform": PLATFORM,
        "inputs": [_tensor(spec, model.max_batch_size) for spec in model.inputs],
        "outputs": [_tensor(spec, model.max_batch_size) for spec in model.outputs],
    }


def _tensor(spec: TensorSpec, max_batch_size: int) -> dict[str, Any]:
    shape = list(spec.shape)
    if max_batch_size:
        shape[0] = -1
    return {"name": spec.name, "datatype": triton_dtype(spec.dtype), "shape": shape}


def model_config(model: ModelVersion) -> dict[str, Any]:
    """`GET /v2/models/{m}/config` in Triton's JSON form (dims without the batch dim), plus an
    `edged` object with what Triton's schema has no place for."""
    cfg = model.config
    batched = model.max_batch_size > 0

    def dims(spec: TensorSpec) -> list[int]:
        return list(spec.shape[1:] if batched else spec.shape)

    out: dict[str, Any] = {
        "name": model.name,
        "platform": PLATFORM,
        "backend": cfg.backend if cfg.backend != "auto" else "onnxruntime",
        "max_batch_size": model.max_batch_size,
        "input": [{"name": s.name, "data_type": f"TYPE_{triton_dtype(s.dtype)}",
                   "dims": dims(s)} for s in model.inputs],
        "output": [{"name": s.name, "data_type": f"TYPE_{triton_dtype(s.dtype)}",
                    "dims": dims(s)} for s in model.outputs],
        "instance_group": [{"count": cfg.instances, "kind": "KIND_AUTO"}],
        "version_policy": _version_policy(model),
    }
    batching = cfg.batching_params
    if batched and batching is not None:
        out["dynamic_batching"] = {
            "preferred_batch_size": batching.preferred_batch_sizes,
            "max_queue_delay_microseconds": batching.max_queue_delay_us,
            "priority_levels": batching.priority_levels,
            "default_priority_level": batching.default_priority,
            "default_queue_policy": {
                "max_queue_size": batching.max_queue_size,
                "default_timeout_microseconds": batching.default_timeout_ms * 1000,
            },
        }
    pre = dataclasses.asdict(cfg.preprocess) if cfg.preprocess is not None else None
    post = dataclasses.asdict(cfg.postprocess) if cfg.postprocess is not None else None
    out["edged"] = {"version": model.version, "precision": cfg.precision,
                    "preprocess": pre, "postprocess": post,
                    # a detector's head, and why it and the pre/post-processing are so
                    "head": model.head.describe() if model.head is not None else None,
                    "reasons": dict(model.reasons)}
    return out


def _version_policy(model: ModelVersion) -> dict[str, Any]:
    policy = model.config.version_policy
    if policy.all:
        return {"all": {}}
    if policy.specific is not None:
        return {"specific": {"versions": policy.specific}}
    return {"latest": {"num_versions": policy.latest or 1}}


def index_entry(status: ModelStatus) -> dict[str, Any]:
    """One row of `POST /v2/repository/index`."""
    entry: dict[str, Any] = {"name": status.name, "version": str(status.version),
                             "state": status.state}
    if status.reason:
        entry["reason"] = status.reason
    if status.backend:
        entry["backend"] = status.backend
        entry["providers"] = list(status.providers)
    return entry
