"""Is the daemon making progress? The health tick's checks (a model worker stuck in a call, a
stream loop or capture thread that stopped moving), which decide whether systemd's watchdog
is pinged and what `/v2/health/live` says, and the recent warnings `edged status` shows."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

logger = logging.getLogger(__name__)


class Progressing(Protocol):
    """A model's batcher as the health tick sees it."""

    label: str
    name: str
    version: int | None

    def progress(self) -> tuple[int, int]: ...  # (requests queued or running, batches run)


class Beating(Protocol):
    """A thread that stamps a heartbeat each time round its loop."""

    def heartbeat(self) -> tuple[str, float | None]: ...  # (what, clock time of last beat)


@dataclass
class _Seen:
    batches: int
    since: float  # last time it was idle or finished a batch


class HealthMonitor:
    """Call `check()` from the health tick; it returns what is stuck (empty when healthy).

    A model is stuck when it has requests queued or running and has finished no batch for
    `stall_after_s` while loaded (a model still loading, such as a TensorRT engine build, is
    not stuck). A stream is stuck when its loop or its capture thread has not come round for
    `stall_after_s`."""

    def __init__(self, *, stall_after_s: float, batchers: Callable[[], Iterable[Progressing]],
                 beats: Callable[[], Iterable[Beating]], loaded: Callable[[str, int | None], bool],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_s = stall_after_s
        self._batchers = batchers
        self._beats = beats
        self._loaded = loaded
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        self.problems: list[str] = []
        self.checked_at: float | None = None

    def check(self) -> list[str]:
        now = self._clock()
        problems = []
        labels = set()
        for batcher in self._batchers():
            labels.add(batcher.label)
            pending, batches = batcher.progress()
            seen = self._seen.get(batcher.label)
            if seen is None or pending == 0 or batches != seen.batches \
                    or not self._loaded(batcher.name, batcher.version):
                self._seen[batcher.label] = _Seen(batches, now)
                continue
            stalled = now - seen.since
            if stalled > self.stall_after_s:
                problems.append(f"model {batcher.label}: {pending} request(s) waiting, no batch "
                                f"finished for {stalled:.0f} s")
        for gone in set(self._seen) - labels:
            del self._seen[gone]
        for thread in self._beats():
            what, beat = thread.heartbeat()
            if beat is not None and now - beat > self.stall_after_s:
                problems.append(f"{what}: stuck for {now - beat:.0f} s")
        if problems != self.problems:
            for problem in problems:
                if problem.split(":")[0] not in {p.split(":")[0] for p in self.problems}:
                    logger.error("health: %s", problem, extra={"code": "stalled"})
            if self.problems and not problems:
                logger.warning("health: progress again")
        self.problems = problems
        self.checked_at = now
        return problems


class RecentErrors(logging.Handler):
    """The last warnings and errors, for `edged status` (a bounded ring)."""

    def __init__(self, keep: int = 20) -> None:
        super().__init__(logging.WARNING)
        self._rows: deque[dict[str, object]] = deque(maxlen=keep)
        self._lock_rows = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        row: dict[str, object] = {"ts": round(record.created, 3), "level": record.levelname,
                                  "logger": record.name, "message": record.getMessage()}
        for key in ("model", "stream", "code"):
            value = getattr(record, key, None)
            if value is not None:
                row[key] = value
        with self._lock_rows:
            self._rows.append(row)

    def rows(self) -> list[dict[str, object]]:
        with self._lock_rows:
            return list(self._rows)
