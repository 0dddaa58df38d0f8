"""The health tick's progress checks, with plain fakes and a fake clock."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pytest

from edged.hardware.tegra import Tegra
from edged.ops.status import render
from edged.service.health import HealthMonitor, RecentErrors
from tests.support.jetson_sysfs import orin_root, set_value


@dataclass
class FakeBatcher:
    label: str = "m"
    name: str = "m"
    version: int | None = None
    pending: int = 0
    batches: int = 0

    def progress(self) -> tuple[int, int]:
        return self.pending, self.batches


@dataclass
class FakeBeat:
    what: str = "stream cam: processing loop"
    beat: float | None = None

    def heartbeat(self) -> tuple[str, float | None]:
        return self.what, self.beat


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def monitor(batchers: list[FakeBatcher], beats: list[FakeBeat] | None = None,
            loaded: bool = True) -> tuple[HealthMonitor, Clock]:
    clock = Clock()
    return HealthMonitor(stall_after_s=10, batchers=lambda: batchers,
                         beats=lambda: beats or [], loaded=lambda name, version: loaded,
                         clock=clock), clock


def test_health_when_a_model_with_work_finishes_no_batch_reports_it_stuck(
        caplog: pytest.LogCaptureFixture) -> None:
    batcher = FakeBatcher(pending=3, batches=5)
    health, clock = monitor([batcher])
    assert health.check() == []
    clock.now += 9
    assert health.check() == []
    clock.now += 2
    with caplog.at_level(logging.ERROR, "edged.service.health"):
        problems = health.check()
        assert health.check() == problems  # still stuck: reported once in the log
    assert problems == ["model m: 3 request(s) waiting, no batch finished for 11 s"]
    assert [r.code for r in caplog.records] == ["stalled"]  # type: ignore[attr-defined]
    batcher.batches += 1  # it moved again
    assert health.check() == []


def test_health_when_a_model_is_busy_but_finishing_batches_is_fine() -> None:
    batcher = FakeBatcher(pending=8)
    health, clock = monitor([batcher])
    for _ in range(20):
        batcher.batches += 1
        clock.now += 5
        assert health.check() == []


def test_health_when_a_model_is_idle_for_long_is_fine() -> None:
    batcher = FakeBatcher()
    health, clock = monitor([batcher])
    health.check()
    clock.now += 1000
    assert health.check() == []
    batcher.pending = 1  # work arrives after a long quiet spell: the clock starts now
    assert health.check() == []
    clock.now += 5
    assert health.check() == []


def test_health_when_a_model_is_still_loading_is_not_stuck() -> None:
    health, clock = monitor([FakeBatcher(pending=2)], loaded=False)  # an engine build
    health.check()
    clock.now += 600
    assert health.check() == []


def test_health_when_a_stream_loop_stops_coming_round_reports_it() -> None:
    beat = FakeBeat(beat=100.0)
    capture = FakeBeat("stream cam: capture in open()/read()", None)  # not in a call
    health, clock = monitor([], [beat, capture])
    clock.now = 105
    assert health.check() == []
    clock.now = 111
    assert health.check() == ["stream cam: processing loop: stuck for 11 s"]
    beat.beat = 111
    capture.beat = 100  # a read() that has not returned since t=100
    assert health.check() == ["stream cam: capture in open()/read(): stuck for 11 s"]


def test_recent_errors_when_many_warnings_keeps_the_last_with_their_fields() -> None:
    recent = RecentErrors(keep=3)
    log = logging.getLogger("edged.test.recent")
    log.addHandler(recent)
    try:
        log.info("not kept")
        for i in range(5):
            log.warning("frame %d failed", i, extra={"stream": "cam", "code": "x"})
    finally:
        log.removeHandler(recent)
    rows = recent.rows()
    assert [r["message"] for r in rows] == ["frame 2 failed", "frame 3 failed",
                                            "frame 4 failed"]
    assert (rows[0]["stream"], rows[0]["code"], rows[0]["level"]) == ("cam", "x", "WARNING")


def test_status_render_when_stuck_shows_health_first_and_every_part() -> None:
    report = {
        "device_id": "edge-01", "version": "0.1.0", "pid": 42, "uptime_s": 7300,
        "ready": False, "live": False, "problems": ["model m: 1 request(s) waiting, ..."],
        "systemd": {"notify": True, "watchdog_s": 30.0},
        "models": [{"name": "m", "version": 2, "state": "READY", "backend": "onnxruntime",
                    "providers": ["CPUExecutionProvider"], "load_seconds": 0.25,
                    "reason": None, "device": "cpu"},
                   {"name": "d", "version": 1, "state": "READY", "backend": "tensorrt",
                    "providers": ["TensorRT 10.3.0 fp16 DLA0+GPU"], "load_seconds": 42.0,
                    "reason": None, "device": "dla0"},
                   {"name": "n", "version": 1, "state": "UNAVAILABLE", "backend": None,
                    "providers": [], "load_seconds": None, "reason": "bad file"}],
        "queues": {"m": {"queued": 1, "pending": 2, "batches": 9}},
        "streams": {"cam": {"state": "reconnecting", "model": "m", "frames_in": 10,
                            "processed": 9, "gated": 6, "dropped": 1, "reconnects": 3,
                            "last_error": "no frames for 10 s", "decoder": "nvv4l2decoder"}},
        "mqtt": {"connected": False, "published": 5, "buffered": 2, "dropped": 0},
        "process": {"rss_bytes": 200 * 2**20},
        "gpus": [{"index": 0, "name": "Orin", "memory_used_bytes": 2**30,
                  "memory_total_bytes": 8 * 2**30, "utilization_percent": 40}],
        "recent": [{"level": "ERROR", "message": "health: stuck", "code": "stalled"}],
        "jetson": None,
    }
    text = render(report)
    lines = text.splitlines()
    assert lines[0] == ("edged 0.1.0 on edge-01: NOT LIVE, NOT READY, up 2h01m, pid 42 "
                        "under systemd (watchdog 30 s)")
    assert lines[1].startswith("  STUCK model m")
    assert "m:2    READY        onnxruntime  cpu   250ms  CPUExecutionProvider" in text
    assert "d:1    READY        tensorrt     dla0  42.0s  TensorRT 10.3.0 fp16 DLA0+GPU" in text
    assert "n:1    UNAVAILABLE  -            -     -      bad file" in text
    assert "m      1        1         9" in text
    assert "STREAM  STATE         MODEL  DECODER        IN  DONE  GATED  DROPPED" in text
    assert ("cam     reconnecting  m      nvv4l2decoder  10  9     6      1        3       "
            "no frames for 10 s") in text
    assert "mqtt: NOT connected, published 5, buffered while offline 2, dropped 0" in text
    assert "process: rss 200 MiB" in text
    assert "gpu 0: Orin memory 1024/8192 MiB, utilisation 40%" in text
    assert "  error   health: stuck [code=stalled]" in text


def test_status_render_on_a_jetson_shows_power_mode_throttling_clocks_and_rails(
        tmp_path: Path) -> None:
    clock = [0.0]
    tegra = Tegra(orin_root(tmp_path), clock=lambda: clock[0])
    tegra.read()
    set_value(tmp_path, "sys/class/thermal/thermal_zone1/temp", 99500)
    clock[0] = 5.0
    stats = tegra.read()
    assert stats is not None
    text = render({"jetson": stats.as_dict(), "streams": {}})
    assert ("jetson: L4T R36.4.3, power mode MODE_30W, THROTTLED (gpu-thermal hot); "
            "throttle events since start: thermal 1") in text
    assert "  gpu clock 918 MHz, capped at 918 of 1300 MHz" in text
    assert "  hottest gpu-thermal 99.5 C, cpu-thermal 61.5 C, tj-thermal 61.5 C" in text
    assert "VDD_GPU_SOC 28.1 W" in text
    calm = render({"jetson": {**stats.as_dict(), "throttled": False, "hot_zones": [],
                              "throttle_events": {}}, "streams": {}})
    assert "power mode MODE_30W, not throttled" in calm


def test_status_render_when_faces_run_shows_the_gallery_and_what_waits() -> None:
    text = render({"streams": {}, "faces": {
        "names": 3, "entries": 12, "max_entries": 10000, "unknowns": 4, "max_unknowns": 2000,
        "embedder": {"embedder": "arcface:2", "stale": 5, "without_crop": 0}}})
    assert ("faces: 3 names, 12 of 10000 faces enrolled, 4 unknown sightings; embedder "
            "arcface:2, 5 rows to re-embed") in text
    assert "faces" not in render({"streams": {}})
