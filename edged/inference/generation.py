"""Generation for language models: a fair queue per model (bounded, priorities, a deadline for
each request's wait) and one worker thread per model that generates off the event loop,
leasing the model from the warm cache for each request (so an OTA swap lets the answers under
way finish on the old version while the next start on the new). A session that batches
(`BatchedLanguageSession`, `llm.sequences` > 1) generates up to that many answers at once: the
worker admits queued requests into free slots between steps, and each step gives every answer
under way its next token; any other session generates a request at a time. Before each token
the worker waits for vision inference (streams first, `edged.inference.yielding`), and a
request of a higher priority that finds no slot pauses the lowest answer under way (it
resumes where it was: `Sequences.pause`, decision 040). What it takes and gives (`Ask`, the
events) is `edged.inference.asks`'s, named here too. A request's
`Generation` is its handle: events come to it on its event loop as they happen (start, one
piece per token, done or error); `cancel()` (the client gone) stops it within one token."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edged.backends import BatchedLanguageSession, LanguageSession, Prompt, Sampling
from edged.core.errors import (
    EdgedError,
    InferenceFailed,
    InvalidInput,
    QueueFull,
    ShuttingDown,
    Timeout,
)
from edged.inference.asks import Ask, Deliver, Done, Event, GenerationCounters, Started
from edged.inference.cache import ModelCache
from edged.inference.sequences import Paused, Sequences
from edged.inference.yielding import StreamsFirst, Working
from edged.model.config import LanguageConfig

__all__ = ["Ask", "Deliver", "Done", "Event", "Generation", "GenerationCounters", "Generations",
           "Started"]

logger = logging.getLogger(__name__)

GRACE_S = 2.0  # at shutdown, what a running answer gets to finish before it is cut
JOIN_S = 10.0  # a worker's current token and cleanup, once its answer is cancelled


class Generation:
    """One request's handle. Events arrive in order, the last a Done or an EdgedError: on an
    event loop (`next()`), or handed to a callable on the worker's thread as they happen (an
    MQTT request's publisher; it must not block)."""

    def __init__(self, ask: Ask, to: asyncio.AbstractEventLoop | Deliver) -> None:
        self.ask = ask
        self.cancelled = threading.Event()
        self._loop = to if isinstance(to, asyncio.AbstractEventLoop) else None
        self._deliver = None if isinstance(to, asyncio.AbstractEventLoop) else to
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._line: _Line | None = None

    async def next(self) -> Event:
        return await self._events.get()

    def cancel(self) -> None:
        """Stop it: out of its queue if it has not started, else before its next token."""
        if not self.cancelled.is_set():
            self.cancelled.set()
            if self._line is not None:
                self._line.discard(self)

    def _emit(self, event: Event) -> None:
        if self._deliver is not None:
            try:
                self._deliver(event)
            except Exception:  # the receiver's bug: the worker goes on
                logger.exception("%s: delivering a generation event failed", self.ask.model)
            return
        try:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # its loop is closed: nobody is listening
            pass


@dataclass(order=True)
class _Queued:
    level: int
    seq: int
    deadline: float = field(compare=False)
    generation: Generation = field(compare=False)
    paused: Paused | None = field(default=None, compare=False)  # an answer preempted


