"""Per-model dynamic batching with Triton's semantics, and the worker threads that run batches.

A request is validated and queued by `Scheduler.submit()`, which returns a
`concurrent.futures.Future`. Each model has a `Batcher`: priority queues (level 1 first, FIFO
within a level), a bound on queued requests (`QueueFull`), per-request deadlines enforced
while waiting (an expired request is failed with `Timeout` and never run), and N instance
threads. A worker leases the model from the cache, gathers whatever compatible requests are
queued (waiting up to `max_queue_delay_us` for a preferred size), concatenates them along
axis 0 into a pooled buffer, runs one inference and splits the outputs back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from edged.backends import Session
from edged.cache import ModelCache
from edged.errors import EdgedError, InferenceFailed, InvalidInput, QueueFull, ShuttingDown, Timeout
from edged.memory import HostBufferPool
from edged.model_config import BatchingConfig
from edged.repository import ModelVersion

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]


@dataclass(eq=False)
class Request:
    inputs: Mapping[str, np.ndarray]
    rows: int  # batch rows this request brings (1 for a model without a batch dim)
    shape_key: tuple[tuple[int, ...], ...] | None  # requests batch together only if equal
    priority: int  # 1 = highest
    deadline: float | None
    enqueued: float
    future: Future[Outputs] = field(default_factory=Future)


@dataclass
class BatcherStats:
    """Counters with Triton's meanings (request vs inference vs execution counts)."""

    success: int = 0
    failure: int = 0
    rejected: int = 0  # QueueFull at submit
    timeouts: int = 0  # expired while queued
    inference_count: int = 0  # rows run
    exec_count: int = 0  # batches run
    queue_ns: int = 0
    compute_ns: int = 0
    last_exec: float = 0.0  # monotonic time the last batch finished (the health tick reads it)


@dataclass(frozen=True)
class Policy:
    """A model version's batching parameters, as the batcher applies them."""

    max_batch: int  # 0 = no batch dim: one request per execution
    batching: bool
    preferred: tuple[int, ...]
    max_delay_s: float
    max_queue: int
    levels: int
    default_priority: int
    default_timeout_s: float | None

    @classmethod
    def of(cls, model: ModelVersion) -> Policy:
        params = model.config.batching_params
        # `batching: off` turns the batcher off, not the queue bounds and priorities.
        bounds = params or BatchingConfig()
        levels = bounds.priority_levels
        return cls(
            max_batch=model.max_batch_size,
            batching=params is not None and model.max_batch_size > 0,
            preferred=tuple(sorted(s for s in bounds.preferred_batch_sizes
                                   if s <= model.max_batch_size)),
            max_delay_s=bounds.max_queue_delay_us / 1e6,
            max_queue=bounds.max_queue_size,
            levels=levels,
            default_priority=min(bounds.default_priority, levels) or levels,
            default_timeout_s=bounds.default_timeout_ms / 1000 or None,
        )


