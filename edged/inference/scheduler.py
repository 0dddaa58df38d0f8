"""Routing requests to per-model batchers (`edged.inference.batcher`), made on first use: one per
model (its active version) and one per explicitly named version. `Scheduler.submit()` raises at once
for what is known at once and returns a future; `infer()` waits, running on the caller's
thread when the model is idle. The counters and queues of every batcher are read here.

A model can have a tap (`taps[model]`, a shadow rollout's sampler): requests to its active
version are offered to it, and a sampled one gets the request's outputs once they are in."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.core.errors import ShuttingDown
from edged.inference.batcher import Batcher
from edged.inference.batching import (
    BatcherStats,
    Checked,
    Outputs,
    Pending,
    Request,
)
from edged.inference.cache import ModelCache
from edged.inference.modelstatus import InferenceCounters
from edged.inference.responses import ResponseCache
from edged.model.repository import ModelVersion

__all__ = ["Outputs", "Pending", "Scheduler", "Tap"]

# inputs -> None (not sampled), or a sink that takes the request's future, outputs or None
Tap = Callable[[Mapping[str, np.ndarray]], "Callable[[Any], None] | None"]


@dataclass(frozen=True)
class Admitted:
    """A request checked against its model, to be run with others that came with it."""

    batcher: Batcher
    request: Request

    @property
    def future(self) -> Pending:
        return self.request.future


class Scheduler:
    """Routes requests to per-model batchers. Thread-safe; `submit` never blocks on a model."""

    def __init__(self, cache: ModelCache, *, clock: Callable[[], float] = time.monotonic,
                 responses: ResponseCache | None = None) -> None:
        """`responses`: the response cache that models with `response_cache: true` answer
        the API's requests from (None: none)."""
        self.cache = cache
        self.responses = responses
        self._clock = clock
        self._lock = threading.Lock()
        self._batchers: dict[tuple[str, int | None], Batcher] = {}
        self._closed = False
        self.taps: dict[str, Tap] = {}

    def submit(self, model: str, inputs: Mapping[str, np.ndarray], *, version: int | None = None,
               priority: int | None = None, timeout_s: float | None = None) -> Pending:
        """Queue one request. Raises at once for what is known at once (unknown model, bad
        input, full queue, shutting down); the future carries execution errors and timeouts."""
        batcher = self._batcher(model, version)
        tap = self.taps.get(model) if version is None else None
        sink = tap(inputs) if tap is not None else None  # before: it counts the queue as is
        future = batcher.submit(inputs, priority, timeout_s)
        if sink is not None:
            future.add_done_callback(sink)
        return future

    def submit_or_run(self, model: str, inputs: Mapping[str, np.ndarray], *,
                      version: int | None = None, priority: int | None = None,
                      timeout_s: float | None = None) -> Pending:
        """submit(), except that an idle, loaded model whose batches are quicker than handing
        the request to a worker runs now on the calling thread (Batcher.submit_or_run): the
        future comes back done. Never blocks on a load or a busy model (the event loop). A
        shadow's tap is offered the request as by submit()."""
        batcher = self._batcher(model, version)
        tap = self.taps.get(model) if version is None else None
        sink = tap(inputs) if tap is not None else None
        future = batcher.submit_or_run(inputs, priority, timeout_s)
        if sink is not None:
            future.add_done_callback(sink)  # at once, when it ran here
        return future

    def admit(self, model: str, inputs: Mapping[str, np.ndarray], *, version: int | None = None,
              priority: int | None = None, timeout_s: float | None = None,
              checked: Checked | None = None,
              cached: tuple[str, ...] | None = None) -> Admitted:
        """A request checked and stamped for run_together, run_or_queue or queue (raises at
        once for bad input or an unknown model); a shadow's tap is offered it now, as by
        submit(). `checked` and `cached`: see Batcher.admit (a response cache hit comes back
        with its future done, to be neither run nor queued)."""
        batcher = self._batcher(model, version)
        tap = self.taps.get(model) if version is None else None
        sink = tap(inputs) if tap is not None else None
        request = batcher.admit(inputs, priority, timeout_s, checked=checked, cached=cached)
        if sink is not None:
            request.future.add_done_callback(sink)
        return Admitted(batcher, request)

    def run_or_queue(self, admitted: Admitted) -> None:
        """Run an admitted request now on the calling thread where submit_or_run would, else
        queue it (raises for a full queue, as submit)."""
        admitted.batcher.run_or_push(admitted.request)

    def run_now(self, model: str, inputs: Mapping[str, np.ndarray], *,
                version: int | None = None, priority: int | None = None,
                timeout_s: float | None = None, checked: Checked | None = None,
                cached: tuple[str, ...] | None = None) -> Pending | None:
        """Admit a request (as admit: checked, tapped, looked up) and run it on the calling
        thread, where the batcher would run it alone right away and the model it is checked
        against is loaded: its future comes back done. None, with nothing admitted or run,
        otherwise (no batcher yet, busy, not loaded, a version not taken on yet)
        (Batcher.run_now: it never blocks, never reads the disk)."""
        batcher = self._batchers.get((model, version))
        if batcher is None:
            return None
        return batcher.run_now(inputs, priority, timeout_s, checked, cached,
                               self.taps.get(model) if version is None else None)

    def queue(self, admitted: Admitted) -> None:
        """Queue an admitted request for the workers (raises for a full queue, as submit)."""
        admitted.batcher.push(admitted.request)

    def run_together(self, admitted: list[Admitted]) -> None:
        """Requests admitted together for one model and version (see
        Batcher.run_together): each future carries its outcome."""
        admitted[0].batcher.run_together([a.request for a in admitted])

    def cheap(self, model: str, version: int | None = None) -> bool:
        """Whether requests that arrive together for `model` may batch on the calling thread
        (its rows are cheap; Batcher.run_together decides per batch)."""
        return self._batcher(model, version).cheap

    def quick(self, model: str, version: int | None = None) -> bool:
        """Whether submit_or_run may run `model` on the calling thread (its batches are quick)."""
        return self._batcher(model, version).quick

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, version: int | None = None,
              priority: int | None = None, timeout_s: float | None = None) -> Outputs:
        """Run one request and wait for its outputs: on the calling thread when the model is
        idle (see Batcher.run_inline), else queued like submit()."""
        batcher = self._batcher(model, version)
        tap = self.taps.get(model) if version is None else None
        sink = tap(inputs) if tap is not None else None
        if sink is None:
            return batcher.run_inline(inputs, priority, timeout_s)
        try:
            outputs = batcher.run_inline(inputs, priority, timeout_s)
        except BaseException:
            sink(None)
            raise
        sink(outputs)
        return outputs

    def busy(self) -> bool:
        """Whether serving work is waiting in any queue (a shadow's sample then waits not)."""
        return any(batcher.depth for batcher in list(self._batchers.values()))

    def working(self) -> int:
        """Requests queued or running in every batcher now (Batcher.working), read without a
        lock: what the language models' generation yields to between tokens."""
        return sum(batcher.working for batcher in list(self._batchers.values()))

    def has_batcher(self, model: str, version: int | None = None) -> bool:
        return (model, version) in self._batchers

    def batcher(self, model: str, version: int | None = None) -> Batcher | None:
        """The batcher of requests to `model` (by version, or its active one), if made."""
        return self._batchers.get((model, version))

    def model(self, model: str, version: int | None = None) -> ModelVersion:
        """The config and signature requests to `model` are checked against now."""
        return self._batcher(model, version).model

    def prepare(self, model: str, version: int | None = None) -> None:
        """Create the model's batcher now (it reads the model's files): async callers do this
        on a thread before their first submit, so that submit never touches the disk."""
        self._batcher(model, version)

    def _batcher(self, model: str, version: int | None) -> Batcher:
        batcher = self._batchers.get((model, version))  # the hot path: no lock
        if batcher is not None:
            return batcher
        with self._lock:
            if self._closed:
                raise ShuttingDown("the scheduler is shutting down")
            batcher = self._batchers.get((model, version))
            if batcher is None:
                batcher = Batcher(self.cache, model, version, clock=self._clock,
                                  responses=self.responses)
                self._batchers[(model, version)] = batcher
            return batcher

    def retire(self, model: str, version: int, *, drain_s: float = 5.0) -> None:
        """Stop and drop the batcher of requests that name `model:version` (its version left
        the disk): its threads end instead of waiting for a version that is gone. Requests
        still queued run until `drain_s`, then fail."""
        with self._lock:
            batcher = self._batchers.pop((model, version), None)
        if batcher is not None:
            batcher.begin_stop()
            batcher.finish_stop(self._clock() + drain_s)

    def batchers(self) -> list[Batcher]:
        with self._lock:
            return list(self._batchers.values())

    def queues(self) -> dict[str, dict[str, int]]:
        """Per batcher: requests queued, queued or running, batches run, and its instances
        (the status report)."""
        queues = {}
        for batcher in self.batchers():
            pending, batches = batcher.progress()
            queues[batcher.label] = {"queued": batcher.depth, "pending": pending,
                                     "batches": batches, "instances": batcher.instances}
        return queues

    def statistics(self) -> dict[tuple[str, int], BatcherStats]:
        """Per model version since start; the batchers of one model (by name, by explicit
        version) summed, as Triton counts them."""
        stats: dict[tuple[str, int], BatcherStats] = {}
        for batcher in self.batchers():
            for version, s in batcher.stats_by_version().items():
                key = (batcher.name, version)
                stats[key] = stats.get(key, BatcherStats()) + s
            stats.setdefault((batcher.name, batcher.serving_version), BatcherStats())
        return stats

    def counters(self) -> list[InferenceCounters]:
        """Per model version, with what is queued now (/metrics, the stats message)."""
        pending: dict[tuple[str, int], int] = {}
        for batcher in self.batchers():
            key = (batcher.name, batcher.serving_version)
            pending[key] = pending.get(key, 0) + batcher.depth
        return [InferenceCounters.of(name, version, s, pending.get((name, version), 0))
                for (name, version), s in sorted(self.statistics().items())]

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting everywhere at once; drain until the timeout; fail what is left."""
        with self._lock:
            self._closed = True
            batchers = list(self._batchers.values())
        deadline = self._clock() + timeout_s
        for batcher in batchers:
            batcher.begin_stop()
        for batcher in batchers:
            batcher.finish_stop(deadline)
