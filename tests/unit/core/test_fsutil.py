"""Atomic, durable writes and remembered file digests (edged/core/fsutil.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from edged.core import fsutil
from edged.core.fsutil import file_sha256, write_atomically


def test_file_sha256_is_remembered_until_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"a")
    first = file_sha256(path)
    path.write_bytes(b"bb")
    assert file_sha256(path) != first == hashlib.sha256(b"a").hexdigest()


def test_write_atomically_when_it_succeeds_replaces_the_file_and_syncs_file_and_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(fsutil.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    target = tmp_path / "active"
    target.write_text("1\n")
    write_atomically(target, "2\n")
    assert target.read_text() == "2\n"
    assert len(synced) == 2  # the new file's content, then the rename in its folder
    assert [p.name for p in tmp_path.iterdir()] == ["active"]  # no temp file left


def test_write_atomically_when_the_write_fails_keeps_the_old_file_and_no_temp_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "journal"
    target.write_text("old")

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fsutil.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space"):
        write_atomically(target, b"new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["journal"]
