"""One MP4 file remuxed from a stream's packets (no re-encode): written as `<name>.mp4.part`,
with `movflags=+faststart` (the index at the front: a browser plays it before it has it all),
renamed to `<name>.mp4` once closed. Only closed files are ever served; a `.part` left by a
crash is dropped at start (`store.ClipStore`)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.sources.packets import Packet, StreamFormat

logger = logging.getLogger(__name__)

PART = ".part"


@dataclass(frozen=True)
class Written:
    path: Path
    start_wall: float  # the first packet's (a keyframe's) capture time
    end_wall: float  # the last packet's capture time plus its duration
    packets: int
    size: int
    error: str | None  # why writing stopped early (the file holds what came before)


class ClipWriter:
    """Packets in, one MP4 out. It starts at the first keyframe; timestamps are rebased so
    that picture shows at 0; a packet whose decode time does not advance is skipped."""

    def __init__(self, path: Path, fmt: StreamFormat) -> None:
        import av

        self.path = path
        self.fmt = fmt
        self.part = path.with_name(path.name + PART)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._out: Any = av.open(str(self.part), "w", format="mp4",
                                 options={"movflags": "+faststart"})
        self._stream = self._out.add_stream_from_template(fmt.template)
        self._base: int | None = None
        self._last_dts: int | None = None
        self.start_wall: float | None = None
        self.end_wall: float | None = None
        self.packets = 0
        self.error: str | None = None
        self._step = 0.0  # one frame's duration: the packets', or the shortest interval
        self._prev_wall: float | None = None
        self._max_wall: float | None = None

    def write(self, packet: Packet) -> bool:
        """Mux one packet; False once writing has failed (the disk is full: the file keeps
        what came before and is closed by `close`)."""
        import av

        if self.error is not None:
            return False
        if packet.fmt is not self.fmt and packet.fmt.key != self.fmt.key:
            return False
        if self._base is None:
            if not packet.keyframe:
                return True  # (a clip starts at a keyframe; until then nothing)
            self._base = packet.pts  # the first picture at 0 (decode times before it
            self.start_wall = packet.wall  # go negative: the muxer's edit list takes them)
        if self._last_dts is not None and packet.dts <= self._last_dts:
            return True
        out = av.Packet(packet.data)
        out.pts = packet.pts - self._base
        out.dts = packet.dts - self._base
        out.duration = packet.duration
        out.time_base = packet.fmt.time_base
        out.is_keyframe = packet.keyframe
        out.stream = self._stream
        try:
            self._out.mux(out)
        except (av.FFmpegError, OSError) as exc:
            self.error = f"writing {self.part.name} failed: {exc}"
            logger.warning("%s", self.error, extra={"code": "clip_write_failed"})
            return False
        self._last_dts = packet.dts
        self.packets += 1
        wall = packet.wall
        if packet.duration:
            self._step = float(packet.duration * packet.fmt.time_base)
        elif self._prev_wall is not None and wall != self._prev_wall:
            # (RTP gives no duration: a frame is the shortest step between two pictures;
            # with B-frames, decode order is not presentation order)
            gap = abs(wall - self._prev_wall)
            self._step = gap if self._step == 0.0 else min(self._step, gap)
        self._prev_wall = wall
        self._max_wall = wall if self._max_wall is None else max(self._max_wall, wall)
        self.end_wall = self._max_wall + self._step  # the last picture shown, and its frame
        return True

    def close(self) -> Written | None:
        """Finish the file (None: it holds no picture and is removed)."""
        import av

        try:
            self._out.close()
        except (av.FFmpegError, OSError) as exc:
            # (the index could not be written: the file is not playable, so it goes)
            logger.warning("closing %s failed: %s", self.part.name, exc,
                           extra={"code": "clip_write_failed"})
            self.packets = 0
        if self.packets == 0 or self.start_wall is None or self.end_wall is None:
            self.part.unlink(missing_ok=True)
            return None
        os.replace(self.part, self.path)
        return Written(self.path, self.start_wall, self.end_wall, self.packets,
                       self.path.stat().st_size, self.error)
