"""What the API says about models: KServe v2 metadata, Triton's model configuration and
repository index entries, built from a `ModelVersion` and cache status. Pure functions."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from edged.api.protocol import triton_dtype
from edged.inference.batching import BatcherStats
from edged.inference.instances import instance_count
from edged.inference.modelstatus import ModelStatus
from edged.model.repository import ModelVersion
from edged.model.tensor import TensorSpec

PLATFORM = "onnxruntime_onnx"


def model_metadata(model: ModelVersion, versions: list[int]) -> dict[str, Any]:
    """`GET /v2/models/{m}`: shapes carry the batch dim as -1 when the model batches, also
    when the graph's is fixed (requests may bring 1..max_batch_size rows; the batcher pads)."""
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


def model_config(model: ModelVersion, instances: int | None = None) -> dict[str, Any]:
    """`GET /v2/models/{m}/config` in Triton's JSON form (dims without the batch dim), plus an
    `edged` object with what Triton's schema has no place for. `instances`: what `auto`
    came to (the batcher's count), else the configured number."""
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
        "instance_group": [{"count": instances or instance_count(cfg.instances),
                            "kind": "KIND_AUTO"}],
        "version_policy": _version_policy(model),
        # as Triton shows it; edged adds whether the model is deterministic (below)
        "response_cache": {"enable": cfg.response_cache},
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
    # Triton's schema has no word for a fixed batch dim: max_batch_size says how many rows a
    # request may bring, this says the graph runs exactly that many (fewer are zero-padded).
    out["edged"] = {"version": model.version, "precision": cfg.precision,
                    "deterministic": cfg.deterministic,
                    "fixed_batch_size": model.fixed_batch, "preprocess": pre,
                    "postprocess": post,
                    # the task (edged.tasks): what the outputs are read as, and why
                    "task": {"kind": post["kind"] if post is not None else "raw",
                             "reason": model.reasons.get("task", "model.yaml")},
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


def statistics(keys: list[tuple[str, int]],
               stats: Mapping[tuple[str, int], BatcherStats]) -> dict[str, Any]:
    """`GET /v2/models[/{m}[/versions/{v}]]/stats`: a version that has run nothing yet has
    zero counts."""
    return {"model_stats": [model_statistics(name, version,
                                             stats.get((name, version), BatcherStats()))
                            for name, version in keys]}


def model_statistics(name: str, version: int, stats: BatcherStats) -> dict[str, Any]:
    """One `model_stats` entry of Triton's statistics extension. edged times a batch as one
    span (pooling the inputs, the inference, splitting the outputs), so it is all
    `compute_infer`; `compute_input`/`compute_output` carry the counts with no time of their
    own. A request is charged its batch's whole compute time, as Triton charges it."""
    def stat(count: int, ns: int) -> dict[str, int]:
        return {"count": count, "ns": ns}

    # Requests that reached a batch or the response cache (Triton's queue count) and those
    # that ran (its compute counts: hits ran nothing).
    executed = stats.success + stats.failure - stats.timeouts
    computed = executed - stats.cache_hits
    request_compute_ns = stats.request_ns - stats.queue_ns - stats.cache_hit_ns \
        - stats.cache_miss_ns
    return {
        "name": name, "version": str(version), "last_inference": stats.last_inference_ms,
        "inference_count": stats.inference_count, "execution_count": stats.exec_count,
        "inference_stats": {
            "success": stat(stats.success, stats.success_ns),
            "fail": stat(stats.failure, stats.fail_ns),
            "queue": stat(executed, stats.queue_ns),
            "compute_input": stat(computed, 0),
            "compute_infer": stat(computed, request_compute_ns),
            "compute_output": stat(computed, 0),
            "cache_hit": stat(stats.cache_hits, stats.cache_hit_ns),
            "cache_miss": stat(stats.cache_misses, stats.cache_miss_ns),
        },
        "batch_stats": [{"batch_size": rows, "compute_input": stat(count, 0),
                         "compute_infer": stat(count, ns), "compute_output": stat(count, 0)}
                        for rows, (count, ns) in sorted(stats.batch_sizes.items())],
        "memory_usage": [],
    }
