"""Over-the-air updates' section of the daemon config (`ota:`): trusted keys, what is kept,
artifact bounds and deadlines, fleet groups, and what a shadow rollout may cost."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edged.core.schema import at_least, check_names, setting


def _positive_or_null(value: float | None) -> str | None:
    return None if value is None or value > 0 else f"must be > 0 or null, got {value}"


def _share(value: float) -> str | None:
    return None if 0 < value <= 1 else f"must be in (0, 1], got {value}"


@dataclass(frozen=True)
class ShadowConfig:
    max_share: float = setting(0.25, "shadow rollouts: the candidate's runs may take at most "
                                     "this share of wall-clock time (samples over it are "
                                     "skipped and counted)", check=_share)
    queue: int = setting(4, "shadow rollouts: sampled inputs waiting for the candidate at most "
                            "(more are skipped and counted)", check=at_least(1))
    publish_every_s: float = setting(2.0, "shadow rollouts: progress on <prefix>/ota/<model>/"
                                          "shadow at most this often", check=at_least(0.05))


@dataclass(frozen=True)
class OtaConfig:
    trusted_keys: list[Path] = setting(factory=list, help="Ed25519 public keys (PEM) whose "
                                       "signatures are trusted; relative paths are read from "
                                       "$CREDENTIALS_DIRECTORY")
    keep_versions: int = setting(3, "versions kept on disk per model", check=at_least(1))
    allow_unsigned: bool = setting(False, "accept manifests and commands without a signature "
                                          "(and so without freshness): testing only")
    max_artifact_mb: int = setting(512, "largest artifact (and unpacked bundle) accepted",
                                   check=at_least(1))
    ca_file: Path | None = setting(None, "CA bundle for https:// artifacts; null = the system's")
    chunk_timeout_s: float = setting(120.0, "inline (MQTT) artifacts: wait this long for all "
                                            "chunks", check=at_least(1))
    download_timeout_s: float | None = setting(
        None, "one artifact download, retries included, must finish within this many seconds; "
              "null = 300 s plus the time the artifact takes at 32 KiB/s (a trickling server "
              "must not hold the single OTA worker)", check=_positive_or_null)
    groups: list[str] = setting(factory=list, help="fleet groups this device takes updates "
                                                   "for: <fleet_prefix>/groups/<g>/ota/<model>",
                                check=check_names)
    shadow: ShadowConfig = setting(factory=ShadowConfig, help="what a shadow rollout may cost")