class _Line:
    """One model's queue and the worker thread that empties it."""

    def __init__(self, name: str, cache: ModelCache, config: LanguageConfig,
                 counters: GenerationCounters, clock: Callable[[], float],
                 working: Working | None = None) -> None:
        self.name = name
        self.cache = cache
        self.config = config
        self.counters = counters
        self._clock = clock
        self._cond = threading.Condition()
        self._heap: list[_Queued] = []
        self._seq = itertools.count()
        self._closed = False
        self.current: Generation | None = None  # the one generating alone (no batching)
        self.running = Sequences(counters)  # the answers under way in batching sessions
        self._blocked = False  # a request went back to the queue: no slot for it yet
        self._streams_first = StreamsFirst(working)
        self._thread = threading.Thread(target=self._run, name=f"edged-generate-{name}",
                                         daemon=True)
        self._thread.start()

    @property
    def generating(self) -> int:
        return len(self.running) + (self.current is not None)

    @property
    def queued(self) -> int:
        with self._cond:
            return len(self._heap)

    def put(self, generation: Generation) -> None:
        ask, config = generation.ask, self.config
        if not 0 <= ask.priority <= config.priority_levels:
            raise InvalidInput(f"priority must be 0 to {config.priority_levels} (model "
                               f"{self.name}'s llm.priority_levels; 1 is the highest)")
        level = ask.priority or config.default_priority or config.priority_levels
        timeout = ask.timeout_s if ask.timeout_s is not None else (
            config.default_timeout_ms / 1000 or None)
        deadline = self._clock() + timeout if timeout else float("inf")
        with self._cond:
            if self._closed:
                raise ShuttingDown("the daemon is stopping")
            if len(self._heap) >= config.max_queue:
                self.counters.refused += 1
                raise QueueFull(f"{self.name}: {len(self._heap)} generation requests queued "
                                f"(llm.max_queue {config.max_queue})")
            generation._line = self
            heapq.heappush(self._heap, _Queued(min(level, config.priority_levels),
                                               next(self._seq), deadline, generation))
            self._cond.notify()

    def discard(self, generation: Generation) -> None:
        with self._cond:
            gone = [q for q in self._heap if q.generation is generation]
            if not gone:
                return
            self._heap = [q for q in self._heap if q.generation is not generation]
            heapq.heapify(self._heap)
            self.counters.cancelled += sum(q.paused is None for q in gone)
        for queued in gone:  # a paused answer ends with what it had (Sequences.forget)
            if queued.paused is not None:
                self.running.forget(queued.paused)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            doomed, self._heap = self._heap, []
            self._cond.notify()
        for queued in doomed:
            if queued.paused is not None:
                self.running.forget(queued.paused)
            else:
                queued.generation._emit(ShuttingDown("the daemon is stopping"))

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    # -- the worker ---------------------------------------------------------------------------
    def _run(self) -> None:
        self._lower_priority()
        while True:
            with self._cond:
                while True:
                    wait = self._expire()
                    if self.running or (self._heap and not self._closed):
                        break
                    if self._closed:
                        return
                    self._cond.wait(wait)
            self._blocked = False
            while self._start(self._pop()):  # admit while there is room, a request at a time
                pass
            while self._preempt() and self._start(self._pop()):
                pass
            if self.running:
                self._yield()
                self.running.step()
            elif self._blocked:  # requeued with nothing under way: slots held elsewhere
                with self._cond:
                    self._cond.wait(0.05)

    def _yield(self) -> None:
        """Vision inference first: wait for it before the next token (bounded)."""
        waited = self._streams_first.pause(self.config, self._cond, lambda: self._closed)
        if waited is not None:
            self.counters.yields += 1
            self.counters.yield_s += waited

    def _preempt(self) -> bool:
        """When a queued request found no room and outranks an answer under way, pause the
        lowest-priority answer (the last to come of its level) for it: back in the queue in
        its place, it resumes where it was when a slot frees."""
        victim = self.running.lowest() if self.config.preempt else None
        with self._cond:
            if victim is None or self._closed or not self._heap \
                    or self._heap[0].level >= victim.level:
                return False
            outranking = self._heap[0].level
            paused = self.running.pause(victim)
            heapq.heappush(self._heap, _Queued(victim.level, victim.order, float("inf"),
                                               victim.generation, paused))
        logger.debug("%s: paused an answer of priority %d for one of %d", self.name,
                     victim.level, outranking)
        return True

    def _pop(self) -> _Queued | None:
        """The next request, if one may start now: up to `llm.sequences` answers at once."""
        with self._cond:
            if self._closed or not self._heap or len(self.running) >= self.config.sequences:
                return None
            return heapq.heappop(self._heap)

    def _requeue(self, queued: _Queued) -> None:
        """Back in its place (its level and arrival kept) until a slot frees."""
        with self._cond:
            heapq.heappush(self._heap, queued)
            self._blocked = True

    def _lower_priority(self) -> None:
        """This thread (and the llama.cpp threads it starts, which inherit it) yields the CPU
        to the cameras' inference: Linux's niceness is per thread."""
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.config.nice)
        except (OSError, AttributeError) as exc:  # not Linux, or not allowed: said, not fatal
            logger.warning("%s: cannot set the generating thread's niceness to %d: %s",
                           self.name, self.config.nice, exc)

    def _expire(self) -> float | None:
        """Fail the queued requests past their deadline (lock held); the seconds until the
        next one's, or None."""
        now = self._clock()
        late = [q for q in self._heap if q.deadline <= now]
        if late:
            self._heap = [q for q in self._heap if q.deadline > now]
            heapq.heapify(self._heap)
            self.counters.timed_out += len(late)
            for queued in late:
                queued.generation._emit(Timeout(
                    f"{self.name}: waited in the generation queue past its timeout"))
        deadlines = [q.deadline for q in self._heap if q.deadline != float("inf")]
        return max(0.0, min(deadlines) - now) if deadlines else None

    def _start(self, queued: _Queued | None) -> bool:
        """Admit a request into a batching session's free slot, or, on a session that
        generates alone, generate its whole answer now (when no batched one is under way).
        False: admit no more before the next step."""
        if queued is None:
            return False
        generation = queued.generation
        if queued.paused is not None:
            return self._resume(queued, queued.paused)
        if generation.cancelled.is_set():
            return True
        ask = generation.ask
        try:
            lease = self.cache.acquire(ask.model, ask.version)
        except EdgedError as exc:
            self.counters.failed += 1
            generation._emit(exc)
            return True
        session = lease.session
        batching = isinstance(session, BatchedLanguageSession) and session.sequences > 1
        full = isinstance(session, BatchedLanguageSession) and not session.free_slots()
        if (batching and full) or (not batching and self.running):
            lease.release()  # its turn comes when a slot frees (an OTA swap's brief overlap)
            self._requeue(queued)
            return False
        try:
            if not isinstance(session, LanguageSession):
                raise InvalidInput(f"{lease.model.label} is not a language model: it cannot "
                                   "generate")
            if isinstance(session, BatchedLanguageSession) and batching:
                prompt: Prompt = session.chat(ask.messages) if ask.messages is not None \
                    else session.prompt(ask.prompt)
                self.running.admit(generation, lease, session, prompt, self._sampling(ask),
                                   queued.level, queued.seq)
                return True
            self.current = generation
            self._generate(generation, session, lease.model.version)
        except EdgedError as exc:
            self.counters.failed += 1
            generation._emit(exc)
        except Exception as exc:  # llama.cpp's own errors: this request fails, the rest go on
            logger.exception("%s: generation failed", lease.model.label)
            self.counters.failed += 1
            generation._emit(InferenceFailed(f"{lease.model.label}: generation failed: {exc}"))
        finally:
            self.current = None
            if not self.running.holds(lease):
                lease.release()
        return batching

    def _resume(self, queued: _Queued, paused: Paused) -> bool:
        """A paused answer back into a free slot of its session, or back in its place."""
        if queued.generation.cancelled.is_set():
            self.running.forget(paused)
            return True
        if not paused.session.free_slots():
            self._requeue(queued)
            return False
        self.running.resume(paused)
        return True

    def _sampling(self, ask: Ask) -> Sampling:
        return Sampling(ask.max_tokens or self.config.max_tokens, ask.temperature, ask.top_p,
                        ask.stop, ask.json_schema, ask.seed)

    def _generate(self, generation: Generation, session: LanguageSession,
                  version: int) -> None:
        ask = generation.ask
        prompt: Prompt = session.chat(ask.messages) if ask.messages is not None \
            else session.prompt(ask.prompt)
        pieces = session.generate(prompt, self._sampling(ask))  # raises what it cannot follow
        generation._emit(Started(version, len(prompt.tokens), session.context_length))
        count, reason = 0, "cancelled"
        try:
            for piece in pieces:
                if generation.cancelled.is_set():
                    break
                count += 1
                generation._emit(piece)
                if piece.finish_reason is not None:
                    reason = piece.finish_reason
                    break
                if self._heap:  # a queued request's deadline passes while this one runs
                    with self._cond:
                        self._expire()
                self._yield()
        finally:
            pieces.close()
        self.counters.tokens += count
        if reason == "cancelled":
            self.counters.cancelled += 1
        else:
            self.counters.completed += 1
        generation._emit(Done(len(prompt.tokens), count, reason))


