"""Prometheus families of the event describer (edged.describer): descriptions by outcome and
what is queued now."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Describer.statistics' counters, each an outcome of an ended event sent to the describer.
OUTCOMES = ("described", "cached", "dropped", "rate_limited", "failed_schema",
            "endpoint_errors", "timeouts", "failed", "retries")


class DescriberCollector(Collector):
    def __init__(self, statistics: Callable[[], Mapping[str, Any] | None]) -> None:
        """`statistics`: Describer.statistics (None: no describer)."""
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        if stats is None:
            return
        outcomes = CounterMetricFamily(
            "edged_descriptions", "ended events sent to the describer, by outcome: described "
            "(published; cached: of those, from the cache), dropped (the queue was full), "
            "rate_limited, failed_schema (twice an answer that is not a review summary), "
            "endpoint_errors, timeouts, failed, retries (answers asked again)",
            labels=["outcome"])
        for outcome in OUTCOMES:
            outcomes.add_metric([outcome], stats[outcome])
        queued = GaugeMetricFamily("edged_descriptions_queued", "ended events waiting for a "
                                   "description now")
        queued.add_metric([], stats["queued"])
        yield from (outcomes, queued)
