"""Jetson telemetry from sysfs (edged.hardware.tegra) against a fake JetPack 6 / AGX Orin tree, and
/metrics with and without one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from edged.hardware import host
from edged.hardware.tegra import Tegra
from edged.service.metrics import Metrics
from tests.support.jetson_sysfs import orin_root, set_value


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def orin(tmp_path: Path) -> Path:
    return orin_root(tmp_path / "root")


def test_tegra_on_an_orin_reads_what_tegrastats_shows(orin: Path) -> None:
    stats = Tegra(orin).read()
    assert stats is not None
    assert stats.l4t == "R36.4.3"
    assert stats.gpu_load == pytest.approx(0.734)
    assert stats.memory_total_bytes == 31997100 * 1024
    assert stats.memory_used_bytes == (31997100 - 20997100) * 1024
    assert (stats.power_mode_id, stats.power_mode) == (2, "MODE_30W")
    assert stats.temperatures["tj-thermal"] == pytest.approx(61.5)
    assert "PMIC-Die" not in stats.temperatures  # offline (-256 C)
    rails = {r.name: r for r in stats.rails}
    assert set(rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}
    assert rails["VDD_GPU_SOC"].watts == pytest.approx(19.104 * 1.472)
    gpu = stats.clocks["gpu"]
    assert (gpu.hz, gpu.max_hz, gpu.hardware_max_hz) == (918000000, 918000000, 1300500000)
    assert stats.clocks["cpu"].hz == 1728000000 and stats.clocks["cpu"].max_hz == 1728000000
    assert "emc" not in stats.clocks  # debugfs: root only, absent here
    assert stats.oc_events == {"oc1": 0, "oc2": 0, "oc3": 12}
    assert not stats.throttled and stats.throttle_events == {}  # counts since boot: a baseline


def test_tegra_off_a_jetson_reads_nothing(tmp_path: Path) -> None:
    (tmp_path / "sys/class/thermal/thermal_zone0").mkdir(parents=True)
    (tmp_path / "sys/class/thermal/thermal_zone0/type").write_text("x86_pkg_temp\n")
    (tmp_path / "sys/class/thermal/thermal_zone0/temp").write_text("45000\n")
    assert Tegra(tmp_path).read() is None
    assert host.jetson_gpus(None) == []


def test_tegra_when_a_jetpack_lacks_files_leaves_those_figures_out(orin: Path) -> None:
    for gone in ("var/lib/nvpmodel/status", "proc/meminfo",
                 "sys/devices/platform/bus@0/17000000.gpu/load"):
        (orin / gone).unlink()
    (orin / "sys/class/hwmon/hwmon1/curr1_input").write_text("garbage\n")
    stats = Tegra(orin).read()
    assert stats is not None
    assert stats.gpu_load is None and stats.memory_total_bytes is None
    assert stats.power_mode is None and stats.power_mode_id is None
    assert "VDD_GPU_SOC" not in {r.name for r in stats.rails}
    assert host.jetson_gpus(stats) == []  # no memory figure: no GPU row


def test_tegra_on_jetpack_4_finds_the_legacy_gpu_load(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/gpu.0").mkdir(parents=True)
    (tmp_path / "sys/devices/gpu.0/load").write_text("250\n")
    stats = Tegra(tmp_path).read()
    assert stats is not None and stats.gpu_load == pytest.approx(0.25)


def test_tegra_when_over_current_events_grow_logs_counts_and_tells_listeners(
        orin: Path, caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    tegra = Tegra(orin, clock=clock)
    heard: list[str] = []
    tegra.on_throttle(lambda reason, stats: heard.append(reason))
    tegra.read()
    set_value(orin, "sys/class/hwmon/hwmon3/oc3_event_cnt", 15)
    with caplog.at_level(logging.WARNING, logger="edged.hardware.tegra"):
        assert tegra.read() is tegra.read()  # within min_interval_s: the same pass
        clock.now += 5
        stats = tegra.read()
    assert stats is not None and stats.throttled
    assert stats.throttle_events == {"oc3": 3}
    assert heard == ["3 oc3 instantaneous over-current event(s)"]
    assert [r.getMessage() for r in caplog.records] == [
        "Jetson clocks capped: 3 oc3 instantaneous over-current event(s)"]
    clock.now += 5
    calm = tegra.read()
    assert calm is not None and not calm.throttled and calm.throttle_events == {"oc3": 3}
    assert len(heard) == 1


def test_tegra_when_a_zone_passes_its_passive_trip_counts_one_event_until_it_cools(
        orin: Path) -> None:
    clock = Clock()
    tegra = Tegra(orin, clock=clock)
    heard: list[str] = []
    tegra.on_throttle(lambda reason, stats: heard.append(reason))
    set_value(orin, "sys/class/thermal/thermal_zone1/temp", 99500)  # gpu-thermal
    for _ in range(3):
        clock.now += 2
        stats = tegra.read()
        assert stats is not None and stats.throttled and stats.hot_zones == ("gpu-thermal",)
    assert stats.throttle_events == {"thermal": 1}
    assert heard == ["gpu-thermal past its passive trip point"]
    set_value(orin, "sys/class/thermal/thermal_zone1/temp", 80000)
    clock.now += 2
    cooled = tegra.read()
    assert cooled is not None and not cooled.throttled and cooled.hot_zones == ()


def test_tegra_a_failing_listener_does_not_stop_the_reading(orin: Path) -> None:
    clock = Clock()
    tegra = Tegra(orin, clock=clock)

    def broken(reason: str, stats: object) -> None:
        raise RuntimeError("the broker went away")

    tegra.on_throttle(broken)
    tegra.read()
    set_value(orin, "sys/class/hwmon/hwmon3/oc2_event_cnt", 1)
    clock.now += 2
    stats = tegra.read()
    assert stats is not None and stats.throttle_events == {"oc2": 1}


def _metrics(jetson: Tegra | None) -> str:
    read = jetson.read if jetson is not None else (lambda: None)
    return Metrics(lambda: [], lambda: [], gpus=lambda: host.jetson_gpus(read()),
                   jetson=read).render().decode()


def test_metrics_on_a_jetson_show_its_families_under_edged_gpu(orin: Path) -> None:
    clock = Clock()
    tegra = Tegra(orin, clock=clock)
    tegra.read()
    set_value(orin, "sys/class/hwmon/hwmon3/oc3_event_cnt", 20)
    clock.now += 2
    text = _metrics(tegra)
    assert 'edged_gpu_utilization{gpu="0"} 0.73' in text
    assert 'edged_gpu_memory_total_bytes{gpu="0"} 3.27650304e+10' in text  # shared DRAM
    assert 'edged_gpu_memory_used_bytes{gpu="0"} 1.1264e+10' in text
    assert 'edged_gpu_temperature_celsius{zone="gpu-thermal"} 58.25' in text
    assert 'edged_gpu_power_watts{rail="VIN_SYS_5V0"} 4.647' in text
    assert 'edged_gpu_clock_max_hz{clock="gpu"} 9.18e+08' in text
    assert 'edged_gpu_power_mode{id="2",name="MODE_30W"} 1.0' in text
    assert "edged_gpu_throttled 1.0" in text
    assert 'edged_gpu_throttle_events_total{cause="oc3"} 8.0' in text


def test_metrics_off_a_jetson_show_no_jetson_families(tmp_path: Path) -> None:
    text = _metrics(Tegra(tmp_path))
    for family in ("edged_gpu_temperature", "edged_gpu_power", "edged_gpu_clock",
                   "edged_gpu_throttle", "edged_gpu_rail", "edged_gpu_utilization"):
        assert family not in text
    assert "edged_inference_count" in text  # the rest renders


def test_metrics_default_readers_render_on_this_machine() -> None:
    """The daemon's own wiring (host.gpus, host.jetson) on whatever this box is."""
    text = Metrics(lambda: [], lambda: []).render().decode()
    if host.jetson() is None:
        assert "edged_gpu_temperature_celsius" not in text
        assert "edged_gpu_throttled" not in text
