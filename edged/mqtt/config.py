"""The MQTT link's section of the daemon config (`mqtt:`): the broker, credentials and TLS,
topic prefixes, QoS, the offline buffer and Home Assistant discovery."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.core.schema import at_least, between, setting


@dataclass(frozen=True)
class TlsConfig:
    ca: Path = setting(help="CA certificate (PEM) of the broker")
    cert: Path | None = setting(None, "client certificate (PEM)")
    key: Path | None = setting(None, "client key (PEM)")
    insecure: bool = setting(False, "skip hostname checks (testing only)")


def _check_topic_prefix(value: str) -> str | None:
    if not value or value.startswith("/") or value.endswith("/") or set(value) & set("#+"):
        return f"{value!r} is not a topic prefix (no wildcards, no leading or trailing /)"
    return None


@dataclass(frozen=True)
class DiscoveryConfig:
    enabled: bool = setting(True, "announce detect streams' counts, occupancy and snapshots "
                                  "to Home Assistant (MQTT discovery, retained)")
    prefix: str = setting("homeassistant", "Home Assistant's discovery prefix",
                          check=_check_topic_prefix)


@dataclass(frozen=True)
class MqttConfig:
    enabled: bool = setting(True, "connect to a broker at all")
    host: str = setting("127.0.0.1", "broker host")
    port: int = setting(1883, "broker port", check=between(1, 65535))
    protocol: Literal["5", "3.1.1"] = setting("5", "MQTT protocol version")
    username: str | None = setting(None, "broker username; null = none")
    password_file: Path | None = setting(None, "file holding the broker password; a relative "
                                         "path is read from $CREDENTIALS_DIRECTORY (systemd's "
                                         "LoadCredential=)")
    tls: TlsConfig | None = setting(None, "TLS settings; null = plain TCP")
    prefix: str | None = setting(None, "topic prefix; null = edged/<device_id>")
    fleet_prefix: str = setting("edged/fleet", "fleet-wide topic prefix: OTA manifests and "
                                               "commands for every device and group")
    qos_results: int = setting(0, "QoS of per-frame results (a lost one is replaced by the "
                                  "next frame's)", check=between(0, 2))
    qos_events: int = setting(1, "QoS of events, counts, line counts and snapshots (a lost "
                                 "`end` leaves a subscriber with an object that is gone)",
                              check=between(0, 2))
    buffer_messages: int = setting(10000, "messages kept while the broker is away (past it "
                                          "the oldest are dropped and counted)",
                                   check=at_least(0))
    stats_interval_s: float = setting(10.0, "period of <prefix>/stats", check=at_least(0.1))
    max_packet_mb: int = setting(
        16, "largest MQTT packet taken in (MQTT 5: told to the broker at connect, which then "
            "drops bigger ones for this client; 3.1.1 cannot say so: set the broker's "
            "max_packet_size)", check=between(1, 256))
    discovery: DiscoveryConfig = setting(factory=DiscoveryConfig,
                                         help="Home Assistant MQTT discovery")
