"""The service's sections of the daemon config: logging (`logging:`) and the progress checks
behind systemd's watchdog and `/v2/health/live` (`health:`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from edged.core.schema import at_least, setting


@dataclass(frozen=True)
class LoggingConfig:
    level: Literal["debug", "info", "warning", "error"] = setting("info", "log level")
    target: Literal["auto", "journal", "stderr"] = setting(
        "auto", "auto: the journal (with MODEL=, STREAM=, CODE= fields) when systemd "
                "connected stderr to it, else stderr")


@dataclass(frozen=True)
class HealthConfig:
    stall_after_s: float = setting(
        60.0, "a model with work but no finished batch, or a stream loop or capture call "
              "that has not come round, for this long is stuck: /v2/health/live answers 503 "
              "and systemd's watchdog pings stop (so it restarts edged)", check=at_least(0.1))
    tick_s: float = setting(5.0, "health check period when systemd sets no watchdog "
                                 "(with one: half its interval)", check=at_least(0.05))
    warn_on_throttle: bool = setting(
        False, "Jetson: publish a warning on <prefix>/warnings when clocks become capped "
               "(over-current events, or a thermal zone past its passive trip point); the "
               "health tick reads sysfs for it")
