"""The pieces of Triton's dynamic batcher that need no threads: requests, a model's batching
policy, input validation, and the priority queue that batches are cut from. The scheduler
guards a `RequestQueue` with its own lock and completes futures outside it."""

from __future__ import annotations

import _thread
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures._base import (  # Future's states
    CANCELLED,
    CANCELLED_AND_NOTIFIED,
    FINISHED,
    PENDING,  # the state Future.__init__ starts in
)
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.core.errors import InvalidInput
from edged.inference import latency
from edged.inference.responses import Miss
from edged.model.config import BatchingConfig
from edged.model.repository import ModelVersion
from edged.model.tensor import TensorSpec

Outputs = dict[str, np.ndarray]
ShapeKey = tuple[tuple[int, ...], ...] | None

# A model whose batches take less than this may run on the asking thread (the API's event
# loop, for a request with no other in flight) when it is idle: handing a request to a worker
# and its answer back costs two thread wake-ups (futex, eventfd) and the GIL changing hands
# twice: more CPU than running tiny_cls itself, and latency on every model. The loop is
# blocked this long at most, and only while it has no other request to serve.
INLINE_MAX_NS = 2_000_000
INLINE_UNKNOWN = 1 << 62  # no batch run yet: nothing is run inline before one has
# Requests for a cheap model that arrive together on the event loop run there as one batch
# (Batcher.run_together) when their rows' moving cost is under this: the loop is held that
# long at most, and each request skips the hop to a worker and back (two thread wake-ups,
# two GIL hand-overs, a future chained across threads). tiny_cls, 8 clients: see
# docs/decisions/021-own-http-stack.md, "Requests of one turn batch on the loop".
TOGETHER_MAX_NS = 500_000
# On the CPU an instance runs a batch on its own thread (ONNX Runtime's intra-op threads split
# an operator, not the batch), and a batch costs about its rows: PP-OCR cls at 1 intra-op
# thread, 874 us a row alone, 833 in a batch of 4. So where a row takes this long, an instance
# takes only its share of the queue (the rows over the instances) and leaves the rest to
# another: at 8 callers one instance ran a batch of 6 while the other sat idle (box 57% idle,
# 0.48x direct). Below it, one call per batch saves more than a second core would give.
SPREAD_MIN_NS = 250_000


class _Condition(_thread.RLock):  # type: ignore[misc]  # typeshed: final; CPython: a base
    """A `threading.Condition` over its own re-entrant lock, for one future: entered and left
    by the lock's own C methods (a Condition's are Python's, and a future takes its condition
    four or five times a request), with no work to notify while no one waits (almost always:
    the API and the streams wait on the event loop or with callbacks). Waiting and notifying
    are threading.Condition's."""

    __slots__ = ("_waiters",)
    _waiters: deque[_thread.LockType] | None

    def wait(self, timeout: float | None = None) -> bool:
        if not self._is_owned():  # type: ignore[attr-defined]
            raise RuntimeError("cannot wait on un-acquired lock")
        waiter = _thread.allocate_lock()
        waiter.acquire()
        waiters = getattr(self, "_waiters", None)
        if waiters is None:
            waiters = self._waiters = deque()
        waiters.append(waiter)
        saved = self._release_save()  # type: ignore[attr-defined]
        got = False
        try:
            if timeout is None:
                got = waiter.acquire()
            else:
                got = waiter.acquire(True, timeout) if timeout > 0 else waiter.acquire(False)
            return got
        finally:
            self._acquire_restore(saved)  # type: ignore[attr-defined]
            if not got:
                try:
                    waiters.remove(waiter)
                except ValueError:
                    pass

    def notify_all(self) -> None:
        waiters = getattr(self, "_waiters", None)
        if not waiters:
            return
        if not self._is_owned():  # type: ignore[attr-defined]
            raise RuntimeError("cannot notify on un-acquired lock")
        while waiters:
            waiter = waiters.popleft()
            try:
                waiter.release()
            except RuntimeError:  # timed out meanwhile
                pass


class Pending(Future[Outputs]):
    """A request's future; `version` is the model version that ran it, set before the
    result (an OTA swap may land between submit and run). Its condition is a `_Condition`
    (the rest is concurrent.futures.Future's own)."""

    version: int | None = None

    def __init__(self) -> None:  # Future.__init__'s, with the lighter condition
        self._condition = _Condition()  # type: ignore[assignment]
        self._state = PENDING
        self._result = None
        self._exception = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    # Future's own, but reading a state that no longer changes (finished, or cancelled) takes
    # no lock: the event loop asks both of every request it ran itself, whose future is done.
    def done(self) -> bool:
        return self._state in _DONE or super().done()

    def result(self, timeout: float | None = None) -> Outputs:
        if self._state == FINISHED and self._exception is None:
            return self._result  # type: ignore[return-value]
        return super().result(timeout)


