"""Prometheus families of the face pipeline (edged.streams.faces): faces told by outcome
(known, unknown), and the gallery's size, bounds and rows waiting to be re-embedded. Nothing
while the pipeline is off."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class FacesCollector(Collector):
    def __init__(self, status: Callable[[], Mapping[str, Any] | None]) -> None:
        """`status`: FaceService.status (None: no face pipeline runs)."""
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status()
        if status is None:
            return
        told = CounterMetricFamily("edged_faces_identified", "faces embedded and matched, by "
                                   "outcome: known (a name) or unknown", labels=["outcome"])
        for outcome in ("known", "unknown"):
            told.add_metric([outcome], status["identified"][outcome])
        yield told
        for name, key, what in (
                ("edged_gallery_faces", "entries", "faces enrolled (names' entries and "
                                                   "negatives)"),
                ("edged_gallery_max_faces", "max_entries", "faces.max_entries"),
                ("edged_gallery_unknown_sightings", "unknowns", "unknown sightings kept"),
                ("edged_gallery_names", "names", "names enrolled")):
            yield GaugeMetricFamily(name, what, value=status[key])
        yield GaugeMetricFamily("edged_gallery_stale_rows", "rows another embedder made, "
                                "waiting to be re-embedded", value=status["embedder"]["stale"])
