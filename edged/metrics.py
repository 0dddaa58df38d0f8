"""Prometheus metrics with Triton's names and meanings (`nv_` becomes `edged_`), read from
plain snapshots at scrape time so that the hot path only bumps integers it already keeps.

Counters follow the Prometheus text convention: the family `edged_inference_count` is exposed
as the sample `edged_inference_count_total`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class InferenceCounters:
    """One model version's counters (Triton's meanings: a request may hold several rows, a
    batch execution runs several requests)."""

    model: str
    version: int
    success: int
    failure: int
    inference_count: int
    exec_count: int
    request_ns: int
    queue_ns: int
    compute_ns: int
    pending: int  # requests queued now


@dataclass(frozen=True)
class ModelState:
    model: str
    version: int
    ready: bool
    nbytes: int


# (family, help, attribute, scale): durations are cumulative microseconds, as in Triton.
_COUNTERS = (
    ("edged_inference_request_success", "requests that succeeded", "success", 1),
    ("edged_inference_request_failure", "requests that failed (any reason)", "failure", 1),
    ("edged_inference_count", "inferences run (rows: a batch of 8 counts 8)",
     "inference_count", 1),
    ("edged_inference_exec_count", "batch executions", "exec_count", 1),
    ("edged_inference_request_duration_us", "cumulative request time, queue + compute",
     "request_ns", 1e-3),
    ("edged_inference_queue_duration_us", "cumulative time requests waited in the queue",
     "queue_ns", 1e-3),
    ("edged_inference_compute_infer_duration_us", "cumulative time in the model",
     "compute_ns", 1e-3),
)


class InferenceCollector(Collector):
    def __init__(self, counters: Callable[[], Iterable[InferenceCounters]],
                 models: Callable[[], Iterable[ModelState]]) -> None:
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
        pending = GaugeMetricFamily("edged_inference_pending_request_count",
                                    "requests queued now", labels=labels)
        for row in rows:
            pending.add_metric([row.model, str(row.version)], row.pending)
        yield pending
        ready = GaugeMetricFamily("edged_model_ready", "1 when the version is loaded and warm",
                                  labels=labels)
        size = GaugeMetricFamily("edged_model_memory_bytes", "memory the cache charges it",
                                 labels=labels)
        for state in self._models():
            ready.add_metric([state.model, str(state.version)], 1.0 if state.ready else 0.0)
            size.add_metric([state.model, str(state.version)], state.nbytes)
        yield ready
        yield size


class Metrics:
    """The daemon's registry: inference metrics plus the API's own error counter."""

    def __init__(self, counters: Callable[[], Iterable[InferenceCounters]],
                 models: Callable[[], Iterable[ModelState]]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(InferenceCollector(counters, models))
        self.api_errors = Counter("edged_api_errors", "API requests answered with an error",
                                  ["code"], registry=self.registry)

    def render(self) -> bytes:
        return generate_latest(self.registry)
