"""A demuxing reader on PyAV (whose wheels bundle FFmpeg) for rtsp:// (TCP), http(s):// and
files: one connection gives both the camera's compressed packets (handed to a `PacketSink`,
for recording) and the decoded frames (BGR, for the models), each packet decoded once. OpenCV's
`VideoCapture` never hands out the packets, so a stream that records clips reads through here.

It runs under the same state machine, watchdog, backoff and frame queue as every source
(`base.Source`). A packet FFmpeg flags as corrupt, or one the decoder refuses, is skipped
(neither decoded nor recorded) and counted as rejected. Packets carry the wall-clock time their
timestamp stands for (`Packet.wall`), and frames are stamped on that same clock, so an event's
time and a clip's packets agree to the frame.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np

from edged.sources.base import Source, SourceError, SourceUnavailable
from edged.sources.packets import Packet, PacketSink, StreamFormat, WallClock
from edged.sources.paramsets import parameter_sets, probed_format

logger = logging.getLogger(__name__)

PYAV_FIX = "the pyav reader needs PyAV: pip install 'edged[video]' (or pip install av)"
FUTURE_S = 0.25  # a timestamp mapping this far ahead of the wall clock re-anchors the map
PAST_S = 60.0  # ... and one this far behind it (the camera's clock was reset)
RECORDED_CODECS = ("h264", "hevc")


def have_pyav() -> bool:
    try:
        import av  # noqa: F401
    except ImportError:
        return False
    return True


def stream_format(stream: Any) -> StreamFormat:
    """The connection's format, with a template stream that outlives the connection: a copy
    of its codec parameters in an output container of its own that is never written."""
    import av

    holder = av.open(io.BytesIO(), "w", format="matroska")
    template = holder.add_stream_from_template(stream)
    ctx = stream.codec_context
    return StreamFormat(ctx.name, int(ctx.width), int(ctx.height), Fraction(stream.time_base),
                        bytes(ctx.extradata or b""), template)


class _Unit:
    """Packets that share a timestamp (RTP hands parameter sets apart from the picture they
    precede) gathered into one access unit; a packet without a timestamp joins the next."""

    __slots__ = ("data", "dts", "duration", "keyframe", "pts")

    def __init__(self, data: bytes, pts: int | None, dts: int | None, duration: int,
                 keyframe: bool) -> None:
        self.data, self.pts, self.dts = data, pts, dts
        self.duration, self.keyframe = duration, keyframe

    def joins(self, pts: int | None, dts: int | None) -> bool:
        return self.pts is None or pts is None or (dts is not None and dts == self.dts)


class DemuxSource(Source):
    """`rtsp://` (TCP), `http(s)://` and `file://` through PyAV. Files play at their own rate,
    like the camera that recorded them."""

    kind = "camera"

    def __init__(self, *args: Any, loop: bool = False, sink: PacketSink | None = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop = loop
        self.sink = sink
        self.scheme = self.uri.partition("://")[0]
        self.finished = False
        self.formats = 0  # formats seen (each one a new segment for recordings)
        self._container: Any = None
        self._video: Any = None
        self._packets: Iterator[Any] | None = None
        self._format: StreamFormat | None = None
        self._unit: _Unit | None = None
        self._frames: deque[tuple[np.ndarray, float]] = deque()
        self._wall = 0.0
        self._clock: WallClock | None = None  # this connection's timestamps to wall time
        self._eof = False
        self._threads = 1
        self._last_dts: int | None = None
        self._sets: bytes | None = None  # the parameter sets in band last seen
        self._to_bgr: Any = None  # one swscale context for every frame (see _decoded)

    # -- the device --------------------------------------------------------------------------
    def target(self) -> tuple[str, dict[str, str]]:
        if self.scheme == "file":
            path = Path(unquote(urlsplit(self.uri).path))
            if not path.is_file():
                raise SourceError(f"{path} is not a readable file")
            return str(path), {}
        if self.scheme == "rtsp":
            # TCP: UDP RTSP loses packets (grey smears) on the lossy links cameras sit on.
            return self.uri, {"rtsp_transport": "tcp"}
        if self.scheme in ("http", "https"):
            return self.uri, {}
        raise SourceUnavailable(f"{self.uri}: the pyav reader reads rtsp://, http(s):// and "
                                "file:// sources")

    def open(self) -> None:
        try:
            import av
        except ImportError as exc:
            raise SourceUnavailable(f"{self.uri}: {PYAV_FIX}") from exc
        target, options = self.target()
        try:
            container = av.open(target, options=options,
                                timeout=(self.watchdog_s, self.watchdog_s))
        except (av.FFmpegError, OSError) as exc:
            raise SourceError(f"{self.uri}: cannot open: {exc}") from exc
        if not container.streams.video:
            container.close()
            raise SourceError(f"{self.uri}: has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        self._threads = max(1, int(stream.codec_context.thread_count or os.cpu_count() or 1))
        if self._to_bgr is None:
            from av.video.reformatter import VideoReformatter

            self._to_bgr = VideoReformatter()
        self._container, self._video = container, stream
        self._packets = container.demux(stream)
        self._unit, self._clock, self._eof, self._last_dts = None, None, False, None
        self._sets = None
        self._frames.clear()
        self._connected_format()
        if self.scheme == "file":
            rate = stream.average_rate or stream.guessed_rate
            fps = float(rate) if rate else 0.0
            self._frame_interval_s = 1.0 / fps if 0 < fps < 1000 else 0.0
            self._next_due = self.clock()

    def read(self) -> np.ndarray | None:
        while not self._frames:
            if self._stop.is_set() or not self._next_packet():
                return None
        data, self._wall = self._frames.popleft()
        if self._frame_interval_s:
            self._pace()
        return data

    def close(self) -> None:
        self._flush_unit()
        if self.sink is not None:
            self.sink.discontinuity("the connection closed")
        if self._container is not None:
            self._container.close()
            self._container = self._video = self._packets = None

    def frame_wall(self) -> float:
        return self._wall

    def _ended(self) -> bool:
        if self.finished:
            self._stop.set()
            logger.info("stream %s: %s has ended", self.name, self.uri)
        return self._eof

    # -- packets -----------------------------------------------------------------------------
    def _next_packet(self) -> bool:
        """Demux one packet, record and decode it; False when the stream ended or failed."""
        import av

        assert self._packets is not None
        try:
            packet = next(self._packets)
        except StopIteration:
            return self._at_end()
        except (av.FFmpegError, OSError) as exc:
            self._error(f"reading failed: {exc}")
            logger.warning("stream %s: reading failed: %s", self.name, exc,
                           extra={"stream": self.name, "code": "demux_failed"})
            self._eof = True
            return False
        if packet.size == 0:  # the flush packet at the end: the frames the decoder holds
            try:
                for frame in packet.decode():
                    self._decoded(frame)
            except av.FFmpegError as exc:
                self.reject(f"the decoder's last frames were lost: {exc}")
            return True
        if packet.is_corrupt:
            self.reject(f"a corrupt packet ({packet.size} bytes) was skipped")
            return True
        self._record(packet)
        try:
            frames = packet.decode()
        except av.FFmpegError as exc:
            self.reject(f"the decoder refused a packet: {exc}")
            return True
        for frame in frames:
            self._decoded(frame)
        return True

    def _decoded(self, frame: Any) -> None:
        wall = self._to_wall(frame.pts) if frame.pts is not None else time.time()
        # One reformatter kept for the reader: `frame.to_ndarray(format="bgr24")` made one per
        # frame, and with it a swscale context (~10% of the reader's CPU, the bench found); the
        # same conversion with the same defaults, bit for bit (tests/integration/
        # test_reader_bgr.py).
        self._frames.append((self._to_bgr.reformat(frame, format="bgr24").to_ndarray(), wall))

    def _at_end(self) -> bool:
        if self.scheme == "file" and self.loop and self._container is not None:
            self._flush_unit()
            if self.sink is not None:
                self.sink.discontinuity("the file starts again")
            self._container.seek(0)
            self._packets = self._container.demux(self._video)
            self._clock = self._last_dts = None
            return True
        if self.scheme == "file":
            self.finished = True
        self._eof = True
        return False

    def _record(self, packet: Any) -> None:
        if self.sink is None or self._format is None:
            return
        pts, dts = packet.pts, packet.dts
        unit = self._unit
        if unit is not None and unit.joins(pts, dts):
            unit.data += bytes(packet)
            unit.keyframe = unit.keyframe or packet.is_keyframe
            if unit.pts is None:
                unit.pts, unit.dts = pts, dts
            return
        self._flush_unit()
        self._unit = _Unit(bytes(packet), pts, dts, int(packet.duration or 0),
                           bool(packet.is_keyframe))

    def _flush_unit(self) -> None:
        unit, self._unit = self._unit, None
        if unit is None or unit.pts is None or self.sink is None or self._format is None:
            return
        if unit.keyframe:
            self._check_parameter_sets(unit.data)
            if self._format is None:
                return
        dts = unit.dts if unit.dts is not None else unit.pts
        if self._last_dts is not None and dts < self._last_dts:
            self.sink.discontinuity("the camera's timestamps went back")
            self._clock = None
        self._last_dts = dts
        self._to_wall(unit.pts)  # (the clock moves, or starts anew, before the packet takes it)
        assert self._clock is not None
        self.sink.packet(Packet(unit.data, unit.pts, dts, unit.duration, unit.keyframe,
                                self._clock, self._format))

    def _check_parameter_sets(self, data: bytes) -> None:
        """New parameter sets with a keyframe (another resolution, profile or codec settings):
        a new format from this packet on, so what is being written ends before it."""
        assert self._format is not None
        sets = parameter_sets(data, self._format.codec)
        if sets is None or sets == self._sets:
            return
        first, self._sets = self._sets is None, sets
        if first:
            return
        fmt = probed_format(data, self._format.codec, self._format.time_base, stream_format)
        if fmt is None:
            self.reject("a keyframe with parameter sets FFmpeg cannot read was skipped")
            return
        assert self.sink is not None
        self.sink.discontinuity(f"new parameter sets ({fmt.width}x{fmt.height})")
        self._format = fmt
        self.formats += 1
        logger.info("stream %s: new parameter sets: %s %dx%d from here", self.name, fmt.codec,
                    fmt.width, fmt.height, extra={"stream": self.name})

    def _connected_format(self) -> None:
        """The format of a new connection (its packets follow a discontinuity: close() said
        so); the same camera again keeps its format object."""
        assert self._video is not None
        fmt = stream_format(self._video)
        if self._format is not None and fmt.key == self._format.key:
            return
        self.formats += 1
        if fmt.codec not in RECORDED_CODECS:
            if self.sink is not None:
                logger.warning("stream %s: %s video is not recorded (only H.264 and H.265)",
                               self.name, fmt.codec, extra={"stream": self.name})
            self._format = None
            return
        self._format = fmt

    def _to_wall(self, pts: int) -> float:
        """The wall-clock time a timestamp stands for. Anchored at the first packet, and moved
        whenever a timestamp would map into the future (packets the demuxer buffered while it
        probed the stream come in a burst: the anchor settles on the earliest arrival, the best
        guess of capture time: every packet of the connection moves with it), or far into the
        past (the camera's clock was reset: a new clock)."""
        assert self._video is not None
        now = time.time()
        clock = self._clock
        if clock is None:
            clock = self._clock = WallClock(pts, now, float(self._video.time_base))
            return now
        wall = clock.wall(pts)
        if wall > now + self._ahead_s():
            clock.move(pts, now)
            return now
        if wall < now - PAST_S:
            self._clock = WallClock(pts, now, float(self._video.time_base))
            return now
        return wall

    def _ahead_s(self) -> float:
        """How far ahead of the wall clock a packet may map: a paced file's packets are read
        ahead of their frames by the decoder's delay (a frame a thread)."""
        return FUTURE_S + (self._threads + 2) * self._frame_interval_s
