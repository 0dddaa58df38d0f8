"""Prometheus metrics with Triton's names and meanings (`nv_` becomes `edged_`), and edged's
own for model loads, streams, the MQTT link, the process and GPUs, all read from plain
snapshots at scrape time so that the hot path only bumps integers it already keeps.

Counters follow the Prometheus text convention: the family `edged_inference_count` is exposed
as the sample `edged_inference_count_total`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from edged.core.states import ModelState, SourceState
from edged.hardware import host
from edged.hardware.tegra import TegraStats
from edged.inference.latency import cumulative
from edged.streams.stats import StreamStats

if TYPE_CHECKING:
    from edged.inference.modelstatus import InferenceCounters, ModelCounters, ModelStatus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# (family, help, attribute, scale): durations are cumulative microseconds, as in Triton.
_COUNTERS = (
    ("edged_inference_request_success", "requests that succeeded", "success", 1),
    ("edged_inference_request_failure", "requests that failed (any reason)", "failure", 1),
    ("edged_inference_request_rejected", "requests refused because the model's queue was "
     "full (not in failure)", "rejected", 1),
    ("edged_inference_request_timeout", "requests that expired in the queue and never ran "
     "(also in failure)", "timeouts", 1),
    ("edged_inference_count", "inferences run (rows: a batch of 8 counts 8)",
     "inference_count", 1),
    ("edged_inference_exec_count", "batch executions", "exec_count", 1),
    ("edged_inference_request_duration_us", "cumulative request time, queue + compute",
     "request_ns", 1e-3),
    ("edged_inference_queue_duration_us", "cumulative time requests waited in the queue",
     "queue_ns", 1e-3),
    ("edged_inference_compute_infer_duration_us", "cumulative time in the model",
     "compute_ns", 1e-3),
    ("edged_cache_num_hits_per_model", "requests answered from the response cache (also in "
     "request_success)", "cache_hits", 1),
    ("edged_cache_hit_duration_per_model", "cumulative microseconds looking up and reading out "
     "response cache hits", "cache_hit_ns", 1e-3),
    ("edged_cache_num_misses_per_model", "requests not in the response cache whose answers "
     "went in", "cache_misses", 1),
    ("edged_cache_miss_duration_per_model", "cumulative microseconds looking up and inserting "
     "response cache misses", "cache_miss_ns", 1e-3),
)


class InferenceCollector(Collector):
    def __init__(self, counters: Callable[[], Iterable[InferenceCounters]],
                 models: Callable[[], Iterable[ModelStatus]]) -> None:
        self._counters = counters
        self._models = models

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "version"]
        rows = list(self._counters())
        for family, help_text, attribute, scale in _COUNTERS:
            metric = CounterMetricFamily(family, help_text, labels=labels)
            for row in rows:
                metric.add_metric([row.model, str(row.version)], getattr(row, attribute) * scale)
            yield metric
        latency = HistogramMetricFamily("edged_inference_request_latency_seconds",
                                        "requests by their time in queue + compute",
                                        labels=labels)
        for row in rows:
            if row.latency:
                latency.add_metric([row.model, str(row.version)], cumulative(row.latency),
                                   row.request_ns / 1e9)
        yield latency
        pending = GaugeMetricFamily("edged_inference_pending_request_count",
                                    "requests queued now", labels=labels)
        for row in rows:
            pending.add_metric([row.model, str(row.version)], row.pending)
        yield pending
        ready = GaugeMetricFamily("edged_model_ready", "1 when the version is loaded and warm",
                                  labels=labels)
        size = GaugeMetricFamily("edged_model_memory_bytes", "memory the cache charges it",
                                 labels=labels)
        device = GaugeMetricFamily("edged_model_device", "where a loaded version runs (1 on "
                                   "its device: gpu, cpu, or dla0/dla1 on a Jetson)",
                                   labels=[*labels, "backend", "device"])
        for model in self._models():
            ready.add_metric([model.name, str(model.version)],
                             1.0 if model.state is ModelState.READY else 0.0)
            size.add_metric([model.name, str(model.version)], model.nbytes)
            if model.device is not None:
                device.add_metric([model.name, str(model.version), model.backend or "",
                                   model.device], 1.0)
        yield ready
        yield size
        yield device


class ResponseCacheCollector(Collector):
    """The response cache as a whole (ResponseCache.snapshot): what it holds against its
    budget, and what it let go to stay within it."""

    def __init__(self, snapshot: Callable[[], Mapping[str, int]]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        now = self._snapshot()
        yield GaugeMetricFamily("edged_response_cache_bytes", "bytes the cached answers hold "
                                "(arrays, keys, overhead)", value=now["bytes"])
        yield GaugeMetricFamily("edged_response_cache_budget_bytes", "the response cache's "
                                "budget (cache.responses_mb)", value=now["budget_bytes"])
        yield GaugeMetricFamily("edged_response_cache_entries", "answers held",
                                value=now["entries"])
        yield CounterMetricFamily("edged_response_cache_evictions", "answers dropped, least "
                                  "recently used first, to stay within the budget",
                                  value=now["evictions"])


class LoadCollector(Collector):
    def __init__(self, counters: Callable[[], Iterable[ModelCounters]]) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        rows = list(self._counters())
        seconds = GaugeMetricFamily("edged_model_load_duration_seconds",
                                    "how long the version's last load and warm-up took",
                                    labels=["model", "version"])
        loads = CounterMetricFamily("edged_model_loads", "loads of the model, by outcome",
                                    labels=["model", "outcome"])
        evictions = CounterMetricFamily("edged_model_evictions",
                                        "versions unloaded to stay within the cache budget",
                                        labels=["model"])
        for row in rows:
            for version, value in sorted(row.load_seconds.items()):
                seconds.add_metric([row.name, str(version)], value)
            loads.add_metric([row.name, "ok"], row.loads)
            loads.add_metric([row.name, "failed"], row.failed_loads)
            evictions.add_metric([row.name], row.evictions)
        yield from (seconds, loads, evictions)


# (family, help, counter) over a stream's StreamStats (the source's counters flattened in).
_STREAM_COUNTERS = (
    ("edged_stream_frames_in", "frames captured and offered to the stream's queue", "frames_in"),
    ("edged_stream_frames_processed", "frames through the model and post-processing",
     "processed"),
    ("edged_stream_frames_dropped", "frames the full queue dropped or refused", "dropped"),
    ("edged_stream_frames_gated", "frames the change gate kept from the model: their picture "
                                  "had not changed (the last answer held)", "gated"),
    ("edged_stream_frames_failed", "frames that failed on the way through the model", "failed"),
    ("edged_stream_frames_skipped", "frames read but not offered: over the stream's fps limit",
     "skipped"),
    ("edged_stream_frames_rejected", "payloads that were not valid frames (sensor streams)",
     "rejected"),
    ("edged_stream_reconnects", "times the source lost its stream and reconnected",
     "reconnects"),
)


class StreamCollector(Collector):
    def __init__(self, stats: Callable[[], Mapping[str, StreamStats]]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        rows = sorted(self._stats().items())
        for family, help_text, key in _STREAM_COUNTERS:
            metric = CounterMetricFamily(family, help_text, labels=["stream"])
            for name, stats in rows:
                owner = stats if key in ("processed", "failed", "gated") else stats.source
                metric.add_metric([name], getattr(owner, key))
            yield metric
        latency = GaugeMetricFamily("edged_stream_latency_seconds", "capture to result, over "
                                    "the stream's last 1024 frames", labels=["stream",
                                                                            "quantile"])
        for name, stats in rows:
            if stats.latency_ms is not None:
                latency.add_metric([name, "0.5"], stats.latency_ms.p50 / 1000)
                latency.add_metric([name, "0.99"], stats.latency_ms.p99 / 1000)
        yield latency
        up = GaugeMetricFamily("edged_stream_up", "1 while the source is streaming",
                               labels=["stream"])
        depth = GaugeMetricFamily("edged_stream_queue_depth",
                                  "frames waiting between capture and the model",
                                  labels=["stream"])
        for name, stats in rows:
            up.add_metric([name], 1.0 if stats.source.state == SourceState.STREAMING else 0.0)
            depth.add_metric([name], stats.source.queue_depth)
        yield from (up, depth)


class LooksCollector(Collector):
    """What the streams' events add up to, and their live views (StreamSet.looks)."""

    def __init__(self, looks: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        self._looks = looks

    def collect(self) -> Iterator[Metric]:
        rows = sorted(self._looks().items())
        events = CounterMetricFamily("edged_events", "object events published, by type "
                                     "(new, update, end)", labels=["stream", "type"])
        objects = GaugeMetricFamily("edged_objects", "objects tracked now", labels=["stream",
                                                                                   "label"])
        zones = GaugeMetricFamily("edged_zone_objects", "objects inside the zone now",
                                  labels=["stream", "zone", "label"])
        lines = CounterMetricFamily("edged_line_crossings", "objects that crossed the line, "
                                    "by direction (in: left to right of p1->p2)",
                                    labels=["stream", "line", "label", "direction"])
        viewers = GaugeMetricFamily("edged_live_viewers", "live MJPEG views open now",
                                    labels=["stream"])
        pictures = CounterMetricFamily("edged_live_pictures", "annotated pictures drawn "
                                       "(each shared by every viewer of its frame and size)",
                                       labels=["stream"])
        for name, row in rows:
            totals = row.get("events")
            if totals is not None:
                for kind in ("new", "update", "end"):
                    events.add_metric([name, kind], totals["events"].get(kind, 0))
                for label, n in sorted(totals["objects"].items()):
                    objects.add_metric([name, label], n)
                for zone, by_label in sorted(totals["zones"].items()):
                    for label, n in sorted(by_label.items()):
                        zones.add_metric([name, zone, label], n)
                for line, by_label in sorted(totals["lines"].items()):
                    for label, ways in sorted(by_label.items()):
                        for direction in ("in", "out"):
                            lines.add_metric([name, line, label, direction],
                                             ways.get(direction, 0))
            live = row.get("live")
            if live is not None:
                viewers.add_metric([name], live["viewers"])
                pictures.add_metric([name], live["pictures"])
        yield from (events, objects, zones, lines, viewers, pictures)


class Updates(Protocol):
    """What /metrics reads of the updates' progress (edged.ota.progress.OtaProgress)."""

    def counts(self) -> Mapping[tuple[str, str], int]: ...

    def states(self) -> Mapping[str, str]: ...

    def shadows(self) -> Mapping[str, Mapping[str, Any]]: ...


class OtaCollector(Collector):
    def __init__(self, progress: Updates) -> None:
        self._progress = progress

    def collect(self) -> Iterator[Metric]:
        steps = CounterMetricFamily("edged_ota_updates", "update status events since start, "
                                    "by state (received ... active, failed, rolled_back)",
                                    labels=["model", "state"])
        for (model, state), count in sorted(self._progress.counts().items()):
            steps.add_metric([model, state], count)
        now = GaugeMetricFamily("edged_ota_update_state", "1 on the state the model's latest "
                                "update is in", labels=["model", "state"])
        for model, state in sorted(self._progress.states().items()):
            now.add_metric([model, state], 1.0)
        samples = GaugeMetricFamily("edged_ota_shadow_samples", "inputs a shadow rollout has "
                                    "compared so far", labels=["model"])
        for model, row in sorted(self._progress.shadows().items()):
            samples.add_metric([model], row.get("samples", 0))
        yield from (steps, now, samples)


class LinkCollector(Collector):
    def __init__(self, stats: Callable[[], Mapping[str, Any] | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:  # MQTT is off
            return
        published = CounterMetricFamily("edged_mqtt_published",
                                        "messages handed to the MQTT client, by topic class",
                                        labels=["class"])
        for kind, count in sorted(stats["published_by_class"].items()):
            published.add_metric([kind], count)
        dropped = CounterMetricFamily("edged_mqtt_dropped",
                                      "messages lost to a full buffer, by topic class",
                                      labels=["class"])
        for kind, count in sorted(stats["dropped_by_class"].items()):
            dropped.add_metric([kind], count)
        yield from (published, dropped)
        yield GaugeMetricFamily("edged_mqtt_queued",
                                "messages held in the offline buffer for the broker",
                                value=stats["buffered"])
        yield GaugeMetricFamily("edged_mqtt_connected", "1 while connected to the broker",
                                value=1.0 if stats["connected"] else 0.0)


class GpuCollector(Collector):
    def __init__(self, gpus: Callable[[], Iterable[host.GpuStats]]) -> None:
        self._gpus = gpus

    def collect(self) -> Iterator[Metric]:
        gpus = list(self._gpus())
        if not gpus:
            return
        used = GaugeMetricFamily("edged_gpu_memory_used_bytes", "GPU memory in use (all "
                                 "processes)", labels=["gpu"])
        total = GaugeMetricFamily("edged_gpu_memory_total_bytes", "GPU memory",
                                  labels=["gpu"])
        busy = GaugeMetricFamily("edged_gpu_utilization", "fraction of the last sample period "
                                 "a kernel ran on the GPU (0..1)", labels=["gpu"])
        for gpu in gpus:
            used.add_metric([str(gpu.index)], gpu.memory_used_bytes)
            total.add_metric([str(gpu.index)], gpu.memory_total_bytes)
            if gpu.utilization_percent is not None:
                busy.add_metric([str(gpu.index)], gpu.utilization_percent / 100)
        yield from (used, total, busy)


class JetsonCollector(Collector):
    """A Jetson's own figures from sysfs (`edged.hardware.tegra`); nothing at all off a Jetson. GPU
    memory and utilisation come through GpuCollector under NVML's names."""

    def __init__(self, read: Callable[[], TegraStats | None]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        stats = self._read()
        if stats is None:
            return
        temp = GaugeMetricFamily("edged_gpu_temperature_celsius", "thermal zone temperature "
                                 "(sysfs thermal_zone*)", labels=["zone"])
        for zone, value in sorted(stats.temperatures.items()):
            temp.add_metric([zone], value)
        watts = GaugeMetricFamily("edged_gpu_power_watts", "power on an INA3221 rail "
                                  "(volts x amperes)", labels=["rail"])
        volts = GaugeMetricFamily("edged_gpu_rail_voltage_volts", "INA3221 rail voltage",
                                  labels=["rail"])
        amps = GaugeMetricFamily("edged_gpu_rail_current_amperes", "INA3221 rail current",
                                 labels=["rail"])
        for rail in stats.rails:
            watts.add_metric([rail.name], rail.watts)
            volts.add_metric([rail.name], rail.volts)
            amps.add_metric([rail.name], rail.amperes)
        clock = GaugeMetricFamily("edged_gpu_clock_hz", "clock now (gpu, cpu: fastest core, "
                                  "emc where readable)", labels=["clock"])
        cap = GaugeMetricFamily("edged_gpu_clock_max_hz", "the highest clock the power mode "
                                "allows now", labels=["clock"])
        for name, now in sorted(stats.clocks.items()):
            clock.add_metric([name], now.hz)
            if now.max_hz is not None:
                cap.add_metric([name], now.max_hz)
        yield from (temp, watts, volts, amps, clock, cap)
        if stats.power_mode_id is not None:
            mode = GaugeMetricFamily("edged_gpu_power_mode", "the nvpmodel power mode (1 on "
                                     "the mode in force)", labels=["id", "name"])
            mode.add_metric([str(stats.power_mode_id), stats.power_mode or ""], 1.0)
            yield mode
        yield GaugeMetricFamily("edged_gpu_throttled", "1 while clocks are capped: new "
                                "over-current events, or a thermal zone past its passive trip "
                                "point", value=1.0 if stats.throttled else 0.0)
        events = CounterMetricFamily("edged_gpu_throttle_events", "throttling that started "
                                     "since edged did, by cause (oc1..3, thermal)",
                                     labels=["cause"])
        for cause, count in sorted(stats.throttle_events.items()):
            events.add_metric([cause], count)
        yield events


class Metrics:
    """The daemon's registry: inference metrics, the API's own error counter, the process's
    (`process_resident_memory_bytes` and the rest of Prometheus' standard set) and NVML's
    GPUs; model loads, streams and the MQTT link when their snapshots are given."""

    def __init__(self, counters: Callable[[], Iterable[InferenceCounters]],
                 models: Callable[[], Iterable[ModelStatus]], *,
                 loads: Callable[[], Iterable[ModelCounters]] | None = None,
                 streams: Callable[[], Mapping[str, StreamStats]] | None = None,
                 link: Callable[[], Mapping[str, Any] | None] | None = None,
                 looks: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
                 ota: Updates | None = None,
                 responses: Callable[[], Mapping[str, int]] | None = None,
                 gpus: Callable[[], Iterable[host.GpuStats]] = host.gpus,
                 jetson: Callable[[], TegraStats | None] = host.jetson) -> None:
        """`counters`: Scheduler.counters; `models`: ModelCache.status; `loads`:
        ModelCache.counters; `streams`: stream name -> StreamStats; `link`:
        MqttLink.stats, or None while MQTT is off; `looks`: StreamSet.looks (events' totals,
        live views); `ota`: the updates' progress; `responses`: ResponseCache.snapshot;
        `gpus`: host.gpus (NVML, or a Jetson's sysfs); `jetson`: host.jetson (None off a
        Jetson)."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(InferenceCollector(counters, models))
        if loads is not None:
            self.registry.register(LoadCollector(loads))
        if streams is not None:
            self.registry.register(StreamCollector(streams))
        if link is not None:
            self.registry.register(LinkCollector(link))
        if looks is not None:
            self.registry.register(LooksCollector(looks))
        if ota is not None:
            self.registry.register(OtaCollector(ota))
        if responses is not None:
            self.registry.register(ResponseCacheCollector(responses))
        self.registry.register(GpuCollector(gpus))
        self.registry.register(JetsonCollector(jetson))
        ProcessCollector(registry=self.registry)
        self.api_errors = Counter("edged_api_errors", "API requests answered with an error",
                                  ["code"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
