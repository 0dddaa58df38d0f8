"""What a SIGHUP reload may change in a running daemon: the plan, worked out from the running
and the re-read config alone (the daemon carries it out). Sections a running daemon cannot
change keep their running values and are named, so the log can say they wait for a restart."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from edged.config import DaemonConfig
from edged.streams.config import StreamConfig

# Whole sections that take effect only at the next start.
RESTART_ONLY = ("device_id", "models_dir", "backends", "api", "mqtt", "allocator", "recording",
                "faces", "describer")
# Keys inside sections that are otherwise reloadable.
RESTART_ONLY_KEYS = {
    "cache": ("dir", "budget_mb", "snapshots_mb", "responses_mb"),
    "ota": ("keep_versions", "allow_unsigned", "max_artifact_mb", "ca_file", "chunk_timeout_s",
            "groups", "max_parallel_downloads", "staging_mb", "download_rate_kbps"),
    "logging": ("target",),
}


@dataclass
class ReloadPlan:
    config: DaemonConfig  # what runs after the reload: `new`, restart-only parts as running
    needs_restart: list[str] = field(default_factory=list)  # "api", "cache.budget_mb", ...
    stop: list[str] = field(default_factory=list)  # streams gone or changed
    start: list[StreamConfig] = field(default_factory=list)  # streams new or changed
    # models newly in cache.preload, or "all" when it became all
    preload: list[str] | Literal["all"] = field(default_factory=list)
    trusted_keys_changed: bool = False


def plan(running: DaemonConfig, new: DaemonConfig, *,
         streams_running: set[str] | None = None, recording_open: bool = True) -> ReloadPlan:
    """The plan to get from `running` to `new`. `streams_running`: the configured streams
    that really run (one that failed to start is started again if it is still wanted).
    `recording_open`: the recording folder is in use (its section then waits for a restart;
    while no store is open, the reload that turns recording on opens it as configured)."""
    result = ReloadPlan(new)
    kept: dict[str, Any] = {}
    for section in RESTART_ONLY:
        if section == "recording" and not recording_open:
            continue
        if getattr(new, section) != getattr(running, section):
            result.needs_restart.append(section)
            kept[section] = getattr(running, section)
    for section, keys in RESTART_ONLY_KEYS.items():
        old_part, new_part = getattr(running, section), getattr(new, section)
        held = {key: getattr(old_part, key) for key in keys
                if getattr(new_part, key) != getattr(old_part, key)}
        result.needs_restart += [f"{section}.{key}" for key in held]
        if held:
            kept[section] = dataclasses.replace(new_part, **held)
    result.config = dataclasses.replace(new, **kept)
    result.trusted_keys_changed = new.ota.trusted_keys != running.ota.trusted_keys
    if new.cache.preload == "all":
        result.preload = "all" if running.cache.preload != "all" else []
    else:
        result.preload = [n for n in new.cache.preload if running.cache.preload != "all"
                          and n not in running.cache.preload]

    alive = {s.name for s in running.streams} if streams_running is None else streams_running
    before = {s.name: s for s in running.streams if s.name in alive}
    wanted = {s.name: s for s in new.streams}
    result.stop = [name for name, cfg in before.items() if wanted.get(name) != cfg]
    result.start = [cfg for cfg in new.streams
                    if cfg.name not in before or cfg.name in result.stop]
    return result
