"""Files that must survive a power cut, and file digests: one atomic write (temp file, fsync,
rename, fsync of the directory) and one sha256 of a file, remembered while the file is
unchanged, for every room that keeps state on disk."""

from __future__ import annotations

import hashlib
import os
import shutil
import threading
from pathlib import Path

BLOCK = 1 << 20


def write_atomically(path: Path, data: bytes | str, *, durable: bool = True) -> None:
    """Replace `path` so that a reader (or a restart after a crash) sees the old content or the
    new, never half of it. `durable=False` skips the fsyncs, for files that are only a
    cache of something that can be made again (a timing memo)."""
    raw = data.encode() if isinstance(data, str) else data
    # A name of this process: two processes writing one file never share a temp file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with tmp.open("wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # the temp file never outlives a failed write; the error goes on
        tmp.unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def copy_synced(source: Path, target: Path) -> None:
    """Copy a file and fsync the copy (its directory is the caller's to sync)."""
    shutil.copyfile(source, target)
    with target.open("rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_digests: dict[Path, tuple[tuple[int, int, int, int], str]] = {}
_digests_lock = threading.Lock()


def file_sha256(path: Path) -> str:
    """The sha256 of a file as hex, remembered while its inode, size and times stay the same
    (models are hashed at every load that considers an INT8 variant or a cached engine)."""
    info = path.stat()
    stamp = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)
    with _digests_lock:
        known = _digests.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(BLOCK):
            digest.update(block)
    with _digests_lock:
        _digests[path] = (stamp, digest.hexdigest())
    return digest.hexdigest()
