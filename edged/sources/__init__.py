"""Stream sources chosen by URI scheme: cameras (OpenCV, or PyAV's demuxing reader where the
camera's packets are recorded) and sensors (MQTT topics)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np

from edged.sources.base import (
    Backoff,
    Backpressure,
    Frame,
    FrameQueue,
    Source,
    SourceError,
    SourceState,
    SourceStats,
    SourceUnavailable,
    worth_logging,
)
from edged.sources.packets import Packet, PacketSink, StreamFormat

if TYPE_CHECKING:
    from edged.sources.sensor import Subscribe

CAMERA_SCHEMES = ("file", "rtsp", "http", "https", "v4l2", "csi", "gst")
DEMUX_SCHEMES = ("file", "rtsp", "http", "https")  # what the pyav reader reads
Reader = Literal["auto", "opencv", "pyav"]

__all__ = [
    "Backoff",
    "Frame",
    "FrameQueue",
    "Packet",
    "PacketSink",
    "SensorLink",
    "Source",
    "SourceError",
    "SourceState",
    "SourceStats",
    "SourceUnavailable",
    "StreamFormat",
    "open_source",
    "worth_logging",
]


class SourceSettings(Protocol):
    """What a source is opened with: a stream's settings (`edged.streams.config.StreamConfig`),
    read here without importing the room above."""

    @property
    def name(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def fps(self) -> float | None: ...
    @property
    def queue(self) -> int: ...
    @property
    def backpressure(self) -> Backpressure: ...
    @property
    def loop(self) -> bool: ...
    @property
    def watchdog_s(self) -> float: ...
    @property
    def backoff_initial_s(self) -> float: ...
    @property
    def backoff_max_s(self) -> float: ...
    @property
    def size(self) -> list[int] | None: ...
    @property
    def decoder(self) -> Literal["auto", "ffmpeg", "nvv4l2decoder"]: ...
    @property
    def codec(self) -> Literal["auto", "h264", "h265"]: ...
    @property
    def payload(self) -> Literal["json", "raw"]: ...
    @property
    def reader(self) -> Reader: ...


@dataclass(frozen=True)
class SensorLink:
    """What a sensor stream needs besides its config: the MQTT link's (un)subscribe (None while
    MQTT is off) and the shape and dtype of one sample of the model's input."""

    subscribe: Subscribe | None
    unsubscribe: Callable[[str], None] | None
    shape: tuple[int, ...]
    dtype: np.dtype


def chosen_reader(cfg: SourceSettings, *, recording: bool) -> Literal["opencv", "pyav"]:
    """Which reader a camera stream gets: `reader:` when forced; on auto, PyAV's demuxing
    reader where the stream records its packets and PyAV can read the scheme, else OpenCV
    (V4L2, CSI and GStreamer pipelines, and the Jetson's hardware decoder, stay there)."""
    if cfg.reader != "auto":
        return cfg.reader
    scheme = cfg.source.partition("://")[0]
    if recording and scheme in DEMUX_SCHEMES and cfg.decoder != "nvv4l2decoder":
        return "pyav"
    return "opencv"


def open_source(cfg: SourceSettings, sensor: SensorLink,
                packets: PacketSink | None = None) -> Source:
    """The source for the stream's URI scheme, with its own bounded frame queue; not yet
    started. `packets`: who records the camera's packets (the demuxing reader is then the
    auto choice). Raises SourceUnavailable for a scheme no source reads."""
    queue = FrameQueue(cfg.queue, cfg.backpressure)
    backoff = Backoff(cfg.backoff_initial_s, cfg.backoff_max_s)
    scheme = cfg.source.partition("://")[0]
    if scheme in CAMERA_SCHEMES and chosen_reader(cfg, recording=packets is not None) == "pyav":
        from edged.sources.demux import DemuxSource

        if scheme not in DEMUX_SCHEMES:
            raise SourceUnavailable(f"{cfg.source}: the pyav reader reads "
                                    f"{', '.join(DEMUX_SCHEMES)}:// sources")
        return DemuxSource(cfg.name, cfg.source, queue, fps=cfg.fps, watchdog_s=cfg.watchdog_s,
                           backoff=backoff, loop=cfg.loop, sink=packets)
    if scheme in CAMERA_SCHEMES:
        from edged.sources.camera import CameraSource

        return CameraSource(cfg.name, cfg.source, queue, fps=cfg.fps, watchdog_s=cfg.watchdog_s,
                            backoff=backoff, loop=cfg.loop,
                            size=(cfg.size[0], cfg.size[1]) if cfg.size else None,
                            decoder=cfg.decoder, codec=cfg.codec)
    if scheme == "mqtt":
        from edged.sources.sensor import SensorSource

        return SensorSource(cfg.name, cfg.source, queue, fps=cfg.fps, watchdog_s=cfg.watchdog_s,
                            backoff=backoff, subscribe=sensor.subscribe,
                            unsubscribe=sensor.unsubscribe, shape=sensor.shape,
                            dtype=sensor.dtype, payload=cfg.payload)
    raise SourceUnavailable(f"{cfg.source}: unsupported scheme {scheme!r}")
