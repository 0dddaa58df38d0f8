"""What the downloads of updates in progress may take together: updates of different models
download side by side (one slow artifact server must not hold another model's update), so
the staging disk and the link are shared budgets, not each download's own.

- Disk: an update reserves its artifact's bytes (`ota.staging_mb` in all) from the start of
  its download until its files are installed or dropped; one that does not fit beside the
  others waits, within its download deadline, and one larger than the budget, or than the
  free space on the staging filesystem, is refused (`no_space`) before a byte is fetched.
- Bandwidth: with `ota.download_rate_kbps`, every block any download reads takes its share of
  one rate (a shared token bucket), so two downloads get half each."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from edged.ota.manifest import Rejected

BURST_S = 1.0  # a rate's tokens saved up while idle, at most this many seconds' worth


class TransferBudget:
    def __init__(self, staging: Callable[[], Path], disk_bytes: int, rate_bytes_s: float | None,
                 stop: threading.Event, clock: Callable[[], float] = time.monotonic) -> None:
        self.staging = staging  # the staging folder (made on demand by the repository)
        self.disk_bytes = disk_bytes
        self.rate = rate_bytes_s
        self.stop = stop
        self.clock = clock
        self.reserved = 0
        self._cond = threading.Condition()
        self._free_at = float("-inf")  # when the link is next free at `rate` (a bucket, as time)

    def reserve(self, nbytes: int, deadline: float, waiting: Callable[[int], None]) -> Reservation:
        """Hold `nbytes` of staging disk, waiting (until `deadline`, clock time) while the
        downloads in progress hold too much for it; `waiting` is told once, with what they
        hold, when it must wait."""
        if nbytes > self.disk_bytes:
            raise Rejected("no_space", f"the artifact's {_mb(nbytes)} exceed ota.staging_mb "
                                       f"({_mb(self.disk_bytes)})")
        free = shutil.disk_usage(self.staging()).free
        told = False
        with self._cond:
            if nbytes + self.reserved > free:
                raise Rejected("no_space", f"the artifact's {_mb(nbytes)} do not fit the "
                                           f"{_mb(free)} free for staging (updates in progress "
                                           f"hold {_mb(self.reserved)})")
            while self.reserved + nbytes > self.disk_bytes:
                left = deadline - self.clock()
                if left <= 0 or self.stop.is_set():
                    raise Rejected("download_timeout", f"no room in ota.staging_mb for "
                                                       f"{_mb(nbytes)} in time (downloads in "
                                                       f"progress hold {_mb(self.reserved)})")
                if not told:
                    told = True
                    waiting(self.reserved)
                self._cond.wait(min(left, 1.0))
            self.reserved += nbytes
        return Reservation(self, nbytes)

    def _give(self, nbytes: int) -> None:
        with self._cond:
            self.reserved -= nbytes
            self._cond.notify_all()

    def take(self, nbytes: int) -> None:
        """`nbytes` were just read by some download: with a rate set, wait for their share of
        it (every download's blocks queue on the one rate)."""
        if self.rate is None:
            return
        with self._cond:
            now = self.clock()
            start = max(self._free_at, now - BURST_S)
            self._free_at = start + nbytes / self.rate
            wait = self._free_at - now
        if wait > 0:
            self.stop.wait(wait)


class Reservation:
    """An update's staging bytes, held until `release()` (idempotent)."""

    def __init__(self, budget: TransferBudget, nbytes: int) -> None:
        self._budget = budget
        self.nbytes = nbytes

    def release(self) -> None:
        nbytes, self.nbytes = self.nbytes, 0
        if nbytes:
            self._budget._give(nbytes)


def _mb(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"