_DONE = frozenset((CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED))


@dataclass(eq=False)
class Request:
    inputs: Mapping[str, np.ndarray]
    rows: int  # batch rows this request brings (1 for a model without a batch dim)
    shape_key: ShapeKey  # requests batch together only if their keys are equal
    priority: int  # 1 = highest
    deadline: float | None
    enqueued: float
    future: Pending = field(default_factory=Pending)
    miss: Miss | None = None  # not in the response cache: its answer goes in under this
    checked: Checked | None = None  # what its check came to (None: made by hand, unchecked)


@dataclass(frozen=True, eq=False)
class Checked:
    """What checking a request's inputs against one model version came to: a request whose
    inputs are known to be the same (same names, dtypes and shapes: the API's request plans)
    may reuse it while that version is served."""

    model: ModelVersion
    rows: int
    shape_key: ShapeKey
    priority: int  # resolved: the model's default where the request named none
    timeout_s: float | None  # resolved likewise; None: no timeout


@dataclass(frozen=True)
class BatchPolicy:
    """A model version's batching parameters, as the batcher applies them."""

    max_batch: int  # 0 = no batch dim: one request per execution
    batching: bool
    preferred: tuple[int, ...]  # ascending
    max_delay_s: float
    max_queue: int
    levels: int
    default_priority: int
    default_timeout_s: float | None
    fixed_batch: int | None = None  # the model's (ModelVersion.fixed_batch), worked out once

    @classmethod
    def of(cls, model: ModelVersion) -> BatchPolicy:
        params = model.config.batching_params
        # `batching: off` turns off batching, not the queue bound, priorities and timeouts.
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
            fixed_batch=model.fixed_batch,
        )

    def can_send_now(self, rows: int, blocked: bool) -> bool:
        """Triton sends without waiting out the delay when the batch cannot usefully grow."""
        return (blocked or rows >= self.max_batch
                or (bool(self.preferred) and rows >= self.preferred[-1]))

    def together(self, requests: list[Request], row_ns: int,
                 max_ns: int = TOGETHER_MAX_NS) -> list[Request]:
        """Of requests that arrived together, those from the first that make one batch to
        run now on the caller's thread: none if it would not be cheap (`row_ns`, a row's
        moving cost, times its rows over `max_ns`), or the model batches not, or waits for
        more."""
        if not self.batching or self.max_delay_s > 0 or not row_ns:
            return []
        batch: list[Request] = []
        rows = 0
        for request in requests:
            if request.shape_key == requests[0].shape_key \
                    and rows + request.rows <= self.max_batch:
                batch.append(request)
                rows += request.rows
        while batch and self.trim(rows) < rows:  # a preferred size, as a worker cuts
            rows -= batch.pop().rows
        if row_ns * rows > max_ns:
            return []
        return batch

    def trim(self, rows: int) -> int:
        """The row count to send: the largest preferred size that fits, else all of them."""
        fits = [p for p in self.preferred if p <= rows]
        return fits[-1] if fits else rows


