"""Waiting for state that can only be read: `wait_until` asks again and again, within a bounded
time, and on failure says what it waited for and the last answer it got.

Where something signals (a threading.Condition, an Event, a queue, a subprocess's exit), wait
on the signal instead; GateBackend, the broker's Subscriber and the NotifyReceiver do. A test
never sleeps a fixed time in the hope that something has happened by then."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02,
               what: str = "the condition", alive: Callable[[], object] | None = None,
               details: Callable[[], str] | None = None) -> T:
    """Call `predicate` until it returns something truthy, and return that.

    Raises AssertionError naming `what` and the last value seen when `timeout` seconds pass,
    or at once when `alive` (say, "the subprocess still runs") turns falsy: what is waited for
    can no longer come. `details` adds text to either message (a log, say). `interval` is the
    pause between calls; 0 for a predicate that blocks for a while itself (a bounded read)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and not alive():
            raise AssertionError(_failure(f"gave up waiting for {what}: it can no longer "
                                          "happen", value, details))
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(_failure(f"not within {timeout:g} s: {what}", value, details))
        if interval > 0:
            time.sleep(min(interval, left))


def _failure(headline: str, value: object, details: Callable[[], str] | None) -> str:
    text = f"{headline} (last value: {value!r})"
    return f"{text}\n{details()}" if details is not None else text
