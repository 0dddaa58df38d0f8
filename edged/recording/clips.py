"""One stream's event clips. The demuxing reader hands every packet to `packet` (the capture
thread); the stream's events stage says when an object worth a clip starts and ends
(`object_started`, `object_ended`, the stream's thread). A clip starts at the ring's keyframe at
or before the object's start minus the pre-capture, takes every packet while any of its objects
lives, and ends at the first packet past the last object's end plus the post-capture: objects
whose events overlap share one clip. A camera that stops (a reconnect, a new format) ends the
clip there, as a valid file; a clip longer than `max_clip_s` is cut at a keyframe and goes on
in the next. Finished clips go into the store and are announced (`announce`: the daemon
publishes them on the clips topic).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from edged.recording.config import ClipsConfig
from edged.recording.ring import PacketRing
from edged.recording.store import ClipInfo, ClipStore, clip_id
from edged.recording.writer import ClipWriter
from edged.sources import worth_logging
from edged.sources.packets import Packet

logger = logging.getLogger(__name__)

RING_SLACK_S = 3.0  # the ring holds this much more than the pre-capture: an object is
# confirmed (announced) a few frames after its start, and the clip reaches back from its start

Announce = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class ClipRef:
    """What an event's `end` says of its clip: the id, where to fetch it, and the span it
    covers once finished (its end is the object's end plus the post-capture)."""

    id: str
    start_time: float
    end_time: float

    def payload(self) -> dict[str, Any]:
        return {"id": self.id, "url": f"/v2/edged/clips/{self.id}",
                "start_time": round(self.start_time, 3), "end_time": round(self.end_time, 3),
                "duration": round(self.end_time - self.start_time, 3)}


class _Clip:
    def __init__(self, writer: ClipWriter, cid: str, start_wall: float) -> None:
        self.writer = writer
        self.id = cid
        self.start_wall = start_wall
        self.objects: set[str] = set()  # every object whose event it holds
        self.live: set[str] = set()  # those not yet ended
        self.until = start_wall  # it ends at the first packet past this, once none is live


class ClipRecorder:
    """The stream's `PacketSink` and its clips."""

    def __init__(self, stream: str, cfg: ClipsConfig, store: ClipStore,
                 announce: Announce | None = None) -> None:
        self.stream = stream
        self.cfg = cfg
        self.store = store
        self.announce = announce
        self.ring = PacketRing(cfg.pre_capture_s + RING_SLACK_S, cfg.ring_mb * 2**20)
        self.clips_written = 0
        self.clips_failed = 0
        self.refused_no_room = 0
        self._lock = threading.Lock()
        self._clip: _Clip | None = None
        self._number = 0
        self._live: dict[str, float] = {}  # objects alive (id -> start) across clip cuts
        self._newest: float | None = None  # the newest packet's wall time

    # -- the capture thread ------------------------------------------------------------------
    def packet(self, packet: Packet) -> None:
        with self._lock:
            self.ring.add(packet)
            self._newest = packet.wall
            clip = self._clip
            if clip is None:
                if self._live and packet.keyframe:  # objects outlived their clip's cut
                    self._start(packet.wall, [packet], set(self._live))
                return
            if packet.keyframe and packet.wall - clip.start_wall >= self.cfg.max_clip_s:
                live = set(clip.live)
                self._finish()
                self._start(packet.wall, [packet], live)
                return
            if not clip.writer.write(packet):
                self._finish()  # the disk is full: the clip keeps what it has
            elif not clip.live and packet.wall >= clip.until:
                self._finish()  # (this packet, the first at or past the end, included)

    def discontinuity(self, reason: str) -> None:
        with self._lock:
            if self._clip is not None:
                logger.info("stream %s: clip %s ends early: %s", self.stream, self._clip.id,
                            reason, extra={"stream": self.stream})
                self._finish()
            self.ring.clear()

    # -- the stream's thread -----------------------------------------------------------------
    def object_started(self, object_id: str, start_time: float) -> str | None:
        """An object worth a clip: the clip it joins (or starts) — None when no clip can
        start (no keyframe yet, the disk at its floor)."""
        with self._lock:
            self._live[object_id] = start_time
            clip = self._clip
            if clip is None:
                packets = self.ring.since(start_time - self.cfg.pre_capture_s)
                if not packets:
                    return None
                clip = self._start(packets[0].wall, packets, {object_id})
                if clip is None:
                    return None
            clip.objects.add(object_id)
            clip.live.add(object_id)
            return clip.id

    def in_clip(self, object_id: str) -> bool:
        """Is the object in the clip being written?"""
        with self._lock:
            return self._clip is not None and object_id in self._clip.objects

    def object_ended(self, object_id: str, end_time: float) -> ClipRef | None:
        """The object's clip, as its `end` message names it (None: it has none)."""
        with self._lock:
            self._live.pop(object_id, None)
            clip = self._clip
            if clip is None or object_id not in clip.objects:
                return None
            clip.live.discard(object_id)
            clip.until = max(clip.until, end_time + self.cfg.post_capture_s)
            return ClipRef(clip.id, clip.start_wall, clip.until)

    def close(self) -> None:
        """The stream stops: the clip in progress ends here."""
        with self._lock:
            self._live.clear()
            if self._clip is not None:
                self._finish()

    # -- under the lock ----------------------------------------------------------------------
    def _start(self, start_wall: float, packets: list[Packet], objects: set[str]) -> _Clip | None:
        why = self.store.no_room()
        if why is not None:
            self.refused_no_room += 1
            if not worth_logging(self.refused_no_room):
                return None
            logger.warning("stream %s: no clip: %s; inference goes on", self.stream, why,
                           extra={"stream": self.stream, "code": "recording_no_room"})
            return None
        self._number += 1
        cid = clip_id(start_wall, self.stream, self._number)
        writer: ClipWriter | None = None
        try:
            writer = ClipWriter(self.store.folder(self.stream) / f"{cid}.mp4", packets[0].fmt)
            self.store.reserve_record(self.stream, cid)
        except Exception as exc:  # PyAV or the filesystem refusing in some new way
            if writer is not None:
                writer.close()  # (nothing written: its file goes)
            self.clips_failed += 1
            if isinstance(exc, OSError):  # (the disk is full: said as a warning)
                self.store.write_failed(self.stream, f"clip {cid}")
                return None
            logger.error("stream %s: clip %s cannot be written: %s", self.stream, cid, exc,
                         extra={"stream": self.stream, "code": "clip_write_failed"})
            return None
        clip = self._clip = _Clip(writer, cid, start_wall)
        clip.objects |= objects
        clip.live |= objects
        for packet in packets:
            if not writer.write(packet):
                break
        return clip

    def _finish(self) -> None:
        clip, self._clip = self._clip, None
        if clip is None:
            return
        writer = clip.writer
        written = writer.close()
        if writer.error is not None:
            self.store.write_failed(self.stream, f"clip {clip.id}")
        if written is None:
            self.clips_failed += 1
            self.store.forget_record(self.stream, clip.id)
            return
        info = ClipInfo(clip.id, self.stream, round(written.start_wall, 3),
                        round(written.end_wall, 3), tuple(sorted(clip.objects)), written.size,
                        writer.fmt.codec, writer.fmt.width, writer.fmt.height, written.packets)
        if not self.store.add(info):
            self.clips_failed += 1
            return
        self.clips_written += 1
        logger.info("stream %s: clip %s: %.1f s, %d KiB", self.stream, clip.id, info.duration,
                    info.size // 1024, extra={"stream": self.stream})
        if self.announce is not None:
            try:
                self.announce(info.row())
            except Exception:  # a publishing failure must not stop the recording
                logger.exception("stream %s: announcing clip %s failed", self.stream, clip.id)
