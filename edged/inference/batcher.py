"""One model's dynamic batcher with Triton's semantics, and the threads that run its batches.

A `Batcher` validates and queues a request and returns a `concurrent.futures.Future`: a
bounded priority queue (`QueueFull`), deadlines enforced while requests wait (an expired
request fails with `Timeout` and is never run), and N instance slots served by N worker
threads. A worker leases the model from the cache, cuts the next batch (waiting up to
`max_queue_delay_us` for it to grow), concatenates it along axis 0 into a pooled buffer
(padded with zero rows when the graph's batch dim is fixed), runs one inference and splits
the outputs back.

Futures are completed outside the batcher's lock: a caller's done-callback may submit again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from functools import partial

import numpy as np

from edged.backends import Session
from edged.core.errors import (
    EdgedError,
    InvalidInput,
    ModelLoadError,
    QueueFull,
    ShuttingDown,
    Timeout,
)
from edged.hardware.memory import BufferPool, new_pool
from edged.inference.admission import caches, check, keep_answers, look_up, stamp
from edged.inference.batching import (
    INLINE_MAX_NS,
    INLINE_UNKNOWN,
    SPREAD_MIN_NS,
    TOGETHER_MAX_NS,
    BatcherStats,
    BatchPolicy,
    Checked,
    Pending,
    Request,
    RequestQueue,
    misfit,
    validate,
)
from edged.inference.cache import Lease, ModelCache
from edged.inference.execution import Ran, run_batch
from edged.inference.inline import CallerRuns, Delivery
from edged.inference.instances import instance_count, runs_on_gpu
from edged.inference.loadspec import options_for
from edged.inference.responses import ResponseCache
from edged.model.repository import ModelVersion

logger = logging.getLogger(__name__)

MAX_WAIT_S = 3600.0  # condition waits wake at least this often (time_t and clock safety)
# Leases on a version no longer served, given back before one is kept as it comes.
STALE_LEASE_TRIES = 3

class Batcher(CallerRuns):
    """The queue and instance workers of one model (a fixed version, or whichever is active)."""

    def __init__(self, cache: ModelCache, name: str, version: int | None, *,
                 clock: Callable[[], float] = time.monotonic,
                 responses: ResponseCache | None = None) -> None:
        self.cache = cache
        self.responses = responses
        self.name = name
        self.version = version
        self.label = name if version is None else f"{name}:{version}"
        self._clock = clock
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # queued work, a free slot, or stopping
        # One instance at a time waits out the queue delay for a batch to fill (Triton's
        # dynamic batcher: one scheduler forms batches, free instances run them). Two waiting
        # together both woke at every arrival and ran PP-OCR cls at 16 callers, 2 ms delay,
        # preferred 16, 12% slower than one instance; arrivals now wake only the one filling.
        self._filling = threading.Condition(self._lock)  # an arrival while a batch fills
        self._forming = False
        self._reaper_wake = threading.Condition(self._lock)  # an earlier deadline, or stopping
        self._drained = threading.Condition(self._lock)  # progress while stopping
        self._epoch = cache.epoch  # what the cache served when `_model` was last taken on
        self._model = cache.serving(name, version) or cache.describe(name, version)
        self._stats: dict[int, BatcherStats] = {}  # by model version
        self._policy = BatchPolicy.of(self._model)
        self._queue = RequestQueue(self._policy.levels)
        self._next_deadline: float | None = None
        self._stopping = False
        self._in_flight = 0
        self._batch_ns = INLINE_UNKNOWN  # how long its batches take (a moving average)
        # Instance slots, shared by the worker threads and by callers running inline.
        options = options_for(self._model, cache.options)
        self.instances = instance_count(self._model.config.instances, options)
        self._free = self.instances
        # CPU instances split what is queued between them (SPREAD_MIN_NS); GPU ones batch.
        self._spread = self.instances > 1 and not runs_on_gpu(options)
        self._row_ns = 0  # how long a row of its batches takes (a moving average)
        self._threads = [threading.Thread(target=self._work_loop, daemon=True,
                                          name=f"edged-{self.label}-{i}")
                         for i in range(self.instances)]
        self._threads.append(threading.Thread(target=self._reap_loop, daemon=True,
                                              name=f"edged-{self.label}-timeouts"))
        for thread in self._threads:
            thread.start()

    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def working(self) -> int:
        """Requests queued plus instance slots running a batch now, read without the lock: a
        glance for the language models' generation workers, which yield to it (decision 040);
        nothing on the requests' path waits for it."""
        return len(self._queue) + self.instances - self._free

    @property
    def stopping(self) -> bool:
        """Set by begin_stop(): new requests are refused, queued ones still run."""
        return self._stopping

    @property
    def free_slots(self) -> int:
        """Instance slots not running a batch now (by a worker or an inline caller)."""
        with self._lock:
            return self._free

    @property
    def model(self) -> ModelVersion:
        """The version requests are checked against: the one the cache serves now."""
        if self._epoch != self.cache.epoch:
            self._follow()
        return self._model

    def _follow(self) -> None:
        """Take on the version the cache serves now (a swap, a version reloaded from changed
        files) once it moved on: requests are checked against it from here, not against the
        version a worker last ran (issue 49, item 1). Queued requests it cannot run fail."""
        self._epoch = self.cache.epoch  # read first: a later move is seen next time
        model = self.cache.serving(self.name, self.version)
        if model is None:
            # Swapped in, then unloaded before a request came: what a request loads now is
            # the version the cache would serve, read as the constructor reads it (the
            # 30-minute differential run found the batcher left on the version swapped out).
            try:
                model = self.cache.describe(self.name, self.version)
            except EdgedError:
                return  # gone from the disk too: the load that follows says why
        if model is not self._model:
            for deliver in self._adopt(model):
                deliver()

    @property
    def serving_version(self) -> int:
        return self._model.version

    @property
    def stats(self) -> BatcherStats:
        """Counters over every version this batcher has run."""
        with self._lock:
            return sum(self._stats.values(), BatcherStats())

    def progress(self) -> tuple[int, int]:
        """(requests queued or running, batches run so far): what the health tick watches."""
        with self._lock:
            return (len(self._queue) + self._in_flight,
                    sum(s.exec_count for s in self._stats.values()))

    def stats_by_version(self) -> dict[int, BatcherStats]:
        with self._lock:
            return {v: s.copy() for v, s in self._stats.items()}

    def _counters(self, version: int | None = None) -> BatcherStats:
        """The counters of `version` (default: the version now served); lock held."""
        version = self._model.version if version is None else version
        stats = self._stats.get(version)
        if stats is None:
            stats = self._stats[version] = BatcherStats()
        return stats

    # -- callers -----------------------------------------------------------------------------
    def submit(self, inputs: Mapping[str, np.ndarray], priority: int | None,
               timeout_s: float | None) -> Pending:
        request = self.admit(inputs, priority, timeout_s)
        self.push(request)
        return request.future

    def admit(self, inputs: Mapping[str, np.ndarray], priority: int | None,
              timeout_s: float | None, *, checked: Checked | None = None,
              cached: tuple[str, ...] | None = None) -> Request:
        """A request checked and stamped, not yet queued or run (run_together, run_or_push);
        raises at once for bad input. `checked`: an earlier check of the same inputs, reused
        while its version is served. `cached`: the outputs asked for, where the response
        cache may answer (a hit's future comes back done)."""
        if self._epoch != self.cache.epoch:
            self._follow()
        if checked is None or checked.model is not self._model:
            checked = check(self.label, self._model, self._policy, inputs, priority, timeout_s)
        request = stamp(inputs, checked, self._clock())
        if cached is not None and self.responses is not None and caches(checked.model):
            hit_ns = look_up(request, self.responses, cached)
            if hit_ns is not None:
                with self._lock:
                    self._counters(checked.model.version).record_hit(hit_ns)
        return request

    def push(self, request: Request) -> None:
        """Queue an admitted request for the workers."""
        with self._lock:
            if self._stopping:
                raise ShuttingDown(f"{self.label} is shutting down")
            if len(self._queue) >= self._policy.max_queue:
                self._counters().rejected += 1
                raise QueueFull(f"{self.label}: queue is full ({self._policy.max_queue} requests)")
            self._queue.push(request)
            (self._filling if self._forming else self._work).notify()
            deadline = request.deadline
            if deadline is not None and (self._next_deadline is None
                                         or deadline < self._next_deadline):
                self._next_deadline = deadline
                self._reaper_wake.notify()

    def run_together(self, requests: list[Request]) -> None:
        """Admitted requests that arrived together (in one turn of the caller's event loop):
        where the batcher would run them as one batch right away (nothing queued, a slot free,
        no queue delay) and that batch is cheap (its rows' moving cost under
        TOGETHER_MAX_NS), it runs now on the calling thread; the rest are queued. Each
        request's future carries its outcome: this never raises for one of them."""
        batch = self._policy.together(requests, self._row_ns, TOGETHER_MAX_NS)
        ran = bool(batch) and self.claim_slot() \
            and self.run_claimed(batch, self.cache.acquire_loaded)
        for request in requests:
            if ran and request in batch:
                continue
            try:
                self.push(request)
            except EdgedError as exc:  # full queue, shutting down: this one fails, not all
                request.future.set_exception(exc)

    @property
    def cheap(self) -> bool:
        """Its rows cost little enough that requests arriving together may batch on the
        caller's thread (two rows at least within TOGETHER_MAX_NS; False before one ran)."""
        return self._row_ns > 0 and 2 * self._row_ns <= TOGETHER_MAX_NS

    @property
    def quick(self) -> bool:
        """Its batches take less than INLINE_MAX_NS (a moving average; False before one ran)."""
        return self._batch_ns < INLINE_MAX_NS

    # -- workers -----------------------------------------------------------------------------
    def _work_loop(self) -> None:
        # CUDA memory where the machine has it (edged.hardware.memory): a GPU backend reads it
        # in place.
        pool = new_pool(max(self._policy.max_batch, self._model.fixed_batch or 0),
                        self.cache.options.memory)
        while True:
            with self._lock:
                while not ((self._queue and self._free > 0 and not self._forming)
                           or (self._stopping and not self._queue)):
                    self._work.wait()
                if not self._queue:
                    break  # stopping, and nothing left to run
                self._free -= 1
            deliveries: list[Delivery] = []
            try:
                deliveries = self._run_next(pool)
            except Exception:  # last resort: a worker must outlive any one batch
                logger.exception("%s: worker error", self.label)
            finally:
                self.release_slot()
            # The slot is free again before callers wake: one looping inline finds it.
            for deliver in deliveries:
                deliver()
        pool.close()

    def release_slot(self) -> None:
        with self._lock:
            self._free += 1
            if self._stopping:
                self._work.notify_all()
                self._drained.notify_all()
            elif self._queue:
                self._work.notify()

    def _run_next(self, pool: BufferPool) -> list[Delivery]:
        """Lease the model, cut the next batch and run it; return the deliveries."""
        try:
            lease = self._acquire_served()
        except Exception as exc:  # loading calls into a backend; anything can come out
            if not isinstance(exc, EdgedError):
                logger.exception("%s: the model could not be leased", self.label)
            error = exc if isinstance(exc, EdgedError) else ModelLoadError(
                f"{self.label}: the model could not be leased: {exc}")
            # Every queued request would meet the same failure: fail them now.
            with self._lock:
                requests = self._queue.drain()
            return [partial(self._fail, requests, error)]
        with lease:
            deliveries = self._adopt(lease.model) if lease.model is not self._model else []
            with self._lock:
                batch, expired = self._take_batch()
                self._in_flight += len(batch)
            if expired:
                deliveries.append(partial(self._time_out, expired))
            if batch:
                deliveries.append(self._execute(batch, lease.session, pool, lease.model))
        return deliveries

    def _acquire_served(self) -> Lease:
        """Lease the model; a lease on a version the cache no longer serves (taken just
        before a swap the batcher has already followed) is given back and taken again, so
        that requests checked against the version served run on it."""
        for _ in range(STALE_LEASE_TRIES):
            lease = self.cache.acquire(self.name, self.version)
            if lease.model is self._model or \
                    self.cache.serving(self.name, self.version) is lease.model:
                return lease
            lease.release()
        return self.cache.acquire(self.name, self.version)

    def _adopt(self, model: ModelVersion) -> list[Delivery]:
        """Take on a swapped-in version's config; queued requests it cannot run are failed,
        each with what does not fit."""
        refused: list[tuple[Request, InvalidInput]] = []

        def still_valid(request: Request) -> bool:
            try:
                request.rows, request.shape_key = validate(model, request.inputs)
            except InvalidInput as exc:
                refused.append((request, misfit(self.label, model, exc)))
                return False
            return True

        with self._lock:
            if model is self._model:
                return []
            self._model, self._policy = model, BatchPolicy.of(model)
            self._queue.relevel(self._policy.levels, still_valid)
        return [partial(self._refuse, refused)] if refused else []

    def _refuse(self, refused: list[tuple[Request, InvalidInput]]) -> None:
        """Fail requests that do not fit the version taken on, each with its own reason."""
        with self._lock:
            self._counters().failure += len(refused)
        for request, error in refused:
            if not request.future.done():
                request.future.set_exception(error)

    def _take_batch(self) -> tuple[list[Request], list[Request]]:
        """Cut the next batch (lock held); also return the requests found expired."""
        policy, queue = self._policy, self._queue
        expired = queue.expire(self._clock()) if queue.with_deadline else []
        if not queue:
            return [], expired
        if not policy.batching:
            return queue.pop(1), expired
        count, rows, blocked = queue.prefix(policy.max_batch)
        if policy.max_delay_s > 0 and not policy.can_send_now(rows, blocked):
            if self._forming:
                return [], expired  # another instance is filling a batch: it takes these
            self._forming = True
            try:
                while not policy.can_send_now(rows, blocked):
                    head = queue.head()
                    assert head is not None
                    left = head.enqueued + policy.max_delay_s - self._clock()
                    if left <= 0 or self._stopping:
                        break
                    self._filling.wait(left)
                    if queue.with_deadline:
                        expired += queue.expire(self._clock())
                    if not queue:
                        return [], expired
                    count, rows, blocked = queue.prefix(policy.max_batch)
            finally:
                self._forming = False
        if self._spread and self._row_ns >= SPREAD_MIN_NS:
            share = -(-rows // self.instances)  # this instance's share: the rest for another
            if share < rows:
                count, rows, _ = queue.prefix(share)
        if policy.trim(rows) < rows:
            count, rows, _ = queue.prefix(policy.trim(rows))
        batch = queue.pop(count)
        if queue:
            self._work.notify()  # a free instance starts on what is left
        return batch, expired

    def _execute(self, batch: list[Request], session: Session, pool: BufferPool | None,
                 model: ModelVersion) -> Delivery:
        """Run one batch on `model`'s session (`execution.run_batch`); return the call that
        hands its results (or error) to the callers."""
        now = self._clock()  # each request was enqueued first: its wait is never below 0
        waits_ns = [int((now - r.enqueued) * 1e9) for r in batch]
        ran = run_batch(self.label, batch, session, pool, model.fixed_batch)
        for request in batch:
            # Inputs may be views of a caller's buffer (a shared memory region): let go of them
            # before the caller hears back and unmaps it.
            request.inputs = {}
        ns = ran.ns
        with self._lock:
            # The version run: adopted under the lease held now.
            ran_ids = {id(r) for r in ran.batch}
            self._counters().record([w for w, r in zip(waits_ns, batch, strict=True)
                                     if id(r) in ran_ids], ran.rows, ns, self._clock(),
                                    failed=ran.failure is not None)
            self._learn_cost(ran, ns)
            self._in_flight -= len(batch)
        if ran.failure is None and any(r.miss for r in ran.batch):
            return partial(self._deliver, ran, model.version)
        return ran.delivery(model.version)

    def _deliver(self, ran: Ran, version: int) -> None:
        """Keep the missed answers in the response cache, then hand the outputs out."""
        assert self.responses is not None
        counted = keep_answers(ran.batch, ran.outputs, self.responses, version)
        with self._lock:
            for ns in counted:
                self._counters(version).record_miss(ns)
        ran.delivery(version)()

    def _fail(self, requests: list[Request], error: EdgedError) -> None:
        with self._lock:
            self._counters().failure += len(requests)
        _fail_all(requests, error)

    # -- timeouts ----------------------------------------------------------------------------
    def _time_out(self, expired: list[Request]) -> None:
        if not expired:
            return
        with self._lock:
            stats = self._counters()
            stats.timeouts += len(expired)
            stats.failure += len(expired)
        now = self._clock()
        for r in expired:
            if r.future.set_running_or_notify_cancel():
                r.future.set_exception(Timeout(f"{self.label}: request timed out after "
                                               f"{(now - r.enqueued) * 1000:.0f} ms in the queue"))

    def _reap_loop(self) -> None:
        while True:
            with self._lock:
                if self._stopping and not self._queue:
                    return
                now = self._clock()
                expired = self._queue.expire(now) if self._queue.with_deadline else []
                if self._stopping and expired:
                    self._drained.notify_all()
                if not expired:
                    self._next_deadline = self._queue.earliest_deadline()
                    wait = None if self._next_deadline is None else \
                        min(max(0.0, self._next_deadline - now) + 1e-4, MAX_WAIT_S)
                    self._reaper_wake.wait(wait)
                    continue
            self._time_out(expired)

    # -- stopping ----------------------------------------------------------------------------
    def begin_stop(self) -> None:
        """Refuse new requests from now on; queued ones still run."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
            self._filling.notify_all()
            self._reaper_wake.notify_all()

    def finish_stop(self, deadline: float) -> None:
        """Let queued work run until `deadline`, fail the rest, join the threads."""
        with self._lock:
            while (self._queue or self._in_flight) and self._clock() < deadline:
                self._drained.wait(max(0.0, deadline - self._clock()))
            leftovers = self._queue.drain()
            self._work.notify_all()
            self._reaper_wake.notify_all()
        if leftovers:
            self._fail(leftovers, ShuttingDown(f"{self.label}: shut down before it ran"))
        for thread in self._threads:
            thread.join(max(0.0, deadline - self._clock()) + 0.1)


def _fail_all(requests: list[Request], error: EdgedError) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error)
