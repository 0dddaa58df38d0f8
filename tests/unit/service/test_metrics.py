"""/metrics as a Prometheus server parses it, from plain snapshots: model loads, streams, the
MQTT link, GPUs and the process beside the inference counters; families whose source is
absent (MQTT off, no GPU) are left out rather than shown as zeros."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from edged.core.states import ModelState, SourceState
from edged.hardware.host import GpuStats
from edged.inference.modelstatus import InferenceCounters, ModelCounters, ModelStatus
from edged.service.metrics import Metrics
from edged.sources import SourceStats
from edged.streams.stats import StreamStats

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def samples(metrics: Metrics) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(metrics.render().decode())
            for s in family.samples}


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, frozenset(labels.items()))]


def names(found: Samples) -> set[str]:
    return {name for name, _ in found}


def inference() -> list[InferenceCounters]:
    return [InferenceCounters("det", 2, 5, 1, 12, 3, 9_000_000, 1_000_000, 7_000_000, 0)]


def models() -> list[ModelStatus]:
    return [ModelStatus("det", 2, ModelState.READY, nbytes=4096)]


def stream(state: str, **counts: int) -> StreamStats:
    row: dict[str, Any] = {"frames_in": 0, "processed": 0, "dropped": 0, "failed": 0,
                           "skipped": 0, "rejected": 0, "reconnects": 0, "queue_depth": 0}
    row = {**row, **counts}
    source = SourceStats(SourceState(state), row["frames_in"], row["dropped"], row["skipped"],
                         row["rejected"], row["reconnects"], 0, None, row["queue_depth"])
    return StreamStats(row["processed"], row["failed"], 0, None, source,
                       gated=row.get("gated", 0))


def link_stats() -> dict[str, Any]:
    return {"connected": True, "published": 12, "published_by_class": {"results": 10,
                                                                      "stats": 2},
            "buffered": 3, "dropped": 4, "dropped_by_class": {"results": 4}, "connects": 1,
            "disconnects": 0, "received": 0, "handler_errors": 0}


def test_metrics_when_every_source_is_given_exposes_each_family_with_its_labels() -> None:
    metrics = Metrics(
        inference, models,
        loads=lambda: [ModelCounters("det", loads=3, failed_loads=1, evictions=2,
                                     load_seconds={1: 0.25, 2: 1.5})],
        streams=lambda: {"door": stream("streaming", frames_in=300, processed=40, gated=250,
                                        dropped=7, failed=3, reconnects=1, queue_depth=2),
                         "yard": stream("reconnecting", reconnects=4)},
        link=link_stats,
        gpus=lambda: [GpuStats(0, "H100", 3 << 30, 80 << 30, 42),
                      GpuStats(1, "A100 MIG", 1 << 20, 5 << 30, None)])
    found = samples(metrics)
    assert value(found, "edged_inference_count_total", model="det", version="2") == 12
    assert value(found, "edged_model_load_duration_seconds", model="det", version="2") == 1.5
    assert value(found, "edged_model_load_duration_seconds", model="det", version="1") == 0.25
    assert value(found, "edged_model_loads_total", model="det", outcome="ok") == 3
    assert value(found, "edged_model_loads_total", model="det", outcome="failed") == 1
    assert value(found, "edged_model_evictions_total", model="det") == 2
    for name, expected in [("frames_in", 300), ("frames_processed", 40), ("frames_gated", 250),
                           ("frames_dropped", 7), ("frames_failed", 3), ("reconnects", 1)]:
        assert value(found, f"edged_stream_{name}_total", stream="door") == expected
    assert value(found, "edged_stream_reconnects_total", stream="yard") == 4
    assert value(found, "edged_stream_up", stream="door") == 1
    assert value(found, "edged_stream_up", stream="yard") == 0
    assert value(found, "edged_stream_queue_depth", stream="door") == 2
    assert value(found, "edged_mqtt_published_total", **{"class": "results"}) == 10
    assert value(found, "edged_mqtt_published_total", **{"class": "stats"}) == 2
    assert value(found, "edged_mqtt_dropped_total", **{"class": "results"}) == 4
    assert value(found, "edged_mqtt_queued") == 3
    assert value(found, "edged_mqtt_connected") == 1
    assert value(found, "edged_gpu_memory_used_bytes", gpu="0") == 3 << 30
    assert value(found, "edged_gpu_memory_total_bytes", gpu="1") == 5 << 30
    assert value(found, "edged_gpu_utilization", gpu="0") == 0.42
    assert ("edged_gpu_utilization", frozenset({("gpu", "1")})) not in found  # not reported
    assert value(found, "process_resident_memory_bytes") > 0


def test_metrics_when_only_inference_sources_are_given_still_renders_them() -> None:
    found = samples(Metrics(inference, models, gpus=list))
    assert value(found, "edged_model_ready", model="det", version="2") == 1
    assert not {n for n in names(found)
                if n.startswith(("edged_stream_", "edged_mqtt_", "edged_gpu_",
                                 "edged_model_load"))}
    assert "process_resident_memory_bytes" in names(found)


def test_metrics_when_mqtt_is_off_and_no_gpu_leaves_their_families_out() -> None:
    found = samples(Metrics(inference, models, link=lambda: None, gpus=list,
                            streams=lambda: {}))
    assert not {n for n in names(found) if n.startswith(("edged_mqtt_", "edged_gpu_"))}


def test_metrics_when_requests_were_refused_or_timed_out_exports_both_counts() -> None:
    rows = [InferenceCounters("det", 2, 5, 1, 12, 3, 0, 0, 0, 0, rejected=4, timeouts=1)]
    found = samples(Metrics(lambda: rows, models, gpus=list))
    assert value(found, "edged_inference_request_rejected_total", model="det", version="2") == 4
    assert value(found, "edged_inference_request_timeout_total", model="det", version="2") == 1


def test_faces_collector_when_the_pipeline_runs_exports_its_counts_and_none_when_off() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from edged.service.face_metrics import FacesCollector

    status = {"entries": 7, "max_entries": 100, "unknowns": 2, "names": 3,
              "identified": {"known": 5, "unknown": 9}, "embedder": {"stale": 4}}
    registry = CollectorRegistry()
    registry.register(FacesCollector(lambda: status))
    text = generate_latest(registry).decode()
    for line in ('edged_faces_identified_total{outcome="known"} 5.0',
                 'edged_faces_identified_total{outcome="unknown"} 9.0',
                 "edged_gallery_faces 7.0", "edged_gallery_max_faces 100.0",
                 "edged_gallery_unknown_sightings 2.0", "edged_gallery_names 3.0",
                 "edged_gallery_stale_rows 4.0"):
        assert line in text
    off = CollectorRegistry()
    off.register(FacesCollector(lambda: None))
    assert "edged_gallery" not in generate_latest(off).decode()
