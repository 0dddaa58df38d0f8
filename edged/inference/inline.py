"""A batcher's requests run on the calling thread (the API's event loop, a stream's thread)
where the batcher would run them alone right away anyway: an instance slot free, nothing
queued, no queue delay. A hop to a worker and back is two thread wake-ups and two GIL
hand-overs: more CPU than a small model's run, and latency on any model
(`docs/decisions/021-own-http-stack.md`).

`Batcher` (edged.inference.batcher) mixes this in; which models are quick enough, and the
runs of requests that arrived together, are its own."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from edged.core.errors import InvalidInput
from edged.inference.batching import (
    INLINE_UNKNOWN,
    BatcherStats,
    BatchPolicy,
    Checked,
    Outputs,
    Pending,
    Request,
    misfit,
    split,
    validate,
)
from edged.inference.cache import Lease, ModelCache
from edged.inference.execution import Ran, run_batch
from edged.model.repository import ModelVersion

Delivery = Callable[[], None]  # completes futures; always called without the lock
Sink = Callable[[Any], None]  # a shadow's tap: takes the request's future once done


class CallerRuns:
    """The caller's-thread side of a batcher (see the module)."""

    # The batcher's own, used here.
    cache: ModelCache
    name: str
    version: int | None
    label: str
    _lock: threading.Lock
    _queue: Any
    _free: int
    _stopping: bool
    _in_flight: int
    _policy: BatchPolicy
    _model: ModelVersion
    _batch_ns: int
    _row_ns: int
    _clock: Callable[[], float]
    _work: threading.Condition
    _drained: threading.Condition
    admit: Callable[..., Request]
    push: Callable[[Request], None]
    release_slot: Callable[[], None]
    _counters: Callable[..., BatcherStats]
    _adopt: Callable[[ModelVersion], list[Delivery]]
    _execute: Callable[..., Delivery]
    _deliver: Callable[[Ran, int], None]

    if TYPE_CHECKING:
        @property
        def quick(self) -> bool: ...

    def run_or_push(self, request: Request) -> None:
        """An admitted request, run now on the calling thread when the model is quick, idle
        and loaded, else queued (raising for a full queue or a stopping batcher)."""
        if not (self.quick and self.claim_slot()
                and self.run_claimed([request], self.cache.acquire_loaded)):
            self.push(request)  # not quick, not idle, or not loaded: the workers take it

    def run_inline(self, inputs: Mapping[str, np.ndarray], priority: int | None,
                   timeout_s: float | None) -> Outputs:
        """Run one request on the caller's thread when nothing is queued, an instance slot is
        free and the model has no queue delay: the batcher would run it alone right away
        anyway, and this skips two thread wake-ups. Otherwise queue it and wait."""
        request = self.admit(inputs, priority, timeout_s)
        if not (self.claim_slot() and self.run_claimed([request], self.cache.acquire)):
            self.push(request)
        result: Outputs = request.future.result()
        return result

    def submit_or_run(self, inputs: Mapping[str, np.ndarray], priority: int | None,
                      timeout_s: float | None) -> Pending:
        """submit(), or, for a model whose batches take under INLINE_MAX_NS and that is idle
        and loaded, run it now on the calling thread (the future comes back done). For the
        event loop: it never waits for a model to load or for a slot."""
        request = self.admit(inputs, priority, timeout_s)
        self.run_or_push(request)
        return request.future

    def run_now(self, inputs: Mapping[str, np.ndarray], priority: int | None,
                timeout_s: float | None, checked: Checked | None,
                cached: tuple[str, ...] | None,
                tap: Callable[[Mapping[str, np.ndarray]], Sink | None] | None = None
                ) -> Pending | None:
        """Admit a request (as admit, a shadow's `tap` offered it) and run it here, where
        the batcher would run it alone right away (a slot free, nothing queued, no queue
        delay) on the model it is checked against, loaded: its future comes back done. None,
        with nothing admitted or run, when not so. One hold of the lock claims the slot,
        another gives it back with the run's statistics; it never blocks on a model or a
        slot, never reads the disk (the event loop's replays, `edged.api.replays`)."""
        with self._lock:
            if self._queue.count or self._free <= 0 or self._stopping \
                    or self._policy.max_delay_s > 0:
                return None
            self._free -= 1
            self._in_flight += 1
        lease = self.cache.acquire_loaded(self.name, self.version)
        if lease is None or lease.model is not self._model:
            self._give_back(lease)
            return None
        try:
            sink = tap(inputs) if tap is not None else None
            request = self.admit(inputs, priority, timeout_s, checked=checked, cached=cached)
        except BaseException:
            self._give_back(lease)
            raise
        future = request.future
        if sink is not None:
            future.add_done_callback(sink)
        if future.done():  # a response cache hit
            self._give_back(lease)
            return future
        future.set_running_or_notify_cancel()
        model = lease.model
        waits_ns = [int((self._clock() - request.enqueued) * 1e9)]
        ran = run_batch(self.label, [request], lease.session, None, self._policy.fixed_batch)
        request.inputs = {}  # views of the caller's buffer: let go before it hears back
        ns = ran.ns
        lease.release()
        with self._lock:
            self._counters().record(waits_ns if ran.batch else [], ran.rows, ns, self._clock(),
                                    failed=ran.failure is not None)
            self._learn_cost(ran, ns)
            self._slot_back()
        if ran.failure is None and request.miss is not None and ran.batch:
            self._deliver(ran, model.version)
        elif ran.failure is None and not ran.dropped:
            split(ran.batch, ran.outputs, model.version)  # as ran.delivery's, without its closure
        else:
            ran.delivery(model.version)()
        return future

    def _give_back(self, lease: Lease | None) -> None:
        """A slot claimed by run_now, and the lease, when nothing ran."""
        if lease is not None:
            lease.release()
        with self._lock:
            self._slot_back()

    def _slot_back(self) -> None:
        """run_now's slot and in-flight count given back (lock held), waking what waits."""
        self._in_flight -= 1
        self._free += 1
        if self._stopping:
            self._work.notify_all()
            self._drained.notify_all()
        elif self._queue.count:
            self._work.notify()

    def claim_slot(self) -> bool:
        """Take an instance slot for a caller's own thread, when the batcher would run a
        request alone right away: nothing queued, a slot free, no queue delay."""
        with self._lock:
            inline = (not self._queue and self._free > 0 and not self._stopping
                      and self._policy.max_delay_s == 0)
            if inline:
                self._free -= 1
            return inline

    def run_claimed(self, batch: list[Request],
                    acquire: Callable[[str, int | None], Lease | None]) -> bool:
        """Run `batch` (admitted requests) as one batch in the slot claimed; False, with the
        slot released and nothing run, when `acquire` finds no model loaded or a version the
        cache no longer serves. Where a new version came in, each request is checked against
        it first: one that does not fit fails with what does not (a 400, as at admission),
        the rest run. True: every request of `batch` ran or failed."""
        deliveries: list[Delivery] = []
        ran = False
        try:
            lease = acquire(self.name, self.version)
            if lease is not None:
                with lease:
                    if lease.model is not self._model:
                        if self.cache.serving(self.name, self.version) is not lease.model:
                            return False  # a version being swapped out: the workers run it
                        deliveries += self._adopt(lease.model)
                        batch = self._refit(batch)
                    for request in batch:
                        request.future.set_running_or_notify_cancel()
                    with self._lock:
                        self._in_flight += len(batch)
                    if batch:
                        deliveries.append(self._execute(batch, lease.session, None,
                                                        lease.model))
                    ran = True
        finally:
            self.release_slot()
            for deliver in deliveries:
                deliver()
        return ran

    def _refit(self, batch: list[Request]) -> list[Request]:
        """The requests of `batch` that fit the version now served (their rows and shapes
        taken afresh); the others fail with what does not fit."""
        kept = []
        for request in batch:
            try:
                request.rows, request.shape_key = validate(self._model, request.inputs)
            except InvalidInput as exc:
                with self._lock:
                    self._counters().failure += 1
                if request.future.set_running_or_notify_cancel():
                    request.future.set_exception(misfit(self.label, self._model, exc))
                continue
            kept.append(request)
        return kept

    def _learn_cost(self, ran: Ran, ns: int) -> None:
        """Fold one run's time into the batch and row costs the inline choice reads, and
        count the requests it dropped (their shm objects shrank); the caller holds the lock."""
        if ran.dropped:
            self._counters().failure += len(ran.dropped)
        self._batch_ns = (ns + 3 * self._batch_ns) // 4 \
            if self._batch_ns < INLINE_UNKNOWN else ns
        row_ns = ns // max(ran.rows, 1)
        self._row_ns = (row_ns + 3 * self._row_ns) // 4 if self._row_ns else row_ns
