"""Stream sources chosen by URI scheme: cameras (OpenCV) and sensors (MQTT topics)."""

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

if TYPE_CHECKING:
    from edged.sources.sensor import Subscribe

CAMERA_SCHEMES = ("file", "rtsp", "http", "https", "v4l2", "csi", "gst")

__all__ = [
    "Backoff",
    "Frame",
    "FrameQueue",
    "SensorLink",
    "Source",
    "SourceError",
    "SourceState",
    "SourceStats",
    "SourceUnavailable",
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


@dataclass(frozen=True)
class SensorLink:
    """What a sensor stream needs besides its config: the MQTT link's (un)subscribe (None while
    MQTT is off) and the shape and dtype of one sample of the model's input."""

    subscribe: Subscribe | None
    unsubscribe: Callable[[str], None] | None
    shape: tuple[int, ...]
    dtype: np.dtype


def open_source(cfg: SourceSettings, sensor: SensorLink) -> Source:
    """The source for the stream's URI scheme, with its own bounded frame queue; not yet
    started. Raises SourceUnavailable for a scheme no source reads."""
    queue = FrameQueue(cfg.queue, cfg.backpressure)
    backoff = Backoff(cfg.backoff_initial_s, cfg.backoff_max_s)
    scheme = cfg.source.partition("://")[0]
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
