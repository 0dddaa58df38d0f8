"""Stream sources chosen by URI scheme: cameras (OpenCV) and sensors (MQTT topics)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edged.sources.base import (
    Backoff,
    Frame,
    FrameQueue,
    Source,
    SourceError,
    SourceState,
    SourceUnavailable,
    worth_logging,
)

CAMERA_SCHEMES = ("file", "rtsp", "http", "https", "v4l2", "csi", "gst")

__all__ = [
    "Backoff",
    "Frame",
    "FrameQueue",
    "Source",
    "SourceError",
    "SourceState",
    "SourceUnavailable",
    "open_source",
    "worth_logging",
]


def open_source(name: str, uri: str, queue: FrameQueue, common: Mapping[str, Any],
                camera: Mapping[str, Any], sensor: Mapping[str, Any]) -> Source:
    """The source for `uri`'s scheme, not yet started. `common` goes to every source,
    `camera`/`sensor` only to their kind."""
    scheme = uri.partition("://")[0]
    if scheme in CAMERA_SCHEMES:
        from edged.sources.camera import CameraSource

        return CameraSource(name, uri, queue, **common, **camera)
    if scheme == "mqtt":
        from edged.sources.sensor import SensorSource

        return SensorSource(name, uri, queue, **common, **sensor)
    raise SourceUnavailable(f"{uri}: unsupported scheme {scheme!r}")
