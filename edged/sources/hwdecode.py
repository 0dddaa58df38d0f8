"""Which decoder a camera stream uses. On a Jetson whose OpenCV has GStreamer, `rtsp://` and
H.264/H.265 `file://` sources decode on the hardware decoder (NVDEC through `nvv4l2decoder`,
then `nvvidconv` out of NVMM to BGRx, `videoconvert` to BGR for OpenCV) instead of on the CPU
through FFmpeg. Anything else, or a Jetson missing a plugin, stays on FFmpeg, and the log
says why once per stream.

What the machine offers is asked once per process through `DecodeProbe`, whose questions
(is this a Jetson, does OpenCV have GStreamer, is a GStreamer element installed, what codec is
in a file) tests answer themselves."""

from __future__ import annotations

import logging
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

DecoderName = Literal["auto", "ffmpeg", "nvv4l2decoder"]
Codec = Literal["auto", "h264", "h265"]
HW_ELEMENTS = ("nvv4l2decoder", "nvvidconv")
APPSINK = "appsink drop=true max-buffers=1 sync=false"
TO_BGR = ("nvvidconv ! video/x-raw, format=BGRx ! videoconvert ! video/x-raw, format=BGR ! "
          + APPSINK)
# FFmpeg's fourcc for each codec nvv4l2decoder is used for here (OpenCV's CAP_PROP_FOURCC).
FOURCCS = {"h264": {"avc1", "avc3", "h264", "x264", "davc"},
           "h265": {"hev1", "hvc1", "hevc", "h265", "x265"}}
# Demuxer by file suffix; raw elementary streams (.h264, .265) need none.
DEMUXERS = {".mp4": "qtdemux", ".mov": "qtdemux", ".m4v": "qtdemux", ".3gp": "qtdemux",
            ".mkv": "matroskademux", ".webm": "matroskademux", ".ts": "tsdemux",
            ".m2ts": "tsdemux", ".flv": "flvdemux", ".avi": "avidemux",
            ".h264": "", ".264": "", ".h265": "", ".265": "", ".hevc": ""}


@dataclass(frozen=True)
class DecodePlan:
    """What to open: `decoder` is what `edged status` shows ("nvv4l2decoder" or "ffmpeg");
    `pipeline` is the GStreamer description for the hardware path (None: FFmpeg opens the
    URI or file itself); `note` says why FFmpeg was chosen where hardware was possible."""

    decoder: str
    pipeline: str | None = None
    note: str | None = None


def gst_quote(text: str) -> str:
    """A property value for gst-launch syntax: quoted, with its quotes and backslashes
    escaped (RTSP URLs carry credentials with any character)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rtsp_pipeline(uri: str, codec: str = "h264", latency_ms: int = 200) -> str:
    """RTSP over TCP (UDP loses packets on the links cameras sit on), depayloaded and parsed
    for the hardware decoder."""
    depay, parse = _codec_elements(codec)
    return (f"rtspsrc location={gst_quote(uri)} protocols=tcp latency={latency_ms} ! "
            f"application/x-rtp, media=video ! {depay} ! {parse} ! nvv4l2decoder ! {TO_BGR}")


def file_pipeline(path: Path, codec: str) -> str:
    """A file's video track demuxed (by its suffix) and parsed for the hardware decoder."""
    demux = DEMUXERS.get(path.suffix.lower(), "qtdemux")
    _depay, parse = _codec_elements(codec)
    head = f"filesrc location={gst_quote(str(path))} ! "
    if demux:
        head += f"{demux} ! queue ! "
    return f"{head}{parse} ! nvv4l2decoder ! {TO_BGR}"


def _codec_elements(codec: str) -> tuple[str, str]:
    if codec == "h265":
        return "rtph265depay", "h265parse"
    return "rtph264depay", "h264parse"


