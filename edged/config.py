"""The daemon's typed config: one YAML file, unknown keys are errors, every error names its line."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.core.errors import ConfigError, ConfigIssue
from edged.core.schema import Parsed, at_least, between, parse, parse_file, setting
from edged.events.config import (
    LineConfig,
    PublishConfig,
    SnapshotsConfig,
    TrackConfig,
    ZoneConfig,
    check_stream_events,
)

DEFAULT_CONFIG_PATH = Path("/etc/edged/edged.yaml")  # what `edged run` reads without --config
SYSTEM_SOCKET = Path("/run/edged/edged.sock")  # the service's (systemd makes /run/edged)


def default_socket() -> Path:
    """Where the API listens when the config names no socket: the service's path for root or
    where /run/edged is writable, else the user's runtime directory ($XDG_RUNTIME_DIR, as a
    desktop session or `systemd --user` sets it; /tmp/edged-<uid>.sock without one)."""
    if os.geteuid() == 0 or os.access(SYSTEM_SOCKET.parent, os.W_OK):
        return SYSTEM_SOCKET
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "edged.sock"
    return Path(tempfile.gettempdir()) / f"edged-{os.getuid()}.sock"

STREAM_SCHEMES = ("file", "rtsp", "http", "https", "v4l2", "csi", "gst", "mqtt")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _check_name(value: str) -> str | None:
    return None if _NAME.match(value) else f"{value!r} is not a valid name ([A-Za-z0-9_.-])"


def _check_names(values: list[str]) -> str | None:
    bad = [v for v in values if not _NAME.match(v)]
    return f"{bad[0]!r} is not a valid name ([A-Za-z0-9_.-])" if bad else None


def _check_mode(value: str) -> str | None:
    return None if re.fullmatch(r"0?[0-7]{3}", value) else "must be an octal mode such as \"0660\""


def _check_size(size: list[int]) -> str | None:
    return None if len(size) == 2 and min(size) > 0 else "size must be [width, height] > 0"


def split_host_port(value: str) -> tuple[str, int]:
    """`127.0.0.1:8000` or `[::1]:8000` → (host, port); ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _check_loopback(value: str) -> str | None:
    try:
        host, _port = split_host_port(value)
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError as exc:
        return str(exc)
    return None if loopback else f"the HTTP listener is loopback-only, got host {host!r}"


@dataclass(frozen=True)
class OrtConfig:
    providers: list[Literal["tensorrt", "cuda", "cpu"]] = setting(
        factory=lambda: ["tensorrt", "cuda", "cpu"], help="provider chain, best first")
    intra_op_threads: int = setting(
        0, "threads inside one operator; 0 = per model on the CPU, 1 or one per core, "
        "whichever runs it faster (timed once, remembered; edged.inference.threads)",
        check=at_least(0))
    inter_op_threads: int = setting(1, "threads across operators", check=at_least(0))
    allow_spinning: bool = setting(False, "idle ORT threads spin (fast alone, bad when shared)")
    graph_optimization: Literal["disable", "basic", "extended", "all"] = setting(
        "all", "ONNX Runtime graph optimisation level")


@dataclass(frozen=True)
class TensorRTConfig:
    workspace_mb: int = setting(1024, "builder workspace in MiB (also ORT's TensorRT EP)",
                                check=at_least(16))
    dla_core: int | None = setting(None, "Jetson: build engines for this DLA core (layers it "
                                   "cannot run fall back to the GPU); null = the GPU",
                                   check=between(0, 15))


@dataclass(frozen=True)
class BackendsConfig:
    default: Literal["auto", "tensorrt", "onnxruntime"] = setting(
        "auto", "backend for models whose model.yaml says auto")
    onnxruntime: OrtConfig = setting(factory=OrtConfig, help="ONNX Runtime options")
    tensorrt: TensorRTConfig = setting(factory=TensorRTConfig, help="TensorRT engine options")
    memory: Literal["auto", "mapped", "managed", "pinned", "host"] = setting(
        "auto", "where batches are assembled: auto = mapped (zero-copy) on integrated GPUs, "
        "pinned + async copies on discrete ones, host without CUDA; managed = unified memory")


