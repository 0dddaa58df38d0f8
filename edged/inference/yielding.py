"""Streams first: before each decode step a language model's generation worker waits while
vision inference (the cameras' frames, the API's requests to vision models) is queued or
running in the scheduler, at most `llm.yield_max_ms` a token, so an answer still moves beside
cameras that never rest (decision 040). The signal is a glance at counts the batchers keep
anyway (`Scheduler.working`), read without a lock and polled by the worker alone: the frames'
path neither waits on the chat nor does anything for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from edged.model.config import LanguageConfig

# How often a waiting worker looks again. A wake-up is a few microseconds of Python; a wait
# signalled by the frames' path would put work on it, which is what this rule must not do.
POLL_S = 0.002

Working = Callable[[], int]  # vision requests queued or running now


class StreamsFirst:
    """One generation worker's yield: `pause()` before each step."""

    def __init__(self, working: Working | None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self._working = working
        self._clock = clock

    def pause(self, config: LanguageConfig, cond: threading.Condition,
              stop: Callable[[], bool]) -> float | None:
        """Wait (on `cond`, so that closing wakes it) while vision inference is under way,
        `config.yield_max_ms` at most; `stop()` true ends it at once. The seconds waited, or
        None when there was nothing to yield to."""
        working = self._working
        if working is None or not config.yield_to_streams or not working():
            return None
        started = self._clock()
        limit = started + config.yield_max_ms / 1000
        with cond:
            while not stop():
                left = limit - self._clock()
                if left <= 0 or not working():
                    break
                cond.wait(min(POLL_S, left))
        return self._clock() - started
