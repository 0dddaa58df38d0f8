"""Cameras through OpenCV: files, RTSP and HTTP(S) MJPEG (FFmpeg, or on a Jetson the hardware
decoder through GStreamer: edged/sources/hwdecode.py), V4L2 devices, and Jetson CSI cameras
or any GStreamer pipeline (OpenCV built with GStreamer, as JetPack's is)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np

from edged.sources import hwdecode
from edged.sources.base import Source, SourceError, SourceStats, SourceUnavailable

logger = logging.getLogger(__name__)

APPSINK = hwdecode.APPSINK
_PROBE = hwdecode.DecodeProbe()  # what this machine decodes with, asked once per process
GSTREAMER_FIX = ("this OpenCV has no GStreamer backend (opencv-python wheels from PyPI do not); "
                 "on Jetson use JetPack's OpenCV (apt install python3-opencv) and remove "
                 "opencv-python* from edged's environment")


def csi_pipeline(sensor_id: int, width: int = 1280, height: int = 720, fps: int = 30) -> str:
    """Jetson CSI camera: Argus capture into NVMM, converted to BGR for OpenCV."""
    return (f"nvarguscamerasrc sensor-id={sensor_id} ! "
            f"video/x-raw(memory:NVMM), width={width}, height={height}, "
            f"framerate={fps}/1, format=NV12 ! "
            "nvvidconv ! video/x-raw, format=BGRx ! "
            f"videoconvert ! video/x-raw, format=BGR ! {APPSINK}")


def gst_pipeline(description: str) -> str:
    """A user's pipeline, ending in an appsink that never queues old frames."""
    description = description.strip()
    if "appsink" not in description:
        description = f"{description} ! videoconvert ! video/x-raw, format=BGR ! {APPSINK}"
    return description


def has_gstreamer() -> bool:
    import cv2

    try:
        return bool(cv2.videoio_registry.hasBackend(cv2.CAP_GSTREAMER))
    except AttributeError:  # very old OpenCV
        return "GStreamer:                   YES" in cv2.getBuildInformation()


@dataclass(frozen=True)
class CameraStats(SourceStats):
    """A camera's counters and the decoder reading it (None: not yet known)."""

    decoder: str | None = None


