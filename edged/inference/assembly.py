"""A batch's inputs as its session gets them: the requests' arrays stacked into the worker's
pooled buffer (the one copy a request makes on its way to the backend), padded up to a
graph's fixed batch, or, for a request that is a batch of its own, handed over as they are.

A request whose input maps a client's shared memory is read from the file where it is copied
(`edged.hardware.filemaps`); it is handed over as a view only where that saves the only copy,
i.e. the session reads host memory in place (ONNX Runtime's CPU provider). A GPU session
copies its inputs anyway (to pinned or device memory), so such a request is stacked into the
pool too, which is that memory on a GPU worker. A request whose object has shrunk is dropped
from the batch with its error; the others run."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edged.backends import Session
from edged.core.errors import EdgedError
from edged.hardware import filemaps
from edged.hardware.memory import BufferPool, HostBufferPool
from edged.inference.batching import Request

CPU_IN_PLACE = "CPUExecutionProvider"
_CPU_ONLY = frozenset((CPU_IN_PLACE,))


def assemble(batch: list[Request], pool: BufferPool | None, fixed_batch: int | None,
             session: Session) -> tuple[list[Request], Mapping[str, np.ndarray],
                                        list[tuple[Request, EdgedError]]]:
    """The requests that run, their inputs, and the requests dropped with their errors.
    Inline callers bring no pool: a buffer is made for the batch."""
    dropped: list[tuple[Request, EdgedError]] = []
    while batch:
        rows = batch[0].rows if len(batch) == 1 else sum(r.rows for r in batch)
        sent = max(rows, fixed_batch or 0)
        if sent == rows and len(batch) == 1 and (
                reads_in_place(session)
                or not any(filemaps.file_backed(a) for a in batch[0].inputs.values())):
            return batch, batch[0].inputs, dropped  # a batch of its own: no copy
        staging = pool or HostBufferPool(sent)
        try:
            return batch, {name: staging.concatenate(name, [r.inputs[name] for r in batch],
                                                     sent if sent > rows else None)
                           for name in batch[0].inputs}, dropped
        except filemaps.SourceShrunk as exc:
            dropped.append((batch[exc.part], exc))
            batch = batch[:exc.part] + batch[exc.part + 1:]
    return batch, {}, dropped


def reads_in_place(session: Session) -> bool:
    """Whether the session reads its host inputs where they are (no copy of its own)."""
    providers = getattr(session, "providers", None) or _CPU_ONLY
    return _CPU_ONLY.issuperset(providers)
