"""Where each model's updates stand, for people and dashboards: the latest step of each model's
update (`latest`, the status page's "Updates"), and the steps taken since start by state
(`counts`, `edged_ota_updates_total`). Fed every status event the updater reports, whatever
brought the update (MQTT, a Mender artifact); read from any thread."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from edged.ota.install import Event


class OtaProgress:
    def __init__(self, shadows: Callable[[], dict[str, dict[str, Any]]] = dict) -> None:
        """`shadows`: the shadow rollouts running now, model → their progress."""
        self.shadows = shadows
        self._lock = threading.Lock()
        self._latest: dict[str, dict[str, Any]] = {}
        self._counts: Counter[tuple[str, str]] = Counter()

    def record(self, event: Event) -> None:
        if event.transient:  # a refused command: not about the model's state
            return
        with self._lock:
            self._latest[event.model] = event.to_dict()
            self._counts[(event.model, str(event.state))] += 1

    def latest(self) -> dict[str, dict[str, Any]]:
        """model → its latest status event (model, version, state, detail, progress, ts)."""
        with self._lock:
            return {model: dict(row) for model, row in self._latest.items()}

    def counts(self) -> dict[tuple[str, str], int]:
        """(model, state) → status events of that state since start."""
        with self._lock:
            return dict(self._counts)

    def states(self) -> dict[str, str]:
        """model → the state its latest update is in."""
        with self._lock:
            return {model: str(row["state"]) for model, row in self._latest.items()}

