"""Snapshots on disk: one `<object id>.jpg` per object in one folder, within a byte budget
(the oldest written are removed first), listed and read by object id for the API. The object's
label travels in the file itself, as a JPEG comment (`edged label=<label>`), so a restart (or a
file copied elsewhere) still says what it shows, without an index file to keep in step.

An object's description (edged/describer) is kept beside its snapshot as `<object id>.json`,
and a plate's own picture (its voted plate's best read, edged/events/plates.py) as
`<object id>.plate.jpg`; each is charged to the same budget and removed with its snapshot.

Writes are atomic (a reader never sees half a JPEG) but not fsynced: a snapshot lost in a power
cut is not worth an SD card's write latency on the frame loop. One lock guards the index, so a
stream's thread may write while the API's loop reads.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from edged.core.fsutil import write_atomically

logger = logging.getLogger(__name__)

_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,159}$")
_STREAM_OF_ID = re.compile(r"^[0-9]+\.[0-9]{3}-(.+)-[0-9]+$")  # lifecycle.object_id's layout
SUFFIX = ".jpg"
DESCRIPTION = ".json"
PLATE = ".plate.jpg"  # (so `.plate` never ends an object id: valid_id)
SOI, COM = b"\xff\xd8", b"\xff\xfe"  # JPEG start of image, comment segment
LABEL_COMMENT = b"edged label="
HEAD_BYTES = 512  # enough of a file to hold the comment


@dataclass(frozen=True)
class StoredSnapshot:
    id: str
    size: int
    mtime: float
    label: str | None = None
    described: int = 0  # bytes of its description (.json beside it), 0 without one
    plate: int = 0  # bytes of its plate's picture (.plate.jpg beside it), 0 without one

    @property
    def stream(self) -> str | None:
        """The stream named in the object id (None for an id of another shape)."""
        found = _STREAM_OF_ID.match(self.id)
        return found.group(1) if found else None


def with_label(jpeg: bytes, label: str) -> bytes:
    """The JPEG with a comment segment naming the label, right after its start marker."""
    text = LABEL_COMMENT + label.encode()[:200]
    if not jpeg.startswith(SOI):
        return jpeg
    return SOI + COM + (len(text) + 2).to_bytes(2, "big") + text + jpeg[len(SOI):]


def label_in(head: bytes) -> str | None:
    """The label `with_label` wrote into a JPEG, from its first bytes; None without one."""
    if not head.startswith(SOI + COM) or len(head) < 6:
        return None
    text = head[6:4 + int.from_bytes(head[4:6], "big")]
    if not text.startswith(LABEL_COMMENT):
        return None
    return text[len(LABEL_COMMENT):].decode(errors="replace")


def valid_id(object_id: str) -> bool:
    """Object ids are file names here: letters, digits, `_`, `.`, `-`, no leading dot, and
    not ending in `.plate` (whose `.jpg` would be another object's plate picture)."""
    return bool(_ID.match(object_id)) and not object_id.endswith(PLATE[:-len(SUFFIX)])


class SnapshotStore:
    def __init__(self, directory: Path, budget_bytes: int) -> None:
        self.directory = directory
        self.budget_bytes = budget_bytes
        self._lock = threading.Lock()
        self._index: OrderedDict[str, StoredSnapshot] = OrderedDict()  # oldest first
        directory.mkdir(parents=True, exist_ok=True)
        for pattern in (f".*{SUFFIX}.*.tmp", f".*{DESCRIPTION}.*.tmp"):  # a crash mid-write
            # (the first also matches a plate picture's: `.<id>.plate.jpg.*.tmp`)
            for tmp in directory.glob(pattern):
                tmp.unlink(missing_ok=True)
        found = []
        for path in directory.glob(f"*{SUFFIX}"):
            object_id = path.name[:-len(SUFFIX)]
            if valid_id(object_id):  # (a plate's picture is not: its name ends in .plate)
                try:
                    stat = path.stat()
                    with path.open("rb") as file:
                        label = label_in(file.read(HEAD_BYTES))
                except OSError:  # removed meanwhile, or unreadable: not ours to serve
                    continue
                found.append(StoredSnapshot(object_id, stat.st_size, stat.st_mtime, label,
                                            _size(self._described(object_id)),
                                            _size(self._plate(object_id))))
        for suffix in (DESCRIPTION, PLATE):  # a description or plate without its snapshot
            for path in directory.glob(f"*{suffix}"):
                if not (directory / f"{path.name[:-len(suffix)]}{SUFFIX}").exists():
                    path.unlink(missing_ok=True)
        for item in sorted(found, key=lambda s: (s.mtime, s.id)):
            self._index[item.id] = item
        self._used = sum(s.size + s.described + s.plate for s in found)
        with self._lock:
            self._evict()

    @property
    def used_bytes(self) -> int:
        return self._used

    def put(self, object_id: str, jpeg: bytes, label: str | None = None) -> bool:
        """Store (or replace) an object's snapshot, now its newest; False when it cannot be
        kept (an id that is no file name, or larger than the whole budget)."""
        if not valid_id(object_id):
            logger.warning("snapshot not stored: %r is not a valid object id", object_id)
            return False
        if label is not None:
            jpeg = with_label(jpeg, label)
        if len(jpeg) > self.budget_bytes:
            logger.warning("snapshot of %s not stored: %d bytes, over the whole budget of %d",
                           object_id, len(jpeg), self.budget_bytes)
            return False
        path = self._path(object_id)
        with self._lock:
            write_atomically(path, jpeg, durable=False)
            stat = path.stat()
            old = self._index.pop(object_id, None)
            self._used -= old.size if old else 0
            item = StoredSnapshot(object_id, len(jpeg), stat.st_mtime, label,
                                  old.described if old else 0, old.plate if old else 0)
            self._index[object_id] = item
            self._used += item.size
            self._evict()
        return True

    def describe(self, object_id: str, record: bytes) -> bool:
        """Keep an object's description (JSON) beside its snapshot; False when its snapshot
        is not kept (no picture, or evicted already): a description is kept with it only."""
        with self._lock:
            item = self._index.get(object_id)
            if item is None:
                return False
            write_atomically(self._described(object_id), record, durable=False)
            self._index[object_id] = dataclasses.replace(item, described=len(record))
            self._used += len(record) - item.described
            self._evict()
        return True

    def put_plate(self, object_id: str, jpeg: bytes) -> bool:
        """Keep (or replace) the picture of an object's plate beside its snapshot; False when
        its snapshot is not kept (none, or evicted already): it is kept with it only."""
        with self._lock:
            item = self._index.get(object_id)
            if item is None:
                return False
            write_atomically(self._plate(object_id), jpeg, durable=False)
            self._index[object_id] = dataclasses.replace(item, plate=len(jpeg))
            self._used += len(jpeg) - item.plate
            self._evict()
        return True

    def plate(self, object_id: str) -> bytes | None:
        """The picture of the object's plate, or None (no plate read, or not kept)."""
        with self._lock:
            item = self._index.get(object_id)
            if item is None or not item.plate:
                return None
            try:
                return self._plate(object_id).read_bytes()
            except FileNotFoundError:
                return None

    def description(self, object_id: str) -> bytes | None:
        with self._lock:
            item = self._index.get(object_id)
            if item is None or not item.described:
                return None
            try:
                return self._described(object_id).read_bytes()
            except FileNotFoundError:
                return None

    def read(self, object_id: str) -> bytes | None:
        with self._lock:
            if object_id not in self._index:
                return None
            try:
                return self._path(object_id).read_bytes()
            except FileNotFoundError:  # removed behind our back
                self._forget(object_id)
                return None

    def list(self) -> list[StoredSnapshot]:
        """Every stored snapshot, newest first."""
        with self._lock:
            return list(reversed(self._index.values()))

    def remove(self, object_id: str) -> bool:
        with self._lock:
            if object_id not in self._index:
                return False
            self._forget(object_id)
            return True

    def _path(self, object_id: str) -> Path:
        return self.directory / f"{object_id}{SUFFIX}"

    def _described(self, object_id: str) -> Path:
        return self.directory / f"{object_id}{DESCRIPTION}"

    def _plate(self, object_id: str) -> Path:
        return self.directory / f"{object_id}{PLATE}"

    def _forget(self, object_id: str) -> None:
        """Out of the index and off the disk, its description and plate with it."""
        item = self._index.pop(object_id)
        self._path(object_id).unlink(missing_ok=True)
        if item.described:
            self._described(object_id).unlink(missing_ok=True)
        if item.plate:
            self._plate(object_id).unlink(missing_ok=True)
        self._used -= item.size + item.described + item.plate

    def _evict(self) -> None:
        while self._used > self.budget_bytes and self._index:
            self._forget(next(iter(self._index)))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
