"""What the daemon tells the fleet besides results: the periodic `stats` message (per stream
fps in/processed/dropped/gated, latency percentiles, queue depth, reconnects; per model its state,
last load time, loads and evictions; requests by outcome, refused and timed out included; the
MQTT link's own counters; the process's memory and uptime; GPUs when NVML sees any, or a
Jetson's integrated one with its sysfs telemetry under `jetson`) and each model's retained
`models/<m>/state`, republished when it changes."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from edged.core.states import ModelState
from edged.hardware import host
from edged.hardware.tegra import TegraStats
from edged.inference import latency
from edged.inference.modelstatus import InferenceCounters, ModelCounters, ModelStatus
from edged.streams.pipeline import StreamPipeline

RATES = {"fps_in": "frames_in", "fps_processed": "processed", "fps_dropped": "dropped",
         "fps_gated": "gated"}


class Reporter:
    def __init__(self, pipelines: Callable[[], Sequence[StreamPipeline]],
                 link_stats: Callable[[], dict[str, Any]] | None,
                 model_status: Callable[[], list[ModelStatus]],
                 clock: Callable[[], float] = time.monotonic, *,
                 model_counters: Callable[[], list[ModelCounters]] | None = None,
                 inference: Callable[[], list[InferenceCounters]] | None = None,
                 rss: Callable[[], int | None] = host.rss_bytes,
                 gpus: Callable[[], list[host.GpuStats]] = host.gpus,
                 jetson: Callable[[], TegraStats | None] = host.jetson) -> None:
        self.pipelines = pipelines
        self.link_stats = link_stats
        self.model_status = model_status
        self.model_counters = model_counters
        self.inference = inference
        self.rss = rss
        self.gpus = gpus
        self.jetson = jetson
        self.clock = clock
        self._started = clock()
        self._last: dict[str, tuple[StreamPipeline, dict[str, Any]]] = {}
        self._last_at = self._started
        self._states: dict[str, bytes] = {}

    def stats(self) -> dict[str, Any]:
        """One stats message; rates are over the time since the previous one."""
        now = self.clock()
        span = max(now - self._last_at, 1e-6)
        streams: dict[str, Any] = {}
        last: dict[str, tuple[StreamPipeline, dict[str, Any]]] = {}
        for pipeline in self.pipelines():
            row = pipeline.read_stats().as_dict()
            held, before = self._last.get(pipeline.cfg.name, (pipeline, {}))
            if held is not pipeline:  # a new pipeline under the old name (a reload)
                before = {}
            for rate, counter in RATES.items():
                row[rate] = round((row[counter] - before.get(counter, 0)) / span, 3)
            streams[pipeline.cfg.name] = row
            last[pipeline.cfg.name] = (pipeline, row)
        self._last = last  # streams that went away are forgotten
        self._last_at = now
        message: dict[str, Any] = {"ts": round(time.time(), 3), "streams": streams,
                                   "models": self._models(),
                                   "process": {"rss_bytes": self.rss(),
                                               "uptime_s": round(now - self._started, 3)}}
        gpus = self.gpus()
        if gpus:
            message["gpus"] = [dataclasses.asdict(gpu) for gpu in gpus]
        jetson = self.jetson()
        if jetson is not None:
            message["jetson"] = jetson.as_dict()
        if self.inference is not None:
            message["inference"] = _requests(self.inference())
        if self.link_stats is not None:
            message["mqtt"] = self.link_stats()
        return message

    def _models(self) -> dict[str, Any]:
        counters = {c.name: c for c in self.model_counters()} if self.model_counters else {}
        models = {}
        for name, row in _latest(self.model_status()).items():
            counts = counters.get(name, ModelCounters(name))
            load_s = row.load_seconds if row.load_seconds is not None else \
                counts.load_seconds.get(row.version)  # evicted: the last load's time
            models[name] = {"version": row.version, "state": row.state, "backend": row.backend,
                            "load_s": None if load_s is None else round(load_s, 3),
                            "loads": counts.loads, "failed_loads": counts.failed_loads,
                            "evictions": counts.evictions}
        return models

    def changed_states(self) -> list[tuple[str, bytes]]:
        """(model, retained state JSON) for each model whose state changed since last asked."""
        changed = []
        for name, row in _latest(self.model_status()).items():
            payload = _state(name, row.version, row.state, row.backend, list(row.providers),
                             row.reason)
            if self._states.get(name) != payload:
                self._states[name] = payload
                changed.append((name, payload))
        return changed

    def offline_states(self, reason: str = "edged stopped") -> list[tuple[str, bytes]]:
        """(model, retained state JSON) saying UNAVAILABLE, for every model whose state was
        published: what the broker keeps once the daemon has stopped cleanly."""
        offline = []
        for name, payload in self._states.items():
            version = json.loads(payload)["version"]
            offline.append((name, _state(name, version, ModelState.UNAVAILABLE, None, [],
                                         reason)))
        return offline


def inference_view(rows: Iterable[InferenceCounters]) -> dict[str, dict[str, Any]]:
    """Per "model:version": requests by outcome and latency percentiles (queue + compute, ms,
    read from the latency histogram), for the status report and page."""
    view: dict[str, dict[str, Any]] = {}
    for row in rows:
        p50, p99 = (latency.percentile(row.latency, q) for q in (50, 99))
        view[f"{row.model}:{row.version}"] = {
            "success": row.success, "failure": row.failure, "rejected": row.rejected,
            "timeouts": row.timeouts, "pending": row.pending,
            "p50_ms": None if p50 is None else round(p50 * 1000, 3),
            "p99_ms": None if p99 is None else round(p99 * 1000, 3)}
    return view


def throttle_warning(device_id: str, reason: str, stats: TegraStats) -> bytes:
    """The `warnings` message health.warn_on_throttle publishes when a Jetson's clocks become
    capped: why, and the power mode, hot zones and clocks at that moment."""
    return json.dumps({"ts": round(time.time(), 3), "device_id": device_id,
                       "warning": "throttled", "reason": reason,
                       "power_mode": stats.power_mode, "power_mode_id": stats.power_mode_id,
                       "hot_zones": list(stats.hot_zones),
                       "clocks_hz": {k: {"now": c.hz, "max": c.max_hz}
                                     for k, c in stats.clocks.items()},
                       "throttle_events": dict(stats.throttle_events)},
                      separators=(",", ":")).encode()


def _state(model: str, version: int, state: ModelState, backend: str | None,
           providers: list[str], reason: str | None) -> bytes:
    return json.dumps({"model": model, "version": version, "state": state, "backend": backend,
                       "providers": providers, "reason": reason},
                      separators=(",", ":")).encode()


def _requests(rows: Iterable[InferenceCounters]) -> dict[str, dict[str, dict[str, int]]]:
    """Requests by outcome since start, per model and version: what a fleet dashboard alarms
    on (full queues and timeouts drop stream frames without any other sign)."""
    by_model: dict[str, dict[str, dict[str, int]]] = {}
    for row in rows:
        by_model.setdefault(row.model, {})[str(row.version)] = {
            "success": row.success, "failure": row.failure, "rejected": row.rejected,
            "timeouts": row.timeouts, "pending": row.pending}
    return by_model


def _latest(rows: Iterable[ModelStatus]) -> dict[str, ModelStatus]:
    """One row per model: the ready version if any, else the newest."""
    latest: dict[str, ModelStatus] = {}
    for row in rows:
        held = latest.get(row.name)
        if held is None or (row.state is ModelState.READY, row.version) >= (
                held.state is ModelState.READY, held.version):
            latest[row.name] = row
    return latest
