"""The describer: ended events in, review summaries out, off the frame path. `submit` (on a
stream's thread) only checks the stream's settings and its rate and queues: it never waits.
One worker thread (nice'd) takes the queue newest-last, answers from the cache when the same
thing was asked before, else asks (the local model or the endpoint) within the timeout,
parses and validates the answer against the review-summary schema (one retry when it does
not fit), publishes it on `<prefix>/events/<id>/description` and keeps it with the event.

A full queue drops its oldest event; a describer that is down or slow costs a skipped
description each (counted), never a stream's frame."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edged.core.errors import EdgedError, EndpointFailed, Timeout
from edged.describer.askers import Asker, EndpointAsker, LocalAsker
from edged.describer.config import DescriberConfig, StreamDescribeConfig
from edged.describer.limits import AnswerCache, TokenBucket
from edged.describer.prompt import Subject, cache_key, messages
from edged.describer.summary import SchemaMismatch, parse_answer
from edged.inference.cache import ModelCache
from edged.inference.generation import Generations

logger = logging.getLogger(__name__)

ATTEMPTS = 2  # an answer that does not fit the schema is asked once more
JOIN_S = 5.0
LOG_EVERY = 100  # a repeated failure is logged at its 1st, then every LOG_EVERY-th time

Publish = Callable[[str, bytes], None]  # (object id, JSON payload)
Keep = Callable[[str, dict[str, Any]], None]  # (object id, the kept record)


@dataclass
class DescriberCounters:
    """Since start (GET /v2/edged/status's `describer`, /metrics)."""

    queued_total: int = 0  # events accepted into the queue
    described: int = 0  # answers published (cache hits included)
    cached: int = 0  # of those, answered from the cache
    dropped: int = 0  # the queue was full: its oldest event was dropped
    rate_limited: int = 0  # over the stream's per_minute
    failed_schema: int = 0  # answers that did not fit the schema twice
    retries: int = 0  # answers that did not fit once (then asked again)
    endpoint_errors: int = 0  # the endpoint (or the local model) failed or was unreachable
    timeouts: int = 0  # no answer within the timeout
    failed: int = 0  # other errors (a bug, a model not loaded): logged


class Describer:
    def __init__(self, asker: Asker, config: DescriberConfig, *, publish: Publish,
                 keep: Keep, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.asker = asker
        self.config = config
        self.publish = publish
        self.keep = keep
        self.counters = DescriberCounters()
        self.cache = AnswerCache(config.cache)
        self._clock = clock
        self._wall = wall
        self._cond = threading.Condition()
        self._queue: deque[Subject] = deque()
        self._buckets: dict[str, TokenBucket] = {}
        self._closed = False
        self.busy = False
        self._thread = threading.Thread(target=self._run, name="edged-describer", daemon=True)
        self._thread.start()

    @property
    def source(self) -> str:
        return "local" if isinstance(self.asker, LocalAsker) else "endpoint"

    # -- the streams' side ----------------------------------------------------------------------
    def submit(self, subject: Subject, settings: StreamDescribeConfig) -> bool:
        """Queue an ended event when its stream wants it described (label, duration) and its
        rate allows; True when queued. Never blocks beyond a lock: called on a stream's
        thread."""
        if not settings.enabled or (settings.labels and subject.label not in settings.labels) \
                or subject.duration_s < settings.min_duration_s:
            return False
        with self._cond:
            if self._closed:
                return False
            bucket = self._buckets.get(subject.stream)
            if bucket is None:
                bucket = self._buckets[subject.stream] = TokenBucket(
                    settings.per_minute / 60, settings.burst, self._clock)
            elif (bucket.rate_per_s, bucket.burst) != (settings.per_minute / 60,
                                                       settings.burst):
                bucket.retune(settings.per_minute / 60, settings.burst)
            if not bucket.take():
                self.counters.rate_limited += 1
                self._keep_skip(subject, "rate_limited")
                return False
            if len(self._queue) >= self.config.queue:
                dropped = self._queue.popleft()
                self.counters.dropped += 1
                self._keep_skip(dropped, "dropped")
                if _worth_logging(self.counters.dropped):
                    logger.warning("describer: queue full (%d), dropped the oldest event %s "
                                   "(#%d)", self.config.queue, dropped.object_id,
                                   self.counters.dropped, extra={"code": "describer_dropped"})
            self._queue.append(subject)
            self.counters.queued_total += 1
            self._cond.notify()
        return True

    def statistics(self) -> dict[str, Any]:
        with self._cond:
            queued = len(self._queue)
        return {**vars(self.counters), "queued": queued, "describing": int(self.busy),
                "model": self.asker.model, "source": self.source, "cache_size": len(self.cache)}

    def close(self, timeout_s: float = JOIN_S) -> None:
        """Stop: the queued events are left undescribed, the one being asked gets
        `timeout_s` (its own timeout bounds it anyway)."""
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify()
        self._thread.join(timeout_s)

    # -- the worker -----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.config.nice)
        except (OSError, AttributeError) as exc:
            logger.warning("describer: cannot set its thread's niceness to %d: %s",
                           self.config.nice, exc)
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                subject = self._queue.popleft()
                self.busy = True
            try:
                self._describe(subject)
            except Exception:  # a bug: this event goes undescribed, the worker goes on
                self.counters.failed += 1
                logger.exception("describer: describing %s failed", subject.object_id)
            finally:
                self.busy = False

    def _describe(self, subject: Subject) -> None:
        vision = self.asker.vision
        key = cache_key(subject, vision=vision, model=self.asker.model,
                        instructions=self.config.instructions)
        start = self._clock()
        summary = self.cache.get(key)
        cached, attempts = summary is not None, 0
        if summary is None:
            asked = messages(subject, vision=vision, instructions=self.config.instructions)
            deadline = start + self.config.timeout_s
            summary, attempts = self._ask(subject, asked, deadline)
            if summary is None:
                return
            self.cache.put(key, summary)
        else:
            self.counters.cached += 1
        payload = {"id": subject.object_id, "stream": subject.stream, "label": subject.label,
                   "summary": summary, "model": self.asker.model, "source": self.source,
                   "duration_s": round(self._clock() - start, 3), "cached": cached,
                   "attempts": attempts, "time": round(self._wall(), 3)}
        self.counters.described += 1
        self.keep(subject.object_id, {"state": "described", **payload})
        self.publish(subject.object_id, json.dumps(payload, separators=(",", ":")).encode())

    def _ask(self, subject: Subject, asked: list[dict[str, Any]], deadline: float
             ) -> tuple[dict[str, Any] | None, int]:
        """The validated summary and the attempts it took; None (counted, kept as failed)
        when there is none."""
        problem = ""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                text = self.asker.ask(asked, deadline)
            except Timeout as exc:
                self.counters.timeouts += 1
                self._fail(subject, "timeout", exc)
                return None, attempt
            except EndpointFailed as exc:
                self.counters.endpoint_errors += 1
                self._fail(subject, "endpoint_error", exc)
                return None, attempt
            except EdgedError as exc:  # the local model: not loaded, queue full, shutting down
                self.counters.endpoint_errors += 1
                self._fail(subject, exc.code, exc)
                return None, attempt
            try:
                return parse_answer(text), attempt
            except SchemaMismatch as exc:
                problem = str(exc)
                if attempt < ATTEMPTS:
                    self.counters.retries += 1
                    logger.info("describer: %s's answer does not fit the schema (%s); "
                                "asking again", subject.object_id, problem)
        self.counters.failed_schema += 1
        self._fail(subject, "failed_schema", SchemaMismatch(problem))
        return None, ATTEMPTS

    def _fail(self, subject: Subject, state: str, exc: Exception) -> None:
        count = self.counters.timeouts + self.counters.endpoint_errors + \
            self.counters.failed_schema
        if _worth_logging(count):
            logger.warning("describer: no description of %s: %s: %s (#%d)", subject.object_id,
                           state, exc, count, extra={"code": f"describer_{state}"})
        self.keep(subject.object_id, {"state": "failed", "reason": state,
                                      "error": str(exc)[:300], "model": self.asker.model})

    def _keep_skip(self, subject: Subject, reason: str) -> None:
        self.keep(subject.object_id, {"state": "skipped", "reason": reason})


def _worth_logging(count: int) -> bool:
    return count == 1 or count % LOG_EVERY == 0


def open_describer(config: DescriberConfig, generations: Generations, cache: ModelCache, *,
                   publish: Publish, keep: Keep) -> Describer | None:
    """The daemon's describer: the local model's or the endpoint's; None when `describer:`
    names neither (descriptions are off). Raises ConfigError for an API key file that
    cannot be read."""
    asker: Asker
    if config.model is not None:
        asker = LocalAsker(generations, cache, config.model, max_tokens=config.max_tokens,
                           temperature=config.temperature)
    elif config.endpoint is not None:
        asker = EndpointAsker(config.endpoint, max_tokens=config.max_tokens,
                              temperature=config.temperature)
    else:
        return None
    logger.info("describer: ended events of streams with describe.enabled go to %s %s",
                "the local model" if config.model is not None else "the endpoint",
                asker.model)
    return Describer(asker, config, publish=publish, keep=keep)
