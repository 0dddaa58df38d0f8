"""The clips on disk: `<dir>/<stream>/<clip id>.mp4`, each with a `<clip id>.json` beside it
(its stream, times, the events it holds, size, codec). The store owns the folder's bounds: the
byte budget (the oldest clips are deleted first; a file being written is a `.part` and never
counted or deleted), the free-space floor below which no clip starts, and the repair at start
(a `.part` cut by a crash or power loss, a clip without its record or a record without its
clip: dropped, never served). Ids are checked against a strict pattern before they come near
a path."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from edged.core.errors import RecordingUnavailable
from edged.core.fsutil import write_atomically
from edged.recording.config import RecordingConfig
from edged.recording.writer import PART

logger = logging.getLogger(__name__)

SWEEP_S = 3600.0  # how often recordings past their age are looked for
# A record's room, taken when its file starts: written in place when the file ends, so a disk
# that filled meanwhile still takes the record of what was written.
RECORD_ROOM = 8192
FULL_PAUSE_S = 10.0  # after a write failed for want of room, no file starts for this long
ID = re.compile(r"^[0-9]{1,12}\.[0-9]{3}-[A-Za-z0-9_.-]{1,128}-[cs][0-9]{1,9}$")


def valid_id(clip_id: str) -> bool:
    return bool(ID.match(clip_id)) and ".." not in clip_id


def clip_id(start_wall: float, stream: str, number: int, kind: str = "clip") -> str:
    """`<start>-<stream>-c<n>` for an event clip, `...-s<n>` for a continuous segment."""
    return f"{start_wall:.3f}-{stream}-{'s' if kind == 'segment' else 'c'}{number}"


@dataclass(frozen=True)
class ClipInfo:
    id: str
    stream: str
    start_time: float  # Unix s of its first (key)frame
    end_time: float
    events: tuple[str, ...]  # the objects' ids whose events it holds
    size: int
    codec: str
    width: int
    height: int
    packets: int
    kind: str = "clip"  # "clip" (an event's) | "segment" (continuous recording)

    @property
    def duration(self) -> float:
        return round(self.end_time - self.start_time, 3)

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "events": list(self.events), "duration": self.duration,
                "url": f"/v2/edged/clips/{self.id}"}


class ClipStore:
    def __init__(self, root: Path, budget_bytes: int, min_free_bytes: int, *,
                 max_age_s: float = 0.0, segment_age_s: float = 0.0,
                 clock: Callable[[], float] = time.time) -> None:
        """Opens (and makes) the folder, repairs it and reads what it holds; raises
        RecordingUnavailable when the folder cannot be made or written. `max_age_s`: clips
        that ended longer ago are deleted (0: never for their age)."""
        self.root = root
        self.budget_bytes = budget_bytes
        self.min_free_bytes = min_free_bytes
        self.max_age_s = max_age_s
        self.segment_age_s = segment_age_s
        self.clock = clock
        self.deleted = 0  # clips deleted by the budget since start
        self.dropped = 0  # files dropped by the repair at start
        self._lock = threading.Lock()
        self._clips: dict[str, ClipInfo] = {}
        self._full_until = 0.0
        self.write_failures = 0  # files ended early because a write failed
        check_folder(root)
        self._repair_and_load()

    # -- reading -----------------------------------------------------------------------------
    def list(self, *, stream: str | None = None, since: float | None = None,
             until: float | None = None, event: str | None = None,
             kind: str | None = None) -> list[ClipInfo]:
        """Clips newest first: of a stream, overlapping [since, until], holding an event,
        of a kind (clip, segment)."""
        with self._lock:
            clips = list(self._clips.values())
        return sorted((c for c in clips
                       if (stream is None or c.stream == stream)
                       and (since is None or c.end_time >= since)
                       and (until is None or c.start_time <= until)
                       and (event is None or event in c.events)
                       and (kind is None or c.kind == kind)),
                      key=lambda c: c.start_time, reverse=True)

    def get(self, clip_id: str) -> ClipInfo | None:
        if not valid_id(clip_id):
            return None
        with self._lock:
            return self._clips.get(clip_id)

    def path(self, info: ClipInfo) -> Path:
        return self.root / info.stream / f"{info.id}.mp4"

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return sum(c.size for c in self._clips.values())

    def free_bytes(self) -> int:
        try:
            return shutil.disk_usage(self.root).free
        except OSError:
            return 0

    def has_room(self) -> bool:
        """Above the free-space floor, and no write failed in the last FULL_PAUSE_S: a clip
        may start."""
        return self.no_room() is None

    def no_room(self) -> str | None:
        """Why no file may start now (None: one may)."""
        if self._full_until and self.clock() < self._full_until:
            return "a write failed for want of room moments ago"
        if self.free_bytes() < self.min_free_bytes:
            return "the disk is below its free-space floor (recording.min_free_mb)"
        return None

    def write_failed(self, stream: str, what: str) -> None:
        """A file ended early: a write failed (the disk is full). No file starts for a
        while; inference goes on."""
        self._full_until = self.clock() + FULL_PAUSE_S
        self.write_failures += 1
        logger.warning("stream %s: recording stops: the disk cannot take %s (%.0f MiB free); "
                       "it is tried again in %.0f s, inference goes on", stream, what,
                       self.free_bytes() / 2**20, FULL_PAUSE_S,
                       extra={"stream": stream, "code": "recording_disk_full"})

    # -- writing -----------------------------------------------------------------------------
    def folder(self, stream: str) -> Path:
        return self.root / stream

    def reserve_record(self, stream: str, clip_id: str) -> None:
        """Take the room of a file's record as the file starts (`<id>.json.part`, dropped at
        start like every `.part`); raises OSError when even that does not fit."""
        path = self.root / stream / f"{clip_id}.json{PART}"
        try:
            with path.open("wb") as f:
                f.write(b" " * RECORD_ROOM)
        except OSError:
            path.unlink(missing_ok=True)
            raise

    def add(self, info: ClipInfo) -> bool:
        """A finished clip's record, then the budget kept (oldest first). The record goes into
        the room taken at its start (`reserve_record`), in place, then renamed: it needs no
        free space. False (the clip removed, a warning) when it cannot be written at all."""
        data = json.dumps(asdict(info)).encode()
        final = self.root / info.stream / f"{info.id}.json"
        reserved = final.with_name(final.name + PART)
        try:
            room = reserved.stat().st_size if reserved.is_file() else 0
            if len(data) <= room:
                with reserved.open("r+b") as f:  # (spaces after JSON are whitespace)
                    f.write(data.ljust(room))
                os.replace(reserved, final)
            else:
                write_atomically(final, data, durable=False)
                reserved.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("%s %s removed: its record cannot be written: %s", info.kind,
                           info.id, exc, extra={"stream": info.stream,
                                                "code": "clip_write_failed"})
            self.discard(info)
            return False
        with self._lock:
            self._clips[info.id] = info
        self.enforce_budget()
        return True

    def discard(self, info: ClipInfo) -> None:
        """A finished file that is not kept (never in the index), with its record's room."""
        self._remove(info)
        self.forget_record(info.stream, info.id)

    def forget_record(self, stream: str, clip_id: str) -> None:
        """The room taken for the record of a file that is not kept."""
        (self.root / stream / f"{clip_id}.json{PART}").unlink(missing_ok=True)

    def enforce_budget(self) -> None:
        """Delete the clips past their age, then the oldest while over the budget. Only
        finished clips are in the index: the one being written is never touched."""
        ages = {"clip": self.max_age_s, "segment": self.segment_age_s}
        now = self.clock()
        with self._lock:
            old = [c for c in self._clips.values()
                   if ages.get(c.kind, 0) > 0 and c.end_time < now - ages[c.kind]]
            for clip in old:
                del self._clips[clip.id]
        for clip in old:
            self._remove(clip)
            self.deleted += 1
            logger.info("%s %s deleted: older than %.1f days", clip.kind, clip.id,
                        ages[clip.kind] / 86400, extra={"stream": clip.stream})
        while True:
            with self._lock:
                used = sum(c.size for c in self._clips.values())
                if used <= self.budget_bytes or len(self._clips) <= 1:
                    return
                # Segments go first: an event's clip is the evidence kept longest.
                oldest = min(self._clips.values(),
                             key=lambda c: (c.kind != "segment", c.start_time))
                del self._clips[oldest.id]
            self._remove(oldest)
            self.deleted += 1
            logger.info("%s %s deleted: recordings over %d MiB", oldest.kind, oldest.id,
                        self.budget_bytes // 2**20, extra={"stream": oldest.stream})

    def _remove(self, info: ClipInfo) -> None:
        for suffix in (".json", ".mp4"):
            (self.root / info.stream / f"{info.id}{suffix}").unlink(missing_ok=True)

    # -- at start ----------------------------------------------------------------------------
    def _repair_and_load(self) -> None:
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for part in folder.glob(f"*{PART}"):  # cut by a crash: never served
                self._drop(part, "cut short (the daemon stopped while writing it)")
            records = {p.stem: p for p in folder.glob("*.json")}
            videos = {p.stem: p for p in folder.glob("*.mp4")}
            for stem in videos.keys() - records.keys():
                self._drop(videos[stem], "no record")
            for stem, record in records.items():
                info = _read_record(record) if stem in videos else None
                if info is None or info.id != stem or info.stream != folder.name:
                    self._drop(record, "no clip, or an unreadable record")
                    if stem in videos:
                        self._drop(videos[stem], "an unreadable record")
                    continue
                size = videos[stem].stat().st_size
                self._clips[info.id] = ClipInfo(**{**asdict(info), "size": size})
        self.enforce_budget()

    def _drop(self, path: Path, why: str) -> None:
        logger.warning("recording: %s dropped: %s", path, why, extra={"code": "clip_dropped"})
        path.unlink(missing_ok=True)
        self.dropped += 1


def _read_record(path: Path) -> ClipInfo | None:
    try:
        raw = json.loads(path.read_text())
        raw["events"] = tuple(raw["events"])
        return ClipInfo(**raw)
    except (OSError, ValueError, TypeError, KeyError):
        return None


def check_folder(root: Path) -> None:
    """The folder exists (made if it can be) and takes files; RecordingUnavailable names
    what is wrong (check-config asks the same)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RecordingUnavailable(f"recording.dir {root}: cannot be made: "
                                   f"{exc.strerror or exc}") from exc
    if not root.is_dir():
        raise RecordingUnavailable(f"recording.dir {root}: is not a folder")
    if not os.access(root, os.W_OK | os.X_OK):
        raise RecordingUnavailable(f"recording.dir {root}: is not writable by this user")


def open_clips(cfg: RecordingConfig, wanted: bool) -> ClipStore | None:
    """The daemon's clip store when a stream keeps clips or records (None otherwise); raises
    RecordingUnavailable when its folder cannot be used: the daemon does not start."""
    if not wanted:
        return None
    store = ClipStore(cfg.dir, cfg.clips_mb * 2**20, cfg.min_free_mb * 2**20,
                      max_age_s=cfg.clips_days * 86400,
                      segment_age_s=cfg.segments_days * 86400)
    logger.info("clips: %d kept in %s (%.1f of %d MiB)", len(store.list()), cfg.dir,
                store.used_bytes / 2**20, cfg.clips_mb)
    return store


async def retention_loop(store: ClipStore, every_s: float = SWEEP_S) -> None:
    """Retention by age even while no new file comes (each new one also sweeps)."""
    import asyncio

    while True:
        await asyncio.sleep(every_s)
        try:
            await asyncio.to_thread(store.enforce_budget)
        except OSError as exc:  # the disk went away: logged, tried again next time
            logger.warning("recording retention failed: %s", exc)