@dataclass(frozen=True)
class CacheConfig:
    dir: Path = setting(Path("/var/cache/edged"), "engines, timing caches, measurements")
    budget_mb: int = setting(2048, "memory budget for loaded models", check=at_least(1))
    preload: list[str] | Literal["all"] = setting(
        "all", "models loaded and warmed at start: all (every model in the repository, as "
        "Triton does, while the budget holds them), a list, or [] to load on first request")
    pinned: list[str] = setting(factory=list, help="models never evicted")
    snapshots_mb: int = setting(256, "disk budget of the objects' snapshots kept under "
                                     "<dir>/snapshots (the oldest go first); 0 = none kept",
                                check=at_least(0))

    def preload_names(self, available: list[str]) -> list[str]:
        """The models to preload, given those in the repository."""
        return list(available) if self.preload == "all" else list(self.preload)


@dataclass(frozen=True)
class ApiConfig:
    socket: Path = setting(factory=default_socket, help="Unix socket of the KServe v2 API; "
                           "unset: /run/edged/edged.sock, or $XDG_RUNTIME_DIR/edged.sock for a "
                           "user who cannot write /run/edged")
    socket_mode: str = setting("0660", "socket file mode (octal, quoted)", check=_check_mode)
    socket_group: str | None = setting(None, "group owning the socket; null = unchanged")
    http: str | None = setting(None, "optional loopback TCP listener HOST:PORT",
                               check=_check_loopback)
    allowed_uids: list[int] = setting(factory=list, help="peer uids allowed; empty = any")
    allowed_gids: list[int] = setting(factory=list, help="peer gids allowed; empty = any")
    max_request_mb: int = setting(64, "largest request body", check=at_least(1))
    max_bodies_mb: int = setting(256, "memory all request bodies in flight may hold at once "
                                      "(JSON tensors count 10x their text); past it, 503",
                                 check=at_least(1))
    max_connections: int = setting(512, "connections open at once; more are closed as they "
                                        "arrive (keep it below the unit's LimitNOFILE)",
                                   check=between(1, 60000))
    header_timeout_s: float = setting(10.0, "a request's headers must arrive within this of "
                                            "the connection, or of their first byte",
                                      check=at_least(0.1))
    body_timeout_s: float = setting(30.0, "a request's whole body must arrive within this of "
                                          "its headers (else 408): a stalled body holds its "
                                          "share of max_bodies_mb; a client that takes "
                                          "longer than this to read an answer is cut off",
                                    check=at_least(0.1))
    keepalive_s: float = setting(75.0, "an idle kept-alive connection is closed after this",
                                 check=at_least(0.1))
    max_header_fields: int = setting(100, "header fields a request may carry; more are "
                                          "answered 431", check=between(8, 10000))
    max_header_line_bytes: int = setting(8192, "longest header line (name and value) and "
                                               "request target; longer is answered 431 (a "
                                               "target: 414)", check=between(1024, 65536))
    shm_copy_inputs: Literal["auto", "always", "never"] = setting(
        "auto", "copy shm inputs (pread) instead of lending models views of the mapping: "
        "auto copies for peers of another uid than edged's (not root), so that a client "
        "shrinking its object under a queued request cannot crash edged")


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
    username: str | None = setting(None, "username")
    password_file: Path | None = setting(None, "file holding the password")
    tls: TlsConfig | None = setting(None, "TLS settings; null = plain TCP")
    prefix: str | None = setting(None, "topic prefix; null = edged/<device_id>")
    fleet_prefix: str = setting("edged/fleet", "fleet-wide topic prefix")
    qos_results: int = setting(0, "QoS of result messages", check=between(0, 2))
    qos_events: int = setting(1, "QoS of events, counts, line counts and snapshots (a lost "
                                 "`end` leaves a subscriber with an object that is gone)",
                              check=between(0, 2))
    buffer_messages: int = setting(10000, "messages kept while offline", check=at_least(0))
    stats_interval_s: float = setting(10.0, "period of <prefix>/stats", check=at_least(0.1))
    max_packet_mb: int = setting(
        16, "largest MQTT packet taken in (MQTT 5: told to the broker at connect, which then "
            "drops bigger ones for this client; 3.1.1 cannot say so: set the broker's "
            "max_packet_size)", check=between(1, 256))
    discovery: DiscoveryConfig = setting(factory=DiscoveryConfig,
                                         help="Home Assistant MQTT discovery")


