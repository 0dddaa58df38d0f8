"""The stats message from plain snapshots: per model state with load time, loads and
evictions, the process's memory and uptime, GPUs only where there are some, and rates that
survive a stream being replaced under its old name."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from edged.core.states import ModelState
from edged.hardware.host import GpuStats
from edged.hardware.tegra import Tegra
from edged.inference.modelstatus import InferenceCounters, ModelCounters, ModelStatus
from edged.service.reporting import Reporter, throttle_warning
from tests.support.jetson_sysfs import orin_root


class FakePipeline:
    def __init__(self, name: str, **counts: int) -> None:
        self.cfg = SimpleNamespace(name=name)
        self.counts = {"frames_in": 0, "processed": 0, "dropped": 0, "gated": 0, **counts}

    def read_stats(self) -> SimpleNamespace:  # a StreamStats as the reporter reads it
        return SimpleNamespace(as_dict=lambda: dict(self.counts))


def status() -> list[ModelStatus]:
    return [ModelStatus("det", 1, ModelState.UNAVAILABLE,
                        reason="unloaded; loads on first request"),
            ModelStatus("det", 2, ModelState.READY, "onnxruntime", ("CPUExecutionProvider",),
                        4096, load_seconds=1.23456),
            ModelStatus("cls", 1, ModelState.UNAVAILABLE,
                        reason="unloaded; loads on first request")]


def counters() -> list[ModelCounters]:
    return [ModelCounters("det", loads=2, evictions=0, load_seconds={2: 1.23456}),
            ModelCounters("cls", loads=1, failed_loads=1, evictions=1, load_seconds={1: 0.5})]


def test_stats_when_models_ran_reports_each_with_load_time_loads_and_evictions() -> None:
    now = [100.0]
    reporter = Reporter(list, None, status, lambda: now[0], model_counters=counters,
                        rss=lambda: 50 << 20, gpus=list)
    now[0] += 30
    message = reporter.stats()
    assert message["models"] == {
        "det": {"version": 2, "state": "READY", "backend": "onnxruntime", "load_s": 1.235,
                "loads": 2, "failed_loads": 0, "evictions": 0},
        "cls": {"version": 1, "state": "UNAVAILABLE", "backend": None,
                "load_s": 0.5,  # evicted: the time its last load took
                "loads": 1, "failed_loads": 1, "evictions": 1}}
    assert message["process"] == {"rss_bytes": 50 << 20, "uptime_s": 30.0}
    assert "gpus" not in message and "mqtt" not in message


def test_stats_when_nvml_sees_a_gpu_lists_it() -> None:
    gpu = GpuStats(0, "Orin", 2 << 30, 8 << 30, 17)
    message = Reporter(list, lambda: {"connected": True}, status, gpus=lambda: [gpu]).stats()
    assert message["gpus"] == [{"index": 0, "name": "Orin", "memory_used_bytes": 2 << 30,
                                "memory_total_bytes": 8 << 30, "utilization_percent": 17}]
    assert message["mqtt"] == {"connected": True}


def test_stats_when_a_stream_is_replaced_under_its_name_starts_its_rates_afresh() -> None:
    now = [0.0]
    pipelines = [FakePipeline("cam", frames_in=100, processed=90, dropped=10)]
    reporter = Reporter(lambda: pipelines, None, list, lambda: now[0], gpus=list)
    reporter.stats()
    now[0] += 2
    pipelines[:] = [FakePipeline("cam", frames_in=130, processed=120)]  # a config reload
    row = reporter.stats()["streams"]["cam"]
    assert (row["fps_in"], row["fps_processed"], row["fps_dropped"]) == (65.0, 60.0, 0.0)
    now[0] += 1
    pipelines[0].counts.update(frames_in=160, processed=150, dropped=3)
    row = reporter.stats()["streams"]["cam"]
    assert (row["fps_in"], row["fps_processed"], row["fps_dropped"]) == (30.0, 30.0, 3.0)


def test_stats_when_a_gate_held_frames_back_reports_their_rate_apart_from_drops() -> None:
    now = [0.0]
    pipelines = [FakePipeline("door", frames_in=100, processed=20, gated=80)]
    reporter = Reporter(lambda: pipelines, None, list, lambda: now[0], gpus=list)
    reporter.stats()
    now[0] += 2
    pipelines[0].counts.update(frames_in=120, processed=24, gated=96)
    row = reporter.stats()["streams"]["door"]
    assert (row["fps_processed"], row["fps_gated"], row["fps_dropped"]) == (2.0, 8.0, 0.0)
    assert list(row)[-4:] == ["fps_in", "fps_processed", "fps_dropped", "fps_gated"]


def test_stats_when_requests_were_refused_or_timed_out_reports_them_per_model_version() -> None:
    rows = [InferenceCounters("det", 2, 40, 3, 40, 12, 0, 0, 0, pending=5, rejected=7,
                              timeouts=3)]
    reporter = Reporter(list, None, status, model_counters=counters, inference=lambda: rows,
                        rss=lambda: None, gpus=list)
    assert reporter.stats()["inference"] == {
        "det": {"2": {"success": 40, "failure": 3, "rejected": 7, "timeouts": 3,
                      "pending": 5}}}


def test_stats_on_a_jetson_carry_its_telemetry_and_the_throttle_warning_says_why(
        tmp_path: Path) -> None:
    tegra = Tegra(orin_root(tmp_path))
    message = Reporter(list, None, list, gpus=list, jetson=tegra.read).stats()
    jetson = message["jetson"]
    assert (jetson["l4t"], jetson["power_mode"], jetson["power_mode_id"]) == (
        "R36.4.3", "MODE_30W", 2)
    assert jetson["rails"]["VDD_CPU_CV"] == {"volts": 19.112, "amperes": 0.488,
                                             "watts": 9.327}
    assert jetson["clocks_hz"]["gpu"] == {"now": 918000000, "max": 918000000,
                                          "hardware_max": 1300500000}
    assert jetson["throttled"] is False and jetson["gpu_load"] == 0.734
    json.dumps(message)  # what goes on the wire
    assert "jetson" not in Reporter(list, None, list, gpus=list, jetson=lambda: None).stats()
    stats = tegra.read()
    assert stats is not None
    warning = json.loads(throttle_warning("edge-01", "gpu-thermal past its passive trip "
                                          "point", stats))
    assert warning["warning"] == "throttled" and warning["device_id"] == "edge-01"
    assert warning["reason"].startswith("gpu-thermal") and warning["power_mode"] == "MODE_30W"
    assert warning["clocks_hz"]["gpu"] == {"now": 918000000, "max": 918000000}
