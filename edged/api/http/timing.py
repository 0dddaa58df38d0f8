"""The one timer of a connection (`Timing`, mixed into `edged.api.http.connection`'s): one loop
timer at a time bounds what the client owes (its request's head, taking an answer, the rest of
a body being dropped, the next request on an idle kept-alive connection). Re-arming moves the
due time only: the timer wakes at the earliest due it was set for and sleeps on to a later one,
so a request's many re-arms cost no timer handles."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

TIMER_SLACK_S = 0.005  # a timer this close to its bound acts (loops round to their clock)


class Timing:
    """The bound in force: what it bounds (`timing`: "head", "send", "linger", "idle"; ""
    none), when it falls due (`due`, loop time), what then happens (`then`)."""

    timing: str
    due: float | None
    then: Callable[[], None]
    timer: asyncio.TimerHandle | None
    _loop: asyncio.AbstractEventLoop | None  # see loop()

    def _arm(self, delay: float, then: Callable[[], None], timing: str) -> None:
        loop = self.loop()
        due = loop.time() + delay
        self.timing, self.due, self.then = timing, due, then
        if self.timer is None or self.timer.when() > due:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = loop.call_at(due, self._on_timer)

    def loop(self) -> asyncio.AbstractEventLoop:
        """The connection's event loop, asked once: CPython 3.11's get_running_loop() makes a
        getpid system call each time (it checks for a fork), one or two a request."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _disarm(self) -> None:
        self.timing, self.due = "", None  # a timer still set finds nothing due, and goes

    def _on_timer(self) -> None:
        self.timer = None
        due = self.due
        if due is None:
            return
        loop = self.loop()
        if due - loop.time() > TIMER_SLACK_S:  # re-armed since: sleep on to the new due
            self.timer = loop.call_at(due, self._on_timer)
            return
        then = self.then
        self._disarm()
        then()

    def _drop_timer(self) -> None:
        self._disarm()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