class RequestQueue:
    """Priority levels (1 first), FIFO within a level. Not thread-safe: the owner locks."""

    def __init__(self, levels: int) -> None:
        self._levels: list[deque[Request]] = [deque() for _ in range(levels)]
        self.count = 0
        self.with_deadline = 0

    def __len__(self) -> int:
        return self.count

    def push(self, request: Request) -> None:
        self._levels[request.priority - 1].append(request)
        self.count += 1
        self.with_deadline += request.deadline is not None

    def head(self) -> Request | None:
        for level in self._levels:
            if level:
                return level[0]
        return None

    def prefix(self, max_rows: int) -> tuple[int, int, bool]:
        """(count, rows, blocked) of the requests from the head that batch together within
        max_rows; blocked when the next request has another shape or would not fit."""
        count = rows = 0
        key: ShapeKey = None
        for level in self._levels:
            for request in level:
                if count and (request.shape_key != key or rows + request.rows > max_rows):
                    return count, rows, True
                key = request.shape_key
                count += 1
                rows += request.rows
        return count, rows, False

    def pop(self, count: int) -> list[Request]:
        """Take `count` requests from the head; those their callers cancelled are dropped."""
        taken: list[Request] = []
        for level in self._levels:
            while level and count:
                request = level.popleft()
                count -= 1
                self.count -= 1
                self.with_deadline -= request.deadline is not None
                # False when the caller cancelled the future while it waited.
                if request.future.set_running_or_notify_cancel():
                    taken.append(request)
        return taken

    def drain(self) -> list[Request]:
        return self.pop(self.count)

    def expire(self, now: float) -> list[Request]:
        """Remove and return the requests whose deadline has passed (never to be run)."""
        return self._remove(lambda r: r.deadline is not None and r.deadline <= now)

    def earliest_deadline(self) -> float | None:
        deadlines = [r.deadline for level in self._levels for r in level
                     if r.deadline is not None]
        return min(deadlines) if deadlines else None

    def relevel(self, levels: int, keep: Callable[[Request], bool]) -> list[Request]:
        """Re-queue everything into `levels` levels (order kept, priorities clamped); return
        the requests `keep` refuses, removed."""
        pending = [r for level in self._levels for r in level]
        self._levels = [deque() for _ in range(levels)]
        self.count = self.with_deadline = 0
        refused = []
        for request in pending:
            request.priority = min(request.priority, levels)
            if keep(request):
                self.push(request)
            else:
                refused.append(request)
        return refused

    def _remove(self, doomed: Callable[[Request], bool]) -> list[Request]:
        removed: list[Request] = []
        for i, level in enumerate(self._levels):
            if any(doomed(r) for r in level):
                kept: deque[Request] = deque()
                for r in level:
                    (removed if doomed(r) else kept).append(r)
                self._levels[i] = kept
        self.count -= len(removed)
        self.with_deadline -= sum(r.deadline is not None for r in removed)
        return removed


def misfit(label: str, model: ModelVersion, exc: InvalidInput) -> InvalidInput:
    """The error of a request admitted before `model` was taken on that does not fit it."""
    return InvalidInput(f"{label}: the request does not fit version {model.version}: {exc}")


def validate(model: ModelVersion, inputs: Mapping[str, np.ndarray]) -> tuple[int, ShapeKey]:
    """Check names, dtypes and shapes; return (rows, shape key for batching compatibility).
    A batched model takes 1..max_batch_size rows, whether its graph's batch dim is dynamic or
    fixed (the batcher pads a fixed one)."""
    if model.is_language:
        raise InvalidInput(f"{model.label} is a language model: it takes no tensors; ask "
                           f"POST /v2/models/{model.name}/generate or /v1/chat/completions")
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
        _check_shape(model, spec, array.shape, batched)
        if array.dtype == np.object_:
            _check_text(model, spec.name, array)
        if batched:
            if i == 0:
                rows = array.shape[0]
            elif array.shape[0] != rows:
                raise InvalidInput(f"{model.label}: inputs disagree on the batch size")
            key.append(array.shape[1:])
    if batched and not 1 <= rows <= model.max_batch_size:
        fixed, most = model.fixed_batch, model.max_batch_size
        why = (f" (its ONNX graph has a fixed batch dim of {fixed}: a request brings at most "
               f"{most} {'row' if most == 1 else 'rows'})" if fixed else "")
        raise InvalidInput(f"{model.label}: batch of {rows} is outside "
                           f"1..{model.max_batch_size}{why}")
    return rows, (tuple(key) if batched else None)


def _check_text(model: ModelVersion, name: str, array: np.ndarray) -> None:
    """A string input's elements are UTF-8 text, as ONNX defines its strings (a client's
    BYTES element that is not is refused here, for its own request only)."""
    for i, item in enumerate(array.reshape(-1)):
        if isinstance(item, str):
            continue
        if not isinstance(item, (bytes, np.bytes_)):
            raise InvalidInput(f"{model.label}: input {name} element {i} is "
                               f"{type(item).__name__}, not bytes or text")
        try:
            item.decode()
        except UnicodeDecodeError:
            raise InvalidInput(f"{model.label}: input {name} element {i} is not UTF-8 text, "
                               "which an ONNX string tensor must hold") from None


