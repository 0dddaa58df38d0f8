"""Prometheus families of the language models' generation (edged.inference.generation):
requests by outcome, tokens generated, and what is queued and running now, per model."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

OUTCOMES = ("completed", "failed", "cancelled", "timed_out", "refused")


class GenerationCollector(Collector):
    def __init__(self, statistics: Callable[[], Mapping[str, Mapping[str, Any]]]) -> None:
        """`statistics`: Generations.statistics (model -> its counts)."""
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        stats = self._statistics()
        requests = CounterMetricFamily(
            "edged_generation_requests", "generation requests ended, by outcome: completed, "
            "failed, cancelled (the client went), timed_out (waited past its deadline), "
            "refused (queue full)", labels=["model", "outcome"])
        tokens = CounterMetricFamily("edged_generation_tokens", "tokens generated",
                                     labels=["model"])
        queued = GaugeMetricFamily("edged_generation_queued", "requests waiting now",
                                   labels=["model"])
        running = GaugeMetricFamily("edged_generation_running", "requests generating now "
                                    "(up to the model's llm.sequences)", labels=["model"])
        yields = CounterMetricFamily(
            "edged_generation_yields", "decode steps that waited first for vision inference "
            "queued or running (llm.yield_to_streams)", labels=["model"])
        yielded = CounterMetricFamily("edged_generation_yield_seconds", "seconds those steps "
                                      "waited, all together", labels=["model"])
        preempted = CounterMetricFamily("edged_generation_preempted", "answers paused for a "
                                        "request of a higher priority (they resume)",
                                        labels=["model"])
        for model, row in sorted(stats.items()):
            yields.add_metric([model], row["yields"])
            yielded.add_metric([model], row["yield_s"])
            preempted.add_metric([model], row["preempted"])
            for outcome in OUTCOMES:
                requests.add_metric([model, outcome], row[outcome])
            tokens.add_metric([model], row["tokens"])
            queued.add_metric([model], row["queued"])
            running.add_metric([model], row["generating"])
        yield from (requests, tokens, queued, running, yields, yielded, preempted)
