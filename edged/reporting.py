"""What the daemon tells the fleet besides results: the periodic `stats` message (per stream
fps in/processed/dropped, latency percentiles, queue depth, reconnects; the MQTT link's own
counters) and each model's retained `models/<m>/state`, republished when it changes."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from edged.cache import ModelStatus
from edged.pipeline import StreamPipeline

RATES = {"fps_in": "frames_in", "fps_processed": "processed", "fps_dropped": "dropped"}


class Reporter:
    def __init__(self, pipelines: Sequence[StreamPipeline],
                 link_stats: Callable[[], dict[str, Any]] | None,
                 model_status: Callable[[], list[ModelStatus]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pipelines = pipelines
        self.link_stats = link_stats
        self.model_status = model_status
        self.clock = clock
        self._last: dict[str, dict[str, Any]] = {}
        self._last_at = clock()
        self._states: dict[str, bytes] = {}

    def stats(self) -> dict[str, Any]:
        """One stats message; rates are over the time since the previous one."""
        now = self.clock()
        span = max(now - self._last_at, 1e-6)
        streams: dict[str, Any] = {}
        for pipeline in self.pipelines:
            row = pipeline.snapshot()
            before = self._last.get(pipeline.cfg.name, {})
            for rate, counter in RATES.items():
                row[rate] = round((row[counter] - before.get(counter, 0)) / span, 3)
            streams[pipeline.cfg.name] = row
            self._last[pipeline.cfg.name] = row
        self._last_at = now
        message: dict[str, Any] = {"ts": round(time.time(), 3), "streams": streams}
        if self.link_stats is not None:
            message["mqtt"] = self.link_stats()
        return message

    def changed_states(self) -> list[tuple[str, bytes]]:
        """(model, retained state JSON) for each model whose state changed since last asked."""
        latest: dict[str, ModelStatus] = {}
        for row in self.model_status():  # the ready version if any, else the newest
            held = latest.get(row.name)
            if held is None or (row.state == "READY", row.version) >= (held.state == "READY",
                                                                        held.version):
                latest[row.name] = row
        changed = []
        for name, row in latest.items():
            payload = json.dumps({"model": name, "version": row.version, "state": row.state,
                                  "backend": row.backend, "providers": list(row.providers),
                                  "reason": row.reason}, separators=(",", ":")).encode()
            if self._states.get(name) != payload:
                self._states[name] = payload
                changed.append((name, payload))
        return changed
