"""The daemon's two periodic loops on its asyncio loop: the stats loop (retained model states
when they change, the stats message, giving freed heap back) and the health tick (progress
checks, systemd's watchdog and status line, Jetson throttling reads)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from edged.hardware import host
from edged.hardware.host import trim_heap
from edged.mqtt import topics
from edged.mqtt.link import MqttLink
from edged.service.config import HealthConfig
from edged.service.health import HealthMonitor
from edged.service.reporting import Reporter
from edged.service.systemd import Notifier


async def report_loop(reporter: Reporter, mqtt: MqttLink | None,
                      interval_s: Callable[[], float]) -> None:
    """Retained model states when they change, and the periodic stats message."""
    while True:
        for name, payload in await asyncio.to_thread(reporter.changed_states):
            if mqtt is not None:
                mqtt.publish("state", topics.model_state(name), payload, retain=True)
        message = await asyncio.to_thread(reporter.stats)  # reads disk, NVML
        stats = json.dumps(message, separators=(",", ":")).encode()
        if mqtt is not None:
            mqtt.publish("stats", topics.STATS, stats)
        # What request bodies, updates and bursts freed goes back to the system; without
        # it RSS crept up ~1 MB per OTA swap under load (tools/bench/soak.py).
        await asyncio.to_thread(trim_heap)
        await asyncio.sleep(interval_s())


async def health_loop(health: HealthMonitor, notifier: Notifier,
                      status_line: Callable[[list[str]], str],
                      config: Callable[[], HealthConfig]) -> None:
    """Check progress; ping systemd's watchdog only while nothing is stuck, so that a stuck
    model worker or stream gets the service restarted. The check runs on the loop itself: a
    loop that cannot run it stops the pings too. `config` is read each tick (a reload may
    change the limits)."""
    watchdog_s = notifier.watchdog_s
    interval = watchdog_s / 2 if watchdog_s else config().tick_s
    last_line = None
    while True:
        settings = config()
        health.stall_after_s = settings.stall_after_s
        problems = health.check()
        if not problems:
            notifier.watchdog()
        line = status_line(problems)
        if line != last_line:
            notifier.status(line)
            last_line = line
        if settings.warn_on_throttle:  # listeners hear of throttling on a read
            await asyncio.to_thread(host.jetson)
        await asyncio.sleep(interval)