class CameraSource(Source):
    """`file://`, `rtsp://`, `http(s)://`, `v4l2://`, `csi://`, `gst://` through
    cv2.VideoCapture. Files play at their own frame rate, like the camera that recorded them."""

    kind = "camera"

    def __init__(self, *args: Any, loop: bool = False,
                 size: tuple[int, int] | None = None, decoder: hwdecode.DecoderName = "auto",
                 codec: hwdecode.Codec = "auto", probe: hwdecode.DecodeProbe | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop = loop
        self.size = size
        self.scheme = self.uri.partition("://")[0]
        self.decoder = decoder
        self.codec = codec
        self._probe = probe or _PROBE
        self._plan: hwdecode.DecodePlan | None = None  # decided at the first open, kept
        self._capture: Any = None
        self.finished = False  # a file that ended without loop: nothing more will come

    def target(self) -> tuple[str | int, int]:
        """What to hand cv2.VideoCapture, and the API preference."""
        import cv2

        rest = self.uri.partition("://")[2]
        if self.scheme == "file":
            path = Path(unquote(urlsplit(self.uri).path))
            if not path.is_file():
                raise SourceError(f"{path} is not a readable file")
            plan = self.decode_plan(path)
            if plan.pipeline is not None:
                return plan.pipeline, cv2.CAP_GSTREAMER
            return str(path), cv2.CAP_ANY
        if self.scheme == "rtsp":
            plan = self.decode_plan(None)
            if plan.pipeline is not None:
                return plan.pipeline, cv2.CAP_GSTREAMER
            return self.uri, cv2.CAP_FFMPEG
        if self.scheme in ("http", "https"):
            return self.uri, cv2.CAP_FFMPEG
        if self.scheme == "v4l2":
            device = "/" + rest.lstrip("/")
            return (int(device[len("/dev/video"):]) if device[len("/dev/video"):].isdigit()
                    else device), cv2.CAP_V4L2
        if self.scheme in ("csi", "gst"):
            if not has_gstreamer():
                raise SourceUnavailable(f"{self.uri}: {GSTREAMER_FIX}")
            if self.scheme == "csi":
                if not rest.isdigit():
                    raise SourceUnavailable(f"{self.uri}: expected csi://<sensor id>")
                width, height = self.size or (1280, 720)
                return csi_pipeline(int(rest), width, height), cv2.CAP_GSTREAMER
            return gst_pipeline(unquote(rest)), cv2.CAP_GSTREAMER
        raise SourceUnavailable(f"{self.uri}: not a camera URI")

    def decode_plan(self, path: Path | None) -> hwdecode.DecodePlan:
        """The stream's decoder, chosen at its first open and kept across reconnects; a
        reason for FFmpeg where hardware was possible is logged once."""
        if self._plan is None:
            self._plan = hwdecode.plan(self.scheme, self.uri, path, self._probe,
                                       decoder=self.decoder, codec=self.codec)
            if self._plan.note:
                logger.info("stream %s: %s", self.name, self._plan.note,
                            extra={"stream": self.name})
            else:
                logger.info("stream %s: decoding with %s", self.name, self._plan.decoder,
                            extra={"stream": self.name})
        return self._plan

    def _decoder_shown(self) -> str | None:
        if self._plan is not None:
            return self._plan.decoder
        return {"file": None, "rtsp": None, "http": "ffmpeg", "https": "ffmpeg",
                "v4l2": "v4l2", "csi": "nvarguscamerasrc", "gst": "gstreamer"}.get(self.scheme)

    def open(self) -> None:
        import cv2

        target, api = self.target()
        if self.scheme == "rtsp":
            # TCP: UDP RTSP loses packets (grey smears) on the lossy links cameras sit on.
            os.environ.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", "rtsp_transport;tcp")
        capture = self._capture_for(target, api)
        if not capture.isOpened() and self._plan is not None and self._plan.pipeline:
            # The hardware pipeline would not start (a plugin that fails to load, an RTSP
            # camera sending H.265 where H.264 was assumed): FFmpeg from now on, said once.
            capture.release()
            logger.warning("stream %s: the nvv4l2decoder pipeline did not open; decoding with "
                           "FFmpeg from now on (for an H.265 camera set codec: h265)",
                           self.name, extra={"stream": self.name, "code": "decoder_fallback"})
            self._plan = hwdecode.DecodePlan("ffmpeg", note="the hardware pipeline did not "
                                                            "open")
            target, api = self.target()
            capture = self._capture_for(target, api)
        if not capture.isOpened():
            capture.release()
            raise SourceError(f"{self.uri}: cannot open")
        if self.scheme == "v4l2" and self.size:
            capture.set(cv2.CAP_PROP_FRAME_WIDTH, self.size[0])
            capture.set(cv2.CAP_PROP_FRAME_HEIGHT, self.size[1])
        if self.scheme == "file":
            fps = capture.get(cv2.CAP_PROP_FPS)
            self._frame_interval_s = 1.0 / fps if 0 < fps < 1000 else 0.0
            self._next_due = self.clock()
        self._capture = capture

    def _capture_for(self, target: str | int, api: int) -> Any:
        import cv2

        timeout_ms = int(self.watchdog_s * 1000)
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout_ms,
                  cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms]
        return cv2.VideoCapture(target, api, params)

    def read(self) -> np.ndarray | None:
        ok, frame = self._capture.read()
        if not ok and self.scheme == "file" and self.loop:
            import cv2

            if self._plan is not None and self._plan.pipeline:  # a pipeline at EOS: restart it
                self._capture.release()
                self._capture = self._capture_for(*self.target())
            else:
                self._capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
            ok, frame = self._capture.read()
        if not ok:
            if self.scheme == "file":
                self.finished = True
            return None
        if self._frame_interval_s:
            self._pace()
        return np.asarray(frame)

    def _ended(self) -> bool:
        if self.finished:
            self._stop.set()
            logger.info("stream %s: %s has ended", self.name, self.uri)
        return True

    def read_stats(self) -> CameraStats:
        return CameraStats(**vars(super().read_stats()), decoder=self._decoder_shown())

    def close(self) -> None:
        if self._capture is not None:
            self._capture.release()
            self._capture = None