@dataclass(frozen=True)
class SecondaryConfig:
    """A model run on crops of a detect stream's detections (a cascade, as DeepStream's
    secondary GIE and Frigate's sub-labels): one batch of crops per frame."""

    model: str = setting(help="model run on each crop", check=_check_name)
    labels: list[str] = setting(factory=list, help="detections with these labels are cropped; "
                                                   "empty = every label")
    as_: Literal["sub_label", "attributes"] = setting(
        "sub_label", "sub_label: a classify model's top label and score on the detection; "
        "attributes: the model's results under its name", key="as")
    min_score: float = setting(0.0, "detections scoring below this are not cropped",
                               check=between(0, 1))
    crop_margin: float = setting(0.1, "each box grows by this share of its width and height "
                                      "on every side (context for the model)",
                                 check=between(0, 1))
    max_crops: int = setting(8, "crops per frame at most: the best-scoring detections",
                             check=at_least(1))


@dataclass(frozen=True)
class StreamConfig:
    name: str = setting(help="stream name (used in topics)", check=_check_name)
    source: str = setting(help="file://, rtsp://, http(s)://, v4l2://, csi://, gst://, mqtt://")
    model: str = setting(help="model that processes the frames")
    fps: float | None = setting(None, "frame rate limit; null = as fast as the source",
                                check=at_least(0.01))
    backpressure: Literal["drop_oldest", "drop_newest", "block"] = setting(
        "drop_oldest", "what to do with frames when the model is behind")
    priority: int | None = setting(None, "scheduler priority of this stream's frames",
                                   check=at_least(1))
    queue: int = setting(2, "frames held between capture and the model", check=at_least(1))
    in_flight: int = setting(2, "frames of this stream inside the model at once",
                             check=at_least(1))
    loop: bool = setting(False, "file:// sources: start again at the end")
    watchdog_s: float = setting(10.0, "reconnect after this long without a frame",
                                check=at_least(0.1))
    backoff_initial_s: float = setting(0.5, "first reconnect delay", check=at_least(0.01))
    backoff_max_s: float = setting(30.0, "reconnect delays double up to this",
                                   check=at_least(0.01))
    size: list[int] | None = setting(None, "v4l2/csi capture size [width, height]",
                                     check=_check_size)
    decoder: Literal["auto", "ffmpeg", "nvv4l2decoder"] = setting(
        "auto", "rtsp:// and file:// decoding: auto = the Jetson's hardware decoder "
        "(nvv4l2decoder through GStreamer) where it can run, else FFmpeg on the CPU")
    codec: Literal["auto", "h264", "h265"] = setting(
        "auto", "the hardware decoder's codec: auto = read from a file, H.264 for rtsp://")
    payload: Literal["json", "raw"] = setting(
        "json", "mqtt:// sensors: JSON arrays, or raw little-endian tensors")
    log_results: bool = setting(False, "log one line per result (the demo shows them); a "
                                       "detect stream with events and no per-frame results: "
                                       "one per object that appears or ends")
    secondary: list[SecondaryConfig] = setting(
        factory=list, help="models run on crops of this detect stream's detections")
    # Events (edged/events/): what a detect stream's detections become.
    track: TrackConfig = setting(factory=TrackConfig, help="tracking: ids across frames")
    labels: list[str] = setting(factory=list, help="only detections with these labels become "
                                                   "objects; empty = every label")
    min_score: float = setting(0.0, "detections scoring below this are ignored by tracking",
                               check=between(0, 1))
    zones: list[ZoneConfig] = setting(factory=list, help="polygons objects are in or not")
    lines: list[LineConfig] = setting(factory=list, help="lines whose crossings are counted")
    snapshots: SnapshotsConfig = setting(factory=SnapshotsConfig,
                                         help="each object's best frame as a JPEG")
    publish: PublishConfig = setting(factory=PublishConfig, help="what the stream publishes")


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
    trusted_keys: list[Path] = setting(factory=list, help="Ed25519 public keys (PEM)")
    keep_versions: int = setting(3, "versions kept on disk per model", check=at_least(1))
    allow_unsigned: bool = setting(False, "accept manifests without a signature")
    max_artifact_mb: int = setting(512, "largest artifact (and unpacked bundle) accepted",
                                   check=at_least(1))
    ca_file: Path | None = setting(None, "CA bundle for https:// artifacts; null = the system's")
    chunk_timeout_s: float = setting(120.0, "inline (MQTT) artifacts: wait this long for all "
                                            "chunks", check=at_least(1))
    download_timeout_s: float | None = setting(
        None, "one artifact download, retries included, must finish within this many seconds; "
              "null = 300 s plus the time the artifact takes at 32 KiB/s (a trickling server "
              "must not hold its download place for good)", check=_positive_or_null)
    max_parallel_downloads: int = setting(
        4, "updates of different models download side by side, this many at once (more wait "
           "for a place); verifying, installing and warming run one update at a time",
        check=between(1, 64))
    staging_mb: int = setting(1024, "staging disk that downloads in progress may hold "
                                    "together, from their first byte until installed; an "
                                    "update that does not fit beside them waits",
                              check=at_least(1))
    download_rate_kbps: int | None = setting(None, "all downloads together read at most this "
                                                   "many KiB/s; null = as fast as the link",
                                             check=_positive_or_null)
    groups: list[str] = setting(factory=list, help="fleet groups this device takes updates "
                                                   "for: <fleet_prefix>/groups/<g>/ota/<model>",
                                check=_check_names)
    shadow: ShadowConfig = setting(factory=ShadowConfig, help="what a shadow rollout may cost")


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


