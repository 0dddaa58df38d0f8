"""Running one cut batch on a session: its requests' inputs joined along axis 0 into a pooled
buffer (padded with zero rows when the graph's batch dim is fixed) in one copy, one call into
the backend, and the outputs checked to keep the batch dim. No locks, no futures: the batcher
around it does the bookkeeping."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edged.backends import Session
from edged.core.errors import EdgedError, InferenceFailed
from edged.hardware.memory import BufferPool, HostBufferPool
from edged.inference.batching import Outputs, Request

logger = logging.getLogger(__name__)


@dataclass
class Ran:
    """What a batch came to: its outputs (the real rows only) or the failure, its rows and how
    long the call took."""

    rows: int
    ns: int
    outputs: Outputs = field(default_factory=dict)
    failure: EdgedError | None = None


def run_batch(label: str, batch: list[Request], session: Session, pool: BufferPool | None,
              fixed_batch: int | None) -> Ran:
    """Run `batch` as one call. A request that is a batch of its own is passed as it is (no
    copy); inline callers bring no pool and get a host buffer. The backend call is the one
    place anything may come out: it fails this batch only."""
    started = time.perf_counter_ns()
    rows = batch[0].rows if len(batch) == 1 else sum(r.rows for r in batch)
    sent = max(rows, fixed_batch or 0)
    failure: EdgedError | None = None
    outputs: Outputs = {}
    inputs: Mapping[str, np.ndarray]
    try:
        if sent > rows:
            staging = pool or HostBufferPool(sent)
            inputs = {name: staging.concatenate(name, [r.inputs[name] for r in batch], sent)
                      for name in batch[0].inputs}
        elif len(batch) == 1:
            inputs = batch[0].inputs
        else:
            joined = pool or HostBufferPool(rows)
            inputs = {name: joined.concatenate(name, [r.inputs[name] for r in batch])
                      for name in batch[0].inputs}
        outputs = session.infer(inputs)
        if (len(batch) > 1 or sent > rows) and any(v.shape[:1] != (sent,)
                                                   for v in outputs.values()):
            failure = InferenceFailed(f"{label}: outputs do not keep the batch dim of {sent} "
                                      "rows; set max_batch_size: 0")
        elif sent > rows:
            outputs = {k: v[:rows] for k, v in outputs.items()}  # the padding's rows go
    except Exception as exc:  # the backend call: fail this batch only, keep the worker
        logger.exception("%s: inference failed for a batch of %d", label, rows)
        failure = InferenceFailed(f"{label}: inference failed: {exc}")
    return Ran(rows, time.perf_counter_ns() - started, outputs, failure)
