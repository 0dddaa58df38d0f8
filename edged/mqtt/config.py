"""The MQTT link's section of the daemon config (`mqtt:`): the broker, credentials and TLS,
topic prefixes, QoS, the offline buffer and Home Assistant discovery."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.core.schema import at_least, between, check_name, setting


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
    enabled: bool = setting(True, "announce detect streams' counts, occupancy and snapshots, "
                                  "and streams' states, to Home Assistant (MQTT discovery, "
                                  "retained)")
    prefix: str = setting("homeassistant", "Home Assistant's discovery prefix",
                          check=_check_topic_prefix)


def _check_filters(values: list[str]) -> str | None:
    for value in values:
        levels = value.split("/")
        if not value or "#" in value[:-1] or any(("+" in lv or "#" in lv) and len(lv) > 1
                                                 for lv in levels):
            return f"{value!r} is not an MQTT topic filter"
    return None if values else "give at least one topic filter"


@dataclass(frozen=True)
class RequestClient:
    name: str = setting(help="who asks: for the log, the rate limit and the counts",
                        check=check_name)
    response_topics: list[str] = setting(
        help="topic filters its requests' response topics must match, such as replies/<name>/#"
             " (give the broker an ACL that lets only this client read them)",
        check=_check_filters)
    models: list[str] = setting(factory=list, help="models it may call; empty = every model")


@dataclass(frozen=True)
class RequestsConfig:
    enabled: bool = setting(False, "answer MQTT 5 inference requests on <prefix>/infer/<model> "
                                   "(KServe v2 bodies; the answer goes to the response topic)")
    clients: list[RequestClient] = setting(
        factory=list, help="the allowlist: a request whose response topic matches none of "
                           "these gets no answer at all")
    rate_per_s: float = setting(20.0, "requests per second per client (a token bucket); more "
                                      "are answered rate_limited", check=at_least(0.01))
    burst: int = setting(20, "requests a client may send at once above its rate",
                         check=at_least(1))
    max_request_mb: int = setting(4, "largest request answered; a larger one gets too_large "
                                     "(beyond mqtt.max_packet_mb the broker drops it unanswered)",
                                  check=at_least(1))
    max_in_flight: int = setting(32, "requests being decoded, queued or run at once, every "
                                     "client together; more are answered overloaded",
                                 check=at_least(1))
    workers: int = setting(2, "threads that decode requests and encode answers",
                           check=between(1, 16))


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
    presence_off_delay_s: float = setting(
        30.0, "a face's or known plate's name stays present (<prefix>/presence/<kind>/<name>, "
              "its Home Assistant binary sensor) this long after its last object ended, so a "
              "track lost for a moment does not toggle it", check=between(0, 3600))
    requests: RequestsConfig = setting(factory=RequestsConfig,
                                       help="MQTT 5 request/response inference (off by default)")


def check_requests(mqtt: MqttConfig) -> list[tuple[str, str]]:
    """(key path under mqtt., problem) for requests that cannot work as configured."""
    issues = []
    requests = mqtt.requests
    if requests.enabled and mqtt.protocol != "5":
        issues.append(("requests.enabled", "requests need MQTT 5 (response topic and "
                                           "correlation data): set mqtt.protocol: \"5\""))
    if requests.enabled and requests.max_request_mb > mqtt.max_packet_mb:
        issues.append(("requests.max_request_mb", f"{requests.max_request_mb} is above "
                                                  f"max_packet_mb ({mqtt.max_packet_mb}): the "
                                                  "broker would drop such requests unanswered"))
    names = [c.name for c in requests.clients]
    for i, name in enumerate(names):
        if name in names[:i]:
            issues.append((f"requests.clients[{i}].name", f"duplicate client {name!r}"))
    return issues