class Generations:
    """The generation queues of every language model, made on first use."""

    def __init__(self, cache: ModelCache, *, clock: Callable[[], float] = time.monotonic,
                 working: Working | None = None) -> None:
        """`working`: how many vision requests are queued or running now (Scheduler.working),
        which generation yields to between tokens (llm.yield_to_streams); None: nothing."""
        self.cache = cache
        self._clock = clock
        self._working = working
        self._lock = threading.Lock()
        self._lines: dict[str, _Line] = {}
        self.counters: dict[str, GenerationCounters] = {}
        self._closed = False

    def submit(self, ask: Ask, to: asyncio.AbstractEventLoop | Deliver) -> Generation:
        """Queue `ask`, its events to `to` (see Generation). Raises at once what is known at
        once: an unknown model, one that is not a language model, a full queue, a bad
        priority, shutting down. Reads the model's config (cached): call it off the loop."""
        model = self.cache.describe(ask.model, ask.version)
        if not model.is_language:
            raise InvalidInput(f"{model.label} is not a language model (its file is "
                               f"{model.model_path.name}): it cannot generate; language "
                               "models are model.gguf files or trtllm/ folders")
        generation = Generation(ask, to)
        self._line(ask.model, model.config.llm).put(generation)
        return generation

    def _line(self, name: str, config: LanguageConfig) -> _Line:
        with self._lock:
            if self._closed:
                raise ShuttingDown("the daemon is stopping")
            line = self._lines.get(name)
            if line is None:
                counters = self.counters.setdefault(name, GenerationCounters())
                line = self._lines[name] = _Line(name, self.cache, config, counters,
                                                 self._clock, self._working)
            else:  # one worker per model whatever its versions (a session's slots are its)
                line.config = config  # a new version's model.yaml: its bounds from now on
            return line

    def statistics(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            lines = dict(self._lines)
        return {name: {**vars(self.counters[name]), "queued": line.queued,
                       "generating": line.generating} for name, line in lines.items()}

    def close(self, timeout_s: float = GRACE_S) -> None:
        """Refuse new requests, fail the queued ones; a running answer gets `timeout_s` to
        finish, then is cancelled (its client gets what came so far) and its worker stops
        after its token."""
        with self._lock:
            self._closed = True
            lines = list(self._lines.values())
        for line in lines:
            line.close()
        deadline = time.monotonic() + timeout_s
        for line in lines:
            line.join(max(0.0, deadline - time.monotonic()))
            late = line.running.generations() + [
                g for g in (line.current,) if g is not None]
            for generation in late:  # past the deadline: its answer ends where it is
                generation.cancel()
            if late:
                line.join(JOIN_S)

