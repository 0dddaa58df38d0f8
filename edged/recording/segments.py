"""Continuous recording: every packet of a stream into MP4 segments (`<start>-<stream>-s<n>`,
beside the event clips in the store), each starting at a keyframe and ending at the first
keyframe `segment_s` after its start, so segments follow one another without a gap or an
overlap. A camera that stops (a reconnect, a new format) ends the segment there; the next
starts at the next keyframe. Mode `motion` keeps only segments during which the picture
changed (the change gate's measure), `active_objects` those during which the events stage saw
a tracked object; both are told by the stream's thread (`activity`), after the packets are
written, so the decision comes one segment late. Below the store's free-space floor no
segment starts (`recording_no_room`, logged the first ten times, then every hundredth) and
inference goes on.
`PacketTee` hands one reader's packets to the segments and the clips alike."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from edged.recording.config import RecordConfig
from edged.recording.store import ClipInfo, ClipStore, clip_id
from edged.recording.writer import ClipWriter
from edged.sources import PacketSink, worth_logging
from edged.sources.packets import Packet

logger = logging.getLogger(__name__)

ACTIVITY_STEP_S = 0.5  # object activity is kept at this resolution


class PacketTee:
    """One reader's packets to several sinks, in order."""

    def __init__(self, sinks: Sequence[PacketSink]) -> None:
        self.sinks = tuple(sinks)

    def packet(self, packet: Packet) -> None:
        for sink in self.sinks:
            sink.packet(packet)

    def discontinuity(self, reason: str) -> None:
        for sink in self.sinks:
            sink.discontinuity(reason)


class SegmentRecorder:
    """The stream's `PacketSink` for continuous recording (the capture thread only)."""

    def __init__(self, stream: str, cfg: RecordConfig, store: ClipStore) -> None:
        self.stream = stream
        self.cfg = cfg
        self.store = store
        self.segments_written = 0
        self.refused_no_room = 0
        self._lock = threading.Lock()  # close() may come from another thread
        self._writer: ClipWriter | None = None
        self._id = ""
        self._start = 0.0
        self._number = 0
        self.dropped_idle = 0  # segments without an object in view (mode active_objects)
        self._active: list[float] = []  # when objects were in view, at most 2 a second
        # mode active_objects: the last finished segment waits for the activity of its
        # frames, which the events stage reports after the model answered (after the packets)
        self._pending: ClipInfo | None = None

    def activity(self, frame_time: float) -> None:
        """A frame with motion or tracked objects in view (by the mode), at its capture time
        (the stream's thread)."""
        with self._lock:
            if not self._active or frame_time - self._active[-1] >= ACTIVITY_STEP_S:
                self._active.append(frame_time)

    def packet(self, packet: Packet) -> None:
        with self._lock:
            writer = self._writer
            if writer is not None and packet.keyframe and \
                    packet.wall - self._start >= self.cfg.segment_s:
                self._finish()
                writer = None
            if writer is None:
                if not packet.keyframe:
                    return  # a segment starts at a keyframe
                writer = self._open(packet)
                if writer is None:
                    return
            if not writer.write(packet):
                self._finish()  # the disk filled: the segment keeps what it has

    def discontinuity(self, reason: str) -> None:
        with self._lock:
            self._finish()

    def close(self) -> None:
        with self._lock:
            self._finish()
            self._decide()

    def _open(self, packet: Packet) -> ClipWriter | None:
        why = self.store.no_room()
        if why is not None:
            self.refused_no_room += 1
            if worth_logging(self.refused_no_room):
                logger.warning("stream %s: not recording: %s; inference goes on", self.stream,
                               why, extra={"stream": self.stream, "code": "recording_no_room"})
            return None
        self._number += 1
        self._id = clip_id(packet.wall, self.stream, self._number, "segment")
        self._start = packet.wall
        try:
            self._writer = ClipWriter(self.store.folder(self.stream) / f"{self._id}.mp4",
                                      packet.fmt)
            self.store.reserve_record(self.stream, self._id)
        except Exception as exc:  # PyAV or the filesystem refusing in some new way
            if self._writer is not None:
                self._writer.close()  # (nothing written: its file goes)
                self._writer = None
            if isinstance(exc, OSError):  # (the disk is full: said as a warning)
                self.store.write_failed(self.stream, f"segment {self._id}")
                return None
            logger.error("stream %s: segment %s cannot be written: %s", self.stream, self._id,
                         exc, extra={"stream": self.stream, "code": "clip_write_failed"})
            return None
        return self._writer

    def _finish(self) -> None:
        writer, self._writer = self._writer, None
        if writer is None:
            return
        written = writer.close()
        if writer.error is not None:
            self.store.write_failed(self.stream, f"segment {self._id}")
        if written is None:
            self.store.forget_record(self.stream, self._id)
            return
        info = ClipInfo(self._id, self.stream, round(written.start_wall, 3),
                        round(written.end_wall, 3), (), written.size, writer.fmt.codec,
                        writer.fmt.width, writer.fmt.height, written.packets, kind="segment")
        if self.cfg.mode == "all":  # (motion and active_objects wait to be told)
            self.segments_written += self.store.add(info)
            return
        self._decide()  # the one before: its frames' activity is in by now
        self._pending = info

    def _decide(self) -> None:
        """Keep the pending segment when an object was in view during it; else delete it
        (it was never in the store: no record was written)."""
        info, self._pending = self._pending, None
        if info is None:
            return
        if any(info.start_time - ACTIVITY_STEP_S <= t <= info.end_time for t in self._active):
            self.segments_written += self.store.add(info)
        else:
            self.store.discard(info)
            self.dropped_idle += 1
        self._active = [t for t in self._active if t > info.end_time]