class DecodeProbe:
    """What this machine can decode with, each question asked once (a second stream or a
    reconnect costs nothing). Every question can be answered by the caller instead."""

    def __init__(self, *, is_jetson: Callable[[], bool] | None = None,
                 opencv_gstreamer: Callable[[], bool] | None = None,
                 has_element: Callable[[str], bool] | None = None,
                 codec_of: Callable[[Path], str | None] | None = None) -> None:
        self._is_jetson = is_jetson or _is_jetson
        self._opencv_gstreamer = opencv_gstreamer or opencv_has_gstreamer
        self._has_element = has_element or gst_has_element
        self.codec_of = codec_of or ffmpeg_codec
        self._lock = threading.Lock()
        self._answers: dict[str, bool] = {}

    def _once(self, key: str, ask: Callable[[], bool]) -> bool:
        with self._lock:
            if key not in self._answers:
                try:
                    self._answers[key] = bool(ask())
                except Exception as exc:  # a broken GStreamer install: no hardware path
                    logger.info("decoder probe %s failed: %s", key, exc)
                    self._answers[key] = False
            return self._answers[key]

    def _has(self, element: str) -> bool:
        return self._once(element, lambda: self._has_element(element))

    def hardware_missing(self) -> str | None:
        """None when the nvv4l2decoder path can run here, else why not (one line)."""
        if not self._once("jetson", self._is_jetson):
            return "not a Jetson"
        if not self._once("opencv", self._opencv_gstreamer):
            return ("this OpenCV has no GStreamer (use JetPack's python3-opencv, not an "
                    "opencv-python wheel)")
        missing = [e for e in HW_ELEMENTS if not self._has(e)]
        if missing:
            return (f"GStreamer plugin(s) {', '.join(missing)} not installed (JetPack's "
                    "nvidia-l4t-gstreamer package)")
        return None


def plan(scheme: str, uri: str, path: Path | None, probe: DecodeProbe, *,
         decoder: DecoderName = "auto", codec: Codec = "auto") -> DecodePlan:
    """How to decode an `rtsp://` URI or a `file://` at `path`. `decoder: ffmpeg` keeps the
    CPU path; `nvv4l2decoder` asks for hardware (FFmpeg still, with the reason, where it
    cannot run); `auto` takes hardware wherever it can."""
    if decoder == "ffmpeg":
        return DecodePlan("ffmpeg")
    missing = probe.hardware_missing()
    if missing is not None:
        # Off a Jetson FFmpeg is simply the decoder; on one, the user expected hardware.
        quiet = decoder == "auto" and missing == "not a Jetson"
        return DecodePlan("ffmpeg", note=None if quiet else f"no hardware decoding: {missing}")
    if scheme == "rtsp":
        # An RTSP camera's codec is known only once connected: H.264 unless the config says
        # h265 (a wrong guess fails to open and falls back to FFmpeg with a log line).
        return DecodePlan("nvv4l2decoder", rtsp_pipeline(uri, "h265" if codec == "h265"
                                                         else "h264"))
    if scheme == "file" and path is not None:
        found = codec if codec != "auto" else probe.codec_of(path)
        if found not in FOURCCS:
            return DecodePlan("ffmpeg", note=f"{path.name} is {found or 'of unknown codec'}, "
                                             "not H.264/H.265: decoded by FFmpeg")
        return DecodePlan("nvv4l2decoder", file_pipeline(path, found))
    return DecodePlan("ffmpeg")


# -- the machine's answers ---------------------------------------------------------------------
def _is_jetson() -> bool:
    from edged.hardware import host

    return host.TEGRA.is_jetson()


def opencv_has_gstreamer() -> bool:
    import cv2

    try:
        return bool(cv2.videoio_registry.hasBackend(cv2.CAP_GSTREAMER))
    except AttributeError:  # very old OpenCV: only its build report says
        return any(line.strip().startswith("GStreamer:") and "YES" in line
                   for line in cv2.getBuildInformation().splitlines())


def gst_has_element(name: str) -> bool:
    """Is a GStreamer element installed: the registry through PyGObject when it is there,
    else `gst-inspect-1.0 --exists` (exit 0 when the element exists)."""
    try:
        import gi

        gi.require_version("Gst", "1.0")
        from gi.repository import Gst
    except (ImportError, ValueError):
        inspect = shutil.which("gst-inspect-1.0")
        if inspect is None:
            return False
        try:
            done = subprocess.run([inspect, "--exists", name], capture_output=True,
                                  timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0
    Gst.init(None)
    return Gst.ElementFactory.find(name) is not None


def ffmpeg_codec(path: Path) -> str | None:
    """The codec of a file's video as FFmpeg reads it ("h264", "h265", another fourcc), or
    None when FFmpeg cannot open it."""
    import cv2

    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    try:
        if not capture.isOpened():
            return None
        code = int(capture.get(cv2.CAP_PROP_FOURCC))
    finally:
        capture.release()
    fourcc = "".join(chr((code >> 8 * i) & 0xFF) for i in range(4)).strip("\0 ").lower()
    for codec, names in FOURCCS.items():
        if fourcc in names:
            return codec
    return fourcc or None
