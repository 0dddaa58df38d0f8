"""The describer's bounds: a token bucket per stream (how often its events are described) and
the answers' cache (least recently used out first)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any


class TokenBucket:
    """`rate_per_s` tokens a second up to `burst`; `take()` spends one when there is one."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(float(self.burst),
                           self._tokens + max(0.0, now - self._at) * self.rate_per_s)
        self._at = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False

    def retune(self, rate_per_s: float, burst: int) -> None:
        """New settings (a reload), keeping what was spent."""
        self.rate_per_s, self.burst = rate_per_s, burst
        self._tokens = min(self._tokens, float(burst))


class AnswerCache:
    """Summaries by what was asked (prompt.cache_key), `size` at most; thread-safe."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._items.get(key)
            if found is not None:
                self._items.move_to_end(key)
            return found

    def put(self, key: str, summary: dict[str, Any]) -> None:
        if self.size == 0:
            return
        with self._lock:
            self._items[key] = summary
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
