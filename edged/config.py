"""The daemon's typed config: one YAML file, unknown keys are errors, every error names its line.
Each room owns its section (`edged/<room>/config.py`); this module composes them and holds the
cross-section checks."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.api.config import ApiConfig, check_loopback
from edged.backends.config import BackendsConfig
from edged.core.errors import ConfigError, ConfigIssue
from edged.core.schema import Parsed, check_name, parse, parse_file, setting
from edged.describer.config import DescriberConfig
from edged.events.config import check_stream_events
from edged.galleries.config import FacesConfig
from edged.inference.config import CacheConfig
from edged.mqtt.config import MqttConfig, check_requests
from edged.ota.config import OtaConfig
from edged.recording.config import RecordingConfig
from edged.service.config import HealthConfig, LoggingConfig
from edged.streams.config import (
    STREAM_SCHEMES,
    StreamConfig,
    check_stream_clips,
    check_stream_gate,
    check_stream_states,
)

DEFAULT_CONFIG_PATH = Path("/etc/edged/edged.yaml")  # what `edged run` reads without --config


@dataclass(frozen=True)
class DaemonConfig:
    device_id: str = setting("edge-01", "this device's id (in MQTT topics)", check=check_name)
    models_dir: Path = setting(Path("/var/lib/edged/models"), "the model repository: "
                               "<name>/model.yaml and <name>/<version>/model.onnx")
    cache: CacheConfig = setting(factory=CacheConfig, help="warm model cache")
    backends: BackendsConfig = setting(factory=BackendsConfig, help="backend options")
    api: ApiConfig = setting(factory=ApiConfig, help="local socket API")
    mqtt: MqttConfig = setting(factory=MqttConfig, help="MQTT link")
    streams: list[StreamConfig] = setting(factory=list, help="camera and sensor streams")
    ota: OtaConfig = setting(factory=OtaConfig, help="over-the-air model updates")
    recording: RecordingConfig = setting(factory=RecordingConfig,
                                         help="where event clips are kept, and how much")
    describer: DescriberConfig = setting(
        factory=DescriberConfig, help="event descriptions: who describes the ended events of "
                                      "streams with `describe.enabled` (off unless `model` or "
                                      "`endpoint` is set)")
    logging: LoggingConfig = setting(factory=LoggingConfig, help="logging")
    health: HealthConfig = setting(factory=HealthConfig, help="progress checks and watchdog")
    faces: FacesConfig = setting(factory=FacesConfig, help="face recognition: the detector, "
                                                           "embedder and gallery")
    allocator: Literal["glibc", "jemalloc", "auto"] = setting(
        "auto", "the C heap's allocator, read at start (EDGED_ALLOCATOR overrides): auto: "
                "jemalloc where libjemalloc2 is installed (the daemon re-executes itself with "
                "it preloaded, ~0.3-0.45 s more a start), else glibc; jemalloc: the same, an error "
                "where it is missing; glibc: glibc's malloc, tuned (its heap grows at each OTA "
                "swap)")

    @property
    def mqtt_prefix(self) -> str:
        return self.mqtt.prefix or f"edged/{self.device_id}"


def check_streams(parsed: Parsed[DaemonConfig]) -> list[ConfigIssue]:
    """Stream names are unique, each source has a scheme edged can read, zone and line names
    are unique within their stream, and a change gate is asked for only where there are
    pictures."""
    issues = []
    seen: set[str] = set()
    for i, stream in enumerate(parsed.value.streams):
        at = parsed.at("streams", i)
        if stream.name in seen:
            issues.append(parsed.issue(f"{at}.name", f"duplicate stream {stream.name!r}"))
        seen.add(stream.name)
        scheme, sep, _rest = stream.source.partition("://")
        if not sep:
            issues.append(parsed.issue(f"{at}.source", "expected a URI such as file://..."))
        elif scheme not in STREAM_SCHEMES:
            issues.append(parsed.issue(f"{at}.source", f"unsupported scheme {scheme!r}"))
        issues += check_stream_events(parsed, at, stream)
        issues += check_stream_gate(parsed, at, stream)
        issues += check_stream_clips(parsed, at, stream)
        issues += check_stream_states(parsed, at, stream)
    return issues


def check_cache(parsed: Parsed[DaemonConfig]) -> list[ConfigIssue]:
    """Model names in preload/pinned are plain names (the repository rejects the rest anyway)."""
    issues = []
    for key in ("preload", "pinned"):
        names = getattr(parsed.value.cache, key)
        for i, name in enumerate([] if names == "all" else names):
            message = check_name(name)
            if message:
                issues.append(parsed.issue(f"cache.{key}[{i}]", message))
    return issues


def check_mqtt(parsed: Parsed[DaemonConfig]) -> list[ConfigIssue]:
    return [parsed.issue(f"mqtt.{path}", message)
            for path, message in check_requests(parsed.value.mqtt)]


def check_faces(parsed: Parsed[DaemonConfig]) -> list[ConfigIssue]:
    """`as: identity` cascades need the face pipeline on, and its embedder."""
    issues = []
    faces = parsed.value.faces
    for i, stream in enumerate(parsed.value.streams):
        for j, secondary in enumerate(stream.secondary):
            if secondary.as_ != "identity":
                continue
            at = f"{parsed.at('streams', i)}.secondary[{j}]"
            if not faces.enabled:
                issues.append(parsed.issue(f"{at}.as", "identity needs the face pipeline: "
                                                       "faces.enabled: true"))
            elif secondary.model != faces.embedder:
                issues.append(parsed.issue(f"{at}.model", f"as: identity runs the face "
                                                          f"pipeline's embedder "
                                                          f"({faces.embedder})"))
    return issues


def check_describer(parsed: Parsed[DaemonConfig]) -> list[ConfigIssue]:
    """One describer (a local model or an endpoint, not both); a stream that asks for
    descriptions needs it; a stream's `describe.labels` are labels it tracks."""
    config, issues = parsed.value, []
    describer = config.describer
    if describer.model is not None and describer.endpoint is not None:
        issues.append(parsed.issue("describer.endpoint", "a describer is a local model or an "
                                   "endpoint: set `model` or `endpoint`, not both"))
    for i, stream in enumerate(config.streams):
        at = f"{parsed.at('streams', i)}.describe"
        if not stream.describe.enabled:
            continue
        if describer.model is None and describer.endpoint is None:
            issues.append(parsed.issue(f"{at}.enabled", "descriptions need a describer: set "
                                       "describer.model (a language model here) or "
                                       "describer.endpoint"))
        for j, label in enumerate(stream.describe.labels):
            if stream.labels and label not in stream.labels:
                issues.append(parsed.issue(f"{at}.labels[{j}]", f"{label!r} is not one of the "
                                           f"stream's labels ({', '.join(stream.labels)})"))
    return issues


