"""A daemon on a (fake sysfs) Jetson: its integrated GPU, temperatures, rails and power mode
in /metrics, the status report and the MQTT stats message, and with health.warn_on_throttle a
warning on <prefix>/warnings once over-current events start -- through a real broker."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.broker import Broker, Subscriber
from support.daemon import ServeFactory
from support.polling import wait_until

from edged.hardware import host
from edged.hardware.tegra import Tegra
from tests.support.jetson_sysfs import orin_root, set_value

WARNINGS = "t/jetson/warnings"


def scrape(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        return str(reply.read().decode())


@pytest.fixture
def orin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = orin_root(tmp_path / "orin")
    monkeypatch.setattr(host, "TEGRA", Tegra(root, min_interval_s=0.05))
    yield root


def test_daemon_on_a_jetson_reports_it_and_warns_when_clocks_are_capped(
        orin: Path, broker: Broker, make_served: ServeFactory) -> None:
    sub = Subscriber(broker, WARNINGS, "t/jetson/stats")
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/jetson, "
                                  "stats_interval_s: 0.2",
                             health="tick_s: 0.1, warn_on_throttle: true")
        stats = json.loads(sub.wait_for("t/jetson/stats", timeout=20).payload)
        assert stats["jetson"]["power_mode"] == "MODE_30W"
        assert stats["gpus"][0]["name"] == "Jetson integrated GPU (L4T R36.4.3)"
        text = scrape(served.http)
        assert 'edged_gpu_temperature_celsius{zone="tj-thermal"} 61.5' in text
        assert 'edged_gpu_utilization{gpu="0"} 0.73' in text  # NVML's whole percent
        with served.client() as client:
            report = client.status()
        assert report["jetson"]["l4t"] == "R36.4.3"
        set_value(orin, "sys/class/hwmon/hwmon3/oc3_event_cnt", 40)
        warning = json.loads(sub.wait_for(WARNINGS, timeout=20).payload)
        assert warning["warning"] == "throttled" and warning["device_id"] == "test"
        assert warning["reason"] == "28 oc3 instantaneous over-current event(s)"
        wait_until(lambda: 'edged_gpu_throttle_events_total{cause="oc3"} 28.0' in
                   scrape(served.http), timeout=10, what="the throttle events counted")
    finally:
        sub.close()