@dataclass(frozen=True)
class DaemonConfig:
    device_id: str = setting("edge-01", "this device's id (in MQTT topics)", check=_check_name)
    models_dir: Path = setting(Path("/var/lib/edged/models"), "the model repository")
    cache: CacheConfig = setting(factory=CacheConfig, help="warm model cache")
    backends: BackendsConfig = setting(factory=BackendsConfig, help="backend options")
    api: ApiConfig = setting(factory=ApiConfig, help="local socket API")
    mqtt: MqttConfig = setting(factory=MqttConfig, help="MQTT link")
    streams: list[StreamConfig] = setting(factory=list, help="camera and sensor streams")
    ota: OtaConfig = setting(factory=OtaConfig, help="over-the-air model updates")
    logging: LoggingConfig = setting(factory=LoggingConfig, help="logging")
    health: HealthConfig = setting(factory=HealthConfig, help="progress checks and watchdog")

    @property
    def mqtt_prefix(self) -> str:
        return self.mqtt.prefix or f"edged/{self.device_id}"


def check_streams(parsed: Parsed[DaemonConfig]) -> list[ConfigIssue]:
    """Stream names are unique, each source has a scheme edged can read, and zone and line
    names are unique within their stream."""
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
    return issues


def check_cache(parsed: Parsed[DaemonConfig]) -> list[ConfigIssue]:
    """Model names in preload/pinned are plain names (the repository rejects the rest anyway)."""
    issues = []
    for key in ("preload", "pinned"):
        names = getattr(parsed.value.cache, key)
        for i, name in enumerate([] if names == "all" else names):
            message = _check_name(name)
            if message:
                issues.append(parsed.issue(f"cache.{key}[{i}]", message))
    return issues


CHECKS = (check_streams, check_cache)


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
    if http is not None and (message := _check_loopback(http)):
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
