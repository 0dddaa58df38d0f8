"""What the daemon says about itself: the one line `systemctl status` shows (kept current by
the health tick) and the report `edged status` prints (GET /v2/edged/status). Read from the
rooms that own each part, through what the composition root hands over."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edged import __version__
from edged.hardware import host
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.mqtt.link import MqttLink
from edged.service.health import HealthMonitor, RecentErrors
from edged.service.reporting import inference_view
from edged.service.systemd import Notifier
from edged.streams.streamset import StreamSet


@dataclass
class DaemonStatus:
    """The running daemon's parts that a status reads. `ota` gives the OTA section of the
    report (None: updates are off), `updates` each model's latest update step; `ready` is the
    daemon's readiness."""

    device_id: Callable[[], str]
    cache: ModelCache
    scheduler: Scheduler
    streams: StreamSet
    mqtt: MqttLink | None
    health: HealthMonitor
    notifier: Notifier
    recent: RecentErrors
    ready: Callable[[], bool]
    ota: Callable[[], dict[str, Any] | None]
    updates: Callable[[], dict[str, dict[str, Any]]] = dict  # each model's latest OTA step
    reloads: dict[str, int] = dataclasses.field(default_factory=lambda: {"ok": 0, "failed": 0})
    requests: Callable[[], dict[str, Any] | None] = lambda: None  # MQTT requests' counts
    generations: Callable[[], dict[str, Any]] = dict  # language models' queues and counts
    faces: Callable[[], dict[str, Any] | None] = lambda: None  # the gallery's counts, embedder
    describer: Callable[[], dict[str, Any] | None] = lambda: None  # event descriptions' counts
    started: float = dataclasses.field(default_factory=time.monotonic)

    def live(self) -> tuple[bool, list[str]]:
        """Alive unless the health tick found something stuck (then a restart is the cure)."""
        problems = list(self.health.problems)
        return not problems, problems

    def line(self, problems: list[str] | None = None) -> str:
        """One line for `systemctl status`: what is loaded, what streams, the broker. From
        memory only: the health tick runs it on the loop, never waiting for a thread."""
        problems = self.health.problems if problems is None else problems
        if problems:
            return "STUCK: " + "; ".join(problems)
        ready = self.cache.loaded()
        up, streams = self.streams.up()
        parts = [f"{len(ready)} model(s) ready" + (f" ({', '.join(ready[:4])}"
                                                    f"{', ...' if len(ready) > 4 else ''})"
                                                    if ready else ""),
                 f"streams {up}/{streams} up"]
        if self.mqtt is not None:
            parts.append("broker " + ("connected" if self.mqtt.connected else "unreachable"))
        return ", ".join(parts)

    def report(self) -> dict[str, Any]:
        """What `edged status` shows (GET /v2/edged/status); called on a thread."""
        live, problems = self.live()
        return {
            "device_id": self.device_id(), "version": __version__, "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self.started, 1),
            "ready": self.ready(), "live": live, "problems": problems,
            "systemd": {"notify": self.notifier.enabled, "watchdog_s": self.notifier.watchdog_s},
            "reloads": dict(self.reloads),
            "models": [{**dataclasses.asdict(row), "device": row.device}
                       for row in self.cache.status()],
            "queues": self.scheduler.queues(),
            "inference": inference_view(self.scheduler.counters()),
            "streams": self.streams.describe(),
            "mqtt": self.mqtt.stats() if self.mqtt is not None else None,
            "mqtt_requests": self.requests(),
            "generations": self.generations(),
            "faces": self.faces(),
            "describer": self.describer(),
            "ota": self.ota(),
            "updates": self.updates(),
            "process": {"rss_bytes": host.rss_bytes()},
            "gpus": [dataclasses.asdict(gpu) for gpu in host.gpus()],
            "jetson": jetson.as_dict() if (jetson := host.jetson()) is not None else None,
            "recent": self.recent.rows(),
        }