CHECKS = (check_streams, check_cache, check_mqtt, check_faces, check_describer)


def load_config(path: Path) -> DaemonConfig:
    """Read and validate a daemon config file; raises ConfigError listing every problem."""
    return parse_file(DaemonConfig, path, CHECKS).value


def builtin_config() -> DaemonConfig:
    """What `edged run` serves with no config file: every default, MQTT off (there is no
    broker to assume)."""
    return dataclasses.replace(DaemonConfig(), mqtt=MqttConfig(enabled=False))


def parse_config(text: str) -> DaemonConfig:
    return parse(DaemonConfig, text, checks=CHECKS).value


def with_overrides(config: DaemonConfig, *, models_dir: Path | None = None,
                   socket: Path | None = None, http: str | None = None,
                   sources: dict[str, str] | None = None) -> DaemonConfig:
    """Apply the CLI flags that override the file for the common cases. `sources` maps a
    stream's name to a new source URI (`--source demo=v4l2:///dev/video0`)."""
    if http is not None and (message := check_loopback(http)):
        raise ConfigError([ConfigIssue("--http", message)])
    api = dataclasses.replace(config.api, socket=socket or config.api.socket,
                              http=http if http is not None else config.api.http)
    streams = list(config.streams)
    for name, uri in (sources or {}).items():
        index = next((i for i, s in enumerate(streams) if s.name == name), None)
        if index is None:
            raise ConfigError([ConfigIssue("--source", f"no stream named {name!r}")])
        if uri.partition("://")[0] not in STREAM_SCHEMES:
            raise ConfigError([ConfigIssue("--source", f"unsupported source {uri!r}")])
        streams[index] = dataclasses.replace(streams[index], source=uri)
    return dataclasses.replace(config, models_dir=models_dir or config.models_dir, api=api,
                               streams=streams)
