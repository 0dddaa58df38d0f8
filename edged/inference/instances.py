"""How many execution instances a model gets: model.yaml's `instances`, or for `auto` (the
default) a count from the machine, so that concurrent requests run concurrently.

An instance is a worker thread of the model's batcher (and, on TensorRT, an execution context):
it cuts a batch from what is queued and runs it. With one instance a model runs one batch at a
time, and a CPU session runs one `session.run` at a time: ONNX Runtime's intra-op threads
parallelise inside an operator, which for a small model (PP-OCR cls at 1x3x48x192) leaves most
of the second core idle (measured: ~117% of 2 cores at 8 concurrent clients, 0.46x the
request rate of 8 threads calling `session.run` on one session). ONNX Runtime's `run` is
thread-safe and releases the GIL, so several instances on one session overlap for real.

- CPU: one instance per core the process may run on. Each instance still takes whatever is
  queued when it comes free (a batch), so batching is kept where requests pile up, and the
  cores are never waiting for one batch to finish. The numbers this was chosen by are in
  `python -m tools.bench instances` and docs/decisions/020-instances-and-threads.md.
- GPU (a CUDA/TensorRT provider first, and a CUDA device present): two, so one batch's host
  work (gather, copies, Python) overlaps the other's kernels; each TensorRT context holds its
  own activation memory, so more than that costs memory for little.
"""

from __future__ import annotations

import os

from edged.backends.base import BackendOptions
from edged.hardware import gpu

AUTO = "auto"
GPU_INSTANCES = 2
GPU_PROVIDERS = frozenset({"tensorrt", "cuda"})


def cores() -> int:
    """The CPUs this process may run on (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def instance_count(configured: int | str, options: BackendOptions | None = None, *,
                   on_gpu: bool | None = None) -> int:
    """`configured` when it is a number; for `auto`, the count for where the model runs:
    `on_gpu` when the caller knows it (the TensorRT backend always is), else told by the
    provider chain in `options` and whether a CUDA device is there."""
    if not isinstance(configured, str):
        return configured
    if on_gpu is None:
        on_gpu = runs_on_gpu(options)
    return GPU_INSTANCES if on_gpu else cores()


def runs_on_gpu(options: BackendOptions | None) -> bool:
    """Whether a session made with `options` runs on a GPU: a CUDA or TensorRT provider first
    in the chain, and a CUDA device present."""
    providers = options.providers if options is not None else ()
    return bool(providers) and providers[0] in GPU_PROVIDERS and gpu.device() is not None