class Batcher:
    """The queue and instance workers of one model (a fixed version, or whichever is active)."""

    def __init__(self, cache: ModelCache, name: str, version: int | None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = cache
        self.name = name
        self.version = version
        self.label = name if version is None else f"{name}:{version}"
        self._clock = clock
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # requests queued, or stopping
        self._reaper_wake = threading.Condition(self._lock)  # an earlier deadline, or stopping
        self.stats = BatcherStats()
        self._model = cache.describe(name, version)
        self._policy = Policy.of(self._model)
        self._queues: list[deque[Request]] = [deque() for _ in range(self._policy.levels)]
        self._queued = 0
        self._with_deadline = 0
        self._next_deadline: float | None = None
        self._stopping = False
        self._in_flight = 0
        # Instance slots, shared by the worker threads and by callers running inline.
        self._free = self._model.config.instances
        self._threads = [threading.Thread(target=self._work_loop, daemon=True,
                                          name=f"edged-{self.label}-{i}")
                         for i in range(self._model.config.instances)]
        self._threads.append(threading.Thread(target=self._reap_loop, daemon=True,
                                              name=f"edged-{self.label}-timeouts"))
        for thread in self._threads:
            thread.start()

    # -- submitting --------------------------------------------------------------------------
    def _request(self, inputs: Mapping[str, np.ndarray], priority: int | None,
                 timeout_s: float | None) -> Request:
        """Validate a request against the model and stamp it (priority, deadline)."""
        model, policy = self._model, self._policy
        rows, shape_key = _validate(model, inputs)
        if priority is None or priority == 0:
            priority = policy.default_priority
        elif not 1 <= priority <= policy.levels:
            raise InvalidInput(f"{self.label}: priority {priority} is outside 1..{policy.levels}")
        now = self._clock()
        return Request(inputs, rows, shape_key, priority,
                       None if timeout_s is None else now + timeout_s, now)

    def submit(self, inputs: Mapping[str, np.ndarray], priority: int | None,
               timeout_s: float | None) -> Future[Outputs]:
        if timeout_s is None:
            timeout_s = self._policy.default_timeout_s
        request = self._request(inputs, priority, timeout_s)
        policy = self._policy
        with self._lock:
            if self._stopping:
                raise ShuttingDown(f"{self.label} is shutting down")
            if self._queued >= policy.max_queue:
                self.stats.rejected += 1
                raise QueueFull(f"{self.label}: queue is full ({policy.max_queue} requests)")
            self._queues[request.priority - 1].append(request)
            self._queued += 1
            self._work.notify()
            if request.deadline is not None:
                self._with_deadline += 1
                if self._next_deadline is None or request.deadline < self._next_deadline:
                    self._next_deadline = request.deadline
                    self._reaper_wake.notify()
        return request.future

    @property
    def depth(self) -> int:
        return self._queued

    # -- workers -----------------------------------------------------------------------------
    def _work_loop(self) -> None:
        pool = HostBufferPool(self._policy.max_batch)
        while True:
            with self._lock:
                while (self._queued == 0 or self._free == 0) and not self._stopping:
                    self._work.wait()
                if self._queued == 0:
                    return  # stopping, and nothing left to run
                self._free -= 1
            try:
                deliver = self._run_next(pool)
            finally:
                self._release_slot()
            # Wake the callers last: the slot is free again (a caller looping inline finds it)
            # and no bookkeeping is left for them to wait on.
            if deliver is not None:
                deliver()

    def _release_slot(self) -> None:
        with self._lock:
            self._free += 1
            if self._queued:
                self._work.notify()

    def _run_next(self, pool: HostBufferPool) -> Callable[[], None] | None:
        """Lease the model, take the next batch and run it; return the delivery of results."""
        try:
            lease = self.cache.acquire(self.name, self.version)
        except EdgedError as exc:
            # Every queued request would meet the same load failure: fail them now.
            requests = self._take_all()
            return partial(self._fail, requests, exc)
        try:
            if lease.model is not self._model:  # a swap brought a new version's config
                self._adopt(lease.model)
            with self._lock:
                batch = self._take_batch()
                self._in_flight += len(batch)
            return self._execute(batch, lease.session, pool) if batch else None
        finally:
            lease.release()

    def run_inline(self, inputs: Mapping[str, np.ndarray], priority: int | None,
                   timeout_s: float | None) -> Outputs:
        """Run one request on the caller's thread when nothing is queued, an instance slot is
        free and the model has no queue delay: the batcher would run it alone right away
        anyway, and this skips two thread wake-ups. Otherwise queue it like submit() and wait."""
        with self._lock:
            # With a queue delay the batcher would hold the request to grow a batch: queue it.
            inline = (self._queued == 0 and self._free > 0 and not self._stopping
                      and self._policy.max_delay_s == 0)
            if inline:
                self._free -= 1
        if not inline:
            return self.submit(inputs, priority, timeout_s).result()
        try:
            request = self._request(inputs, priority, None)
            request.future.set_running_or_notify_cancel()
            lease = self.cache.acquire(self.name, self.version)
            try:
                if lease.model is not self._model:
                    self._adopt(lease.model)
                    request.rows, request.shape_key = _validate(self._model, inputs)
                with self._lock:
                    self._in_flight += 1
                deliver = self._execute([request], lease.session, None)
            finally:
                lease.release()
        finally:
            self._release_slot()
        deliver()
        return request.future.result()

    def _adopt(self, model: ModelVersion) -> None:
        with self._lock:
            self._model = model
            self._policy = Policy.of(model)
            # Priority levels may differ: requeue everything at clamped levels, order kept.
            pending = [r for q in self._queues for r in q]
            self._queues = [deque() for _ in range(self._policy.levels)]
            for r in pending:
                r.priority = min(r.priority, self._policy.levels)
                self._queues[r.priority - 1].append(r)

    def _take_batch(self) -> list[Request]:
        """Pop the next batch (lock held): the head request and the compatible ones behind it."""
        policy = self._policy
        if self._with_deadline:
            self._expire(self._clock())
        if not self._queued:
            return []
        if not policy.batching:
            return self._pop(1)
        count, rows = self._compatible_prefix(policy.max_batch)
        if policy.max_delay_s > 0:
            oldest = min(q[0].enqueued for q in self._queues if q)
            while (rows < policy.max_batch and rows not in policy.preferred
                   and not self._stopping):
                left = oldest + policy.max_delay_s - self._clock()
                if left <= 0:
                    break
                self._work.wait(left)
                if self._with_deadline:
                    self._expire(self._clock())
                if not self._queued:
                    return []
                count, rows = self._compatible_prefix(policy.max_batch)
        # Triton: prefer the largest preferred size the queue can fill.
        fits = [p for p in policy.preferred if p <= rows]
        if fits and fits[-1] < rows:
            count, rows = self._compatible_prefix(fits[-1])
        return self._pop(count)

    def _compatible_prefix(self, max_rows: int) -> tuple[int, int]:
        """How many requests from the head (priority order) batch together within max_rows."""
        count = rows = 0
        key = None
        for queue in self._queues:
            for request in queue:
                if count == 0:
                    key = request.shape_key
                elif request.shape_key != key or rows + request.rows > max_rows:
                    return count, rows
                count += 1
                rows += request.rows
        return count, rows

    def _pop(self, count: int) -> list[Request]:
        batch: list[Request] = []
        for queue in self._queues:
            while queue and len(batch) < count:
                request = queue.popleft()
                self._queued -= 1
                if request.deadline is not None:
                    self._with_deadline -= 1
                # False when the caller cancelled the future while it waited: skip it.
                if request.future.set_running_or_notify_cancel():
                    batch.append(request)
        return batch

    def _execute(self, batch: list[Request], session: Session,
                 pool: HostBufferPool | None) -> Callable[[], None]:
        """Run one batch; return the call that hands its results (or error) to the callers."""
        started = time.perf_counter_ns()
        now = self._clock()
        queued_s = sum(now - r.enqueued for r in batch)
        if len(batch) == 1 or pool is None:
            inputs = batch[0].inputs  # no copy when a request is a batch of its own
        else:
            inputs = {name: pool.concatenate(name, [r.inputs[name] for r in batch])
                      for name in batch[0].inputs}
        rows = sum(r.rows for r in batch)
        failure: EdgedError | None = None
        outputs: Outputs = {}
        try:
            outputs = session.infer(inputs)
            if len(batch) > 1 and any(v.shape[:1] != (rows,) for v in outputs.values()):
                failure = InferenceFailed(f"{self.label}: outputs do not keep the batch dim "
                                          f"of {rows} rows; set max_batch_size: 0")
        except Exception as exc:  # the backend call: fail this batch only, keep the worker
            logger.exception("%s: inference failed for a batch of %d", self.label, rows)
            failure = InferenceFailed(f"{self.label}: inference failed: {exc}")
        finished = time.perf_counter_ns()
        with self._lock:
            s = self.stats
            s.exec_count += 1
            s.inference_count += rows
            s.compute_ns += finished - started
            s.queue_ns += int(queued_s * 1e9)
            s.last_exec = self._clock()
            if failure is None:
                s.success += len(batch)
            else:
                s.failure += len(batch)
            self._in_flight -= len(batch)
            if self._stopping:
                self._work.notify_all()
        if failure is not None:
            return lambda: _fail_all(batch, failure)
        if len(batch) == 1:
            return lambda: batch[0].future.set_result(outputs)
        return lambda: _split(batch, outputs)

    def _fail(self, requests: list[Request], error: EdgedError) -> None:
        with self._lock:
            self.stats.failure += len(requests)
        _fail_all(requests, error)

    def _take_all(self) -> list[Request]:
        with self._lock:
            return self._pop(self._queued)

    # -- timeouts ----------------------------------------------------------------------------
    def _expire(self, now: float) -> None:
        """Fail queued requests whose deadline has passed (lock held); they are never run."""
        expired: list[Request] = []
        for level, queue in enumerate(self._queues):
            if any(r.deadline is not None and r.deadline <= now for r in queue):
                keep: deque[Request] = deque()
                for r in queue:
                    (expired if r.deadline is not None and r.deadline <= now else keep).append(r)
                self._queues[level] = keep
        if not expired:
            return
        self._queued -= len(expired)
        self._with_deadline -= len(expired)
        self.stats.timeouts += len(expired)
        self.stats.failure += len(expired)
        for r in expired:
            if r.future.set_running_or_notify_cancel():
                waited = now - r.enqueued
                r.future.set_exception(Timeout(f"{self.label}: request timed out after "
                                               f"{waited * 1000:.0f} ms in the queue"))

    def _reap_loop(self) -> None:
        with self._lock:
            while not (self._stopping and self._queued == 0):
                now = self._clock()
                if self._with_deadline:
                    self._expire(now)
                deadlines = [r.deadline for q in self._queues for r in q if r.deadline is not None]
                self._next_deadline = min(deadlines) if deadlines else None
                wait = None if self._next_deadline is None else max(0.0, self._next_deadline - now)
                self._reaper_wake.wait(wait if wait is None else wait + 1e-4)

    # -- stopping ----------------------------------------------------------------------------
    def stop(self, deadline: float) -> None:
        """Stop accepting, let queued work run until `deadline`, fail the rest, join threads."""
        with self._lock:
            self._stopping = True
            self._work.notify_all()
            self._reaper_wake.notify_all()
            while (self._queued or self._in_flight) and self._clock() < deadline:
                self._work.wait(max(0.0, deadline - self._clock()))
        leftovers = self._take_all()
        if leftovers:
            self._fail(leftovers, ShuttingDown(f"{self.label}: shut down before it ran"))
        with self._lock:
            self._reaper_wake.notify_all()
            self._work.notify_all()
        for thread in self._threads:
            thread.join(max(0.0, deadline - self._clock()) + 0.1)


class Scheduler:
    """Routes requests to per-model batchers. Thread-safe; `submit` never blocks on a model."""

    def __init__(self, cache: ModelCache, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cache = cache
        self._clock = clock
        self._lock = threading.Lock()
        self._batchers: dict[tuple[str, int | None], Batcher] = {}
        self._closed = False

    def submit(self, model: str, inputs: Mapping[str, np.ndarray], *, version: int | None = None,
               priority: int | None = None, timeout_s: float | None = None) -> Future[Outputs]:
        """Queue one request. Raises at once for what is known at once (unknown model, bad
        input, full queue, shutting down); the future carries execution errors and timeouts."""
        batcher = self._batchers.get((model, version))
        if batcher is None:
            batcher = self._batcher(model, version)
        return batcher.submit(inputs, priority, timeout_s)

    def infer(self, model: str, inputs: Mapping[str, np.ndarray], *, version: int | None = None,
              priority: int | None = None, timeout_s: float | None = None) -> Outputs:
        """Run one request and wait for its outputs: on the calling thread when the model is
        idle (see Batcher.run_inline), else queued like submit()."""
        batcher = self._batchers.get((model, version))
        if batcher is None:
            batcher = self._batcher(model, version)
        return batcher.run_inline(inputs, priority, timeout_s)

    def _batcher(self, model: str, version: int | None) -> Batcher:
        with self._lock:
            if self._closed:
                raise ShuttingDown("the scheduler is shutting down")
            batcher = self._batchers.get((model, version))
            if batcher is None:
                batcher = Batcher(self.cache, model, version, clock=self._clock)
                self._batchers[(model, version)] = batcher
            return batcher

    def batchers(self) -> list[Batcher]:
        with self._lock:
            return list(self._batchers.values())

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting; drain queued work until the timeout; fail what is left."""
        with self._lock:
            self._closed = True
            batchers = list(self._batchers.values())
        deadline = self._clock() + timeout_s
        for batcher in batchers:
            batcher.stop(deadline)


def _fail_all(requests: list[Request], error: EdgedError) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_exception(error)


def _split(batch: list[Request], outputs: Outputs) -> None:
    """Hand each request its rows of the batch outputs (views, no copies)."""
    offset = 0
    for request in batch:
        end = offset + request.rows
        request.future.set_result({k: v[offset:end] for k, v in outputs.items()})
        offset = end


def _validate(model: ModelVersion, inputs: Mapping[str, np.ndarray]
              ) -> tuple[int, tuple[tuple[int, ...], ...] | None]:
    """Check names, dtypes and shapes; return (rows, shape key for batching compatibility)."""
    specs = model.inputs
    if len(inputs) != len(specs) or any(s.name not in inputs for s in specs):
        raise InvalidInput(f"{model.label} expects inputs {[s.name for s in specs]}, "
                           f"got {sorted(inputs)}")
    batched = model.max_batch_size > 0
    rows = 1
    key = []
    for i, spec in enumerate(specs):
        array = inputs[spec.name]
        if not isinstance(array, np.ndarray):
            raise InvalidInput(f"{model.label}: input {spec.name} must be a numpy array")
        if array.dtype != spec.dtype:
            raise InvalidInput(f"{model.label}: input {spec.name} has dtype {array.dtype}, "
                               f"expected {spec.dtype}")
        if array.ndim != len(spec.shape) or any(
                want not in (-1, got) for got, want in zip(array.shape, spec.shape, strict=True)):
            raise InvalidInput(f"{model.label}: input {spec.name} has shape {list(array.shape)}, "
                               f"expected {list(spec.shape)}")
        if batched:
            if i == 0:
                rows = array.shape[0]
            elif array.shape[0] != rows:
                raise InvalidInput(f"{model.label}: inputs disagree on the batch size")
            key.append(array.shape[1:])
    if batched and not 1 <= rows <= model.max_batch_size:
        raise InvalidInput(f"{model.label}: batch of {rows} is outside 1..{model.max_batch_size}")
    return rows, (tuple(key) if batched else None)
