"""One MP4 file remuxed from a stream's packets (no re-encode): written as `<name>.mp4.part`,
renamed to `<name>.mp4` once closed. Only closed files are ever served; a `.part` left by a
crash is dropped at start (`store.ClipStore`).

The file is a fragmented MP4 (the header, a `moov` without samples, then a `moof`+`mdat`
fragment per group of pictures, and a fragment index at the end): every fragment written is
playable without an index written last, so a write that fails (the disk filled) leaves a
valid file of every whole fragment before it (`fragments.cut_to_whole`), where `+faststart`
left nothing playable (its index is written, and the file rewritten, when it closes)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from edged.recording.fragments import cut_to_whole
from edged.sources.packets import Packet, StreamFormat

logger = logging.getLogger(__name__)

PART = ".part"
# A fragment per keyframe (per group of pictures). The header waits for the first fragment
# (delay_moov), so its edit list can put the first picture at 0 when B-frames delay it.
MP4_OPTIONS = {"movflags": "+frag_keyframe+empty_moov+default_base_moof+delay_moov"}


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
        # FFmpeg holds a fragmented MP4 in memory until it closes when it may seek in the
        # file (found by the disk-full test: nothing was on the disk until the end); given a
        # stream it cannot seek, it writes each fragment as it is cut.
        self._file = self.part.open("wb")
        self._out: Any = av.open(_Unseekable(self._file), "w", format="mp4",
                                 options=MP4_OPTIONS)
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
        self._walls: list[float] = []  # each muxed packet's capture time, in decode order
        self._held: Any = None  # the last packet, muxed when the next comes or at close
        self._max_pts = 0  # the latest picture's time, in the packets' time base
        self._first_dts: int | None = None  # below 0 by the decoder's delay (B-frames)

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
        # (RTP gives no durations; a fragment's samples need them: a frame, as measured below)
        out.duration = packet.duration or (round(self._step / packet.fmt.time_base)
                                           if self._step else 0)
        out.time_base = packet.fmt.time_base
        out.is_keyframe = packet.keyframe
        out.stream = self._stream
        # Each packet is muxed when the next comes (or at close): the last one's duration
        # then reaches the end of the last picture shown, which with B-frames comes after
        # the last decoded; a fragmented file's length is the sum of its samples' durations.
        held, self._held = self._held, out
        if self._first_dts is None:
            self._first_dts = out.dts
        self._max_pts = max(self._max_pts, out.pts)
        if held is not None and not self._mux(held):
            return False
        self._last_dts = packet.dts
        self.packets += 1
        wall = packet.wall
        self._walls.append(wall)
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

    def _mux(self, out: Any) -> bool:
        import av

        try:
            self._out.mux(out)
        except (av.FFmpegError, OSError) as exc:
            self.error = f"writing {self.part.name} failed: {exc}"
            logger.warning("%s; it keeps what it has", self.error,
                           extra={"code": "clip_write_failed"})
            return False
        return True

    def close(self) -> Written | None:
        """Finish the file (None: it holds no picture and is removed)."""
        import av

        held, self._held = self._held, None
        if held is not None and self.error is None:
            # The samples then last from the first decode time to the last picture's end,
            # less the decoder's delay (the edit list's shift): as long as the pictures.
            frame = round(self._step / held.time_base) if self._step else held.duration
            end = self._max_pts + (frame or 0) + min(self._first_dts or 0, 0)
            held.duration = max(1, end - held.dts)
            self._mux(held)
        for step in (self._out.close, self._file.close):
            try:
                step()
            except (av.FFmpegError, OSError) as exc:
                if self.error is None:
                    self.error = f"closing {self.part.name} failed: {exc}"
                    logger.warning("%s; it keeps what it has", self.error,
                                   extra={"code": "clip_write_failed"})
        if not self._file.closed:  # (its flush failed: the descriptor still goes)
            try:
                self._file.close()
            except OSError:
                pass
        if self.error is not None and self.packets:
            self._keep_whole()
        if self.packets == 0 or self.start_wall is None or self.end_wall is None:
            self.part.unlink(missing_ok=True)
            return None
        os.replace(self.part, self.path)
        return Written(self.path, self.start_wall, self.end_wall, self.packets,
                       self.path.stat().st_size, self.error)

    def _keep_whole(self) -> None:
        """After a failed write: the file cut after its last whole fragment, and the packets
        and the end it holds counted again (the first `samples` muxed, in decode order)."""
        try:
            whole = cut_to_whole(self.part)
        except OSError as exc:
            logger.warning("%s cannot be cut to its whole fragments: %s", self.part.name, exc,
                           extra={"code": "clip_write_failed"})
            self.packets = 0
            return
        kept = min(whole.samples, len(self._walls))
        self.packets = kept
        if kept:
            self.end_wall = max(self._walls[:kept]) + self._step
        logger.warning("%s: %d of %d pictures kept in %d whole fragments", self.part.name,
                       kept, len(self._walls), whole.fragments,
                       extra={"code": "clip_write_failed"})


class _Unseekable:
    """A file as FFmpeg sees a pipe: written in order, never sought (no `seek`, no `tell`)."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file

    def write(self, data: bytes) -> int:
        return self._file.write(data)