def _check_shape(model: ModelVersion, spec: TensorSpec, shape: tuple[int, ...],
                 batched: bool) -> None:
    """InvalidInput unless `shape` fits `spec` (the batch dim, when batched, is any size)."""
    dims = spec.shape[1:] if batched else spec.shape
    given = shape[1:] if batched else shape
    if given == dims and len(shape) == len(spec.shape):  # all dims as given: one compare
        return

    def fits(got: tuple[int, ...]) -> bool:
        return len(got) == len(dims) and all(
            want in (-1, size) for size, want in zip(got, dims, strict=True))

    if len(shape) == len(spec.shape) and fits(given):
        return
    expected = [-1, *dims] if batched else list(dims)
    hint = ""
    if batched and fits(shape):  # one sample without its batch dim
        hint = f"; the first dim is the batch dim: send {[1, *shape]} for one sample"
    raise InvalidInput(f"{model.label}: input {spec.name} has shape {list(shape)}, "
                       f"expected {expected}{hint}")


def split(batch: list[Request], outputs: Outputs, version: int | None = None) -> None:
    """Hand each request its rows of the batch outputs (views, no copies)."""
    for request in batch:
        request.future.version = version
    if len(batch) == 1:
        batch[0].future.set_result(outputs)
        return
    offset = 0
    for request in batch:
        end = offset + request.rows
        request.future.set_result({k: v[offset:end] for k, v in outputs.items()})
        offset = end


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
    request_ns: int = 0  # per request: its queue wait + its batch's compute
    success_ns: int = 0  # request_ns of the requests that succeeded
    fail_ns: int = 0  # request_ns of the requests whose batch failed
    # Response cache (Triton's meanings): hits are in `success` (and their lookup in
    # success_ns and request_ns) but ran no batch; a miss's lookup and insert add to its
    # request's time.
    cache_hits: int = 0
    cache_hit_ns: int = 0
    cache_misses: int = 0
    cache_miss_ns: int = 0
    last_exec: float = 0.0  # clock time the last batch finished (the health tick reads it)
    last_inference_ms: int = 0  # wall clock (ms since the epoch) of the same, for clients
    # rows in a batch -> (batches of that size, their compute ns): Triton's batch_stats
    batch_sizes: dict[int, tuple[int, int]] = field(default_factory=dict)
    latency: list[int] = field(default_factory=latency.empty)  # requests per latency bucket

    def record(self, waits_ns: Sequence[int], rows: int, ns: int, now: float, *,
               failed: bool) -> None:
        """One batch of requests (`rows` rows) that each waited their `waits_ns` in the queue
        and ran for `ns`, finishing at clock time `now`."""
        requests, queued_ns = len(waits_ns), sum(waits_ns)
        latency.observe_each(self.latency, waits_ns, ns)
        self.exec_count += 1
        self.inference_count += rows
        self.compute_ns += ns
        self.queue_ns += queued_ns
        spent = queued_ns + ns * requests
        self.request_ns += spent
        self.last_exec = now
        self.last_inference_ms = int(time.time() * 1000)
        count, sized_ns = self.batch_sizes.get(rows, (0, 0))
        self.batch_sizes[rows] = (count + 1, sized_ns + ns)
        if failed:
            self.failure += requests
            self.fail_ns += spent
        else:
            self.success += requests
            self.success_ns += spent

    def record_hit(self, ns: int) -> None:
        """A request answered from the response cache in `ns` (as Triton: a success, no
        queue time, no execution)."""
        self.success += 1
        self.success_ns += ns
        self.request_ns += ns
        self.cache_hits += 1
        self.cache_hit_ns += ns

    def record_miss(self, ns: int) -> None:
        """A request not in the response cache whose answer went in; `ns`: lookup + insert."""
        self.cache_misses += 1
        self.cache_miss_ns += ns
        self.success_ns += ns
        self.request_ns += ns

    def __add__(self, other: BatcherStats) -> BatcherStats:
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name)
                  for f in dataclasses.fields(self)
                  if f.name not in ("last_exec", "last_inference_ms", "batch_sizes",
                                    "latency")}
        sizes = dict(self.batch_sizes)
        for rows, (count, ns) in other.batch_sizes.items():
            held = sizes.get(rows, (0, 0))
            sizes[rows] = (held[0] + count, held[1] + ns)
        return BatcherStats(**summed, last_exec=max(self.last_exec, other.last_exec),
                            last_inference_ms=max(self.last_inference_ms,
                                                  other.last_inference_ms),
                            batch_sizes=sizes,
                            latency=latency.merged(self.latency, other.latency))

    def copy(self) -> BatcherStats:
        return dataclasses.replace(self, batch_sizes=dict(self.batch_sizes),
                                   latency=list(self.latency))
