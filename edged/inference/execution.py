"""Running one cut batch on a session: its requests' inputs joined along axis 0 into a pooled
buffer (padded with zero rows when the graph's batch dim is fixed) in one copy
(`edged.inference.assembly`, which also drops a request whose shared memory has shrunk), one
call into the backend, and the outputs checked to keep the batch dim. No locks: the batcher
around it does the bookkeeping, and hands the outcome over (`Ran.delivery`) outside them."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edged.backends import Session
from edged.core.errors import EdgedError, InferenceFailed
from edged.hardware.memory import BufferPool
from edged.inference.assembly import assemble
from edged.inference.batching import Outputs, Request, split

logger = logging.getLogger(__name__)


@dataclass
class Ran:
    """What a batch came to: the requests that ran, their outputs (the real rows only) or the
    failure, their rows and how long the call took; and the requests dropped before it, with
    their errors."""

    batch: list[Request]
    rows: int
    ns: int
    outputs: Outputs = field(default_factory=dict)
    failure: EdgedError | None = None
    dropped: list[tuple[Request, EdgedError]] = field(default_factory=list)

    def delivery(self, version: int) -> Callable[[], None]:
        """The call that hands each request its outputs or its error."""
        def deliver() -> None:
            for request, error in self.dropped:
                _fail([request], error)
            if self.failure is not None:
                _fail(self.batch, self.failure)
            else:
                split(self.batch, self.outputs, version)

        return deliver


def _fail(requests: list[Request], error: EdgedError) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error)


def run_batch(label: str, batch: list[Request], session: Session, pool: BufferPool | None,
              fixed_batch: int | None) -> Ran:
    """Run `batch` as one call. A request that is a batch of its own is passed as it is (no
    copy) where that saves the only copy (`assembly.assemble`); inline callers bring no pool
    and get a host buffer. The backend call is the one place anything may come out: it fails
    this batch only."""
    started = time.perf_counter_ns()
    rows = batch[0].rows if len(batch) == 1 else sum(r.rows for r in batch)
    sent = max(rows, fixed_batch or 0)
    failure: EdgedError | None = None
    outputs: Outputs = {}
    dropped: list[tuple[Request, EdgedError]] = []
    try:
        batch, inputs, dropped = assemble(batch, pool, fixed_batch, session)
        rows = batch[0].rows if len(batch) == 1 else sum(r.rows for r in batch)
        sent = max(rows, fixed_batch or 0) if batch else 0
        if batch:
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
    return Ran(batch, rows, time.perf_counter_ns() - started, outputs, failure, dropped)
