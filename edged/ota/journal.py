"""What OTA keeps on disk beside a model to make installs crash-safe: the journal of the
install in progress (`<model>/.ota-pending`: "<version> <sha256>"), how often installing an
artifact was cut by a restart (`<model>/.ota-crashes`), the manifest that installed each
version (`<model>/<version>/.ota.json`), and the highest OTA message seq accepted per model
(`<models>/.ota-seq.json`: one file for the repository, so a model not yet installed needs no
folder, and deleting a model's folder does not reopen it to replays). The repository says
where a model lives; this room says what OTA writes there, always atomically."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edged.core.fsutil import write_atomically
from edged.model.repository import ModelRepository
from edged.ota.manifest import Rejected

PENDING = ".ota-pending"  # <models>/<name>/: "<version> <sha256>" of an unfinished install
CRASHES = ".ota-crashes"  # <models>/<name>/: {sha256: installs of it cut by a restart}
RECORD = ".ota.json"  # <models>/<name>/<version>/: the manifest that installed it
SEQ = ".ota-seq.json"  # <models>/: {name: [highest seq accepted, digest of that message]}


class InstallJournal:
    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self._seq_lock = threading.Lock()

    # -- freshness: the highest seq accepted per model -----------------------------------------
    def accepted_seq(self, name: str) -> tuple[int, str] | None:
        """(seq, digest) of the last OTA message accepted for `name`; None: none yet."""
        entry = self._seqs().get(name)
        return (entry[0], entry[1]) if entry is not None else None

    def accept_seq(self, name: str, seq: int, digest: str) -> None:
        """Remember that a message with `seq` was acted on: from now on only greater ones are."""
        with self._seq_lock:
            seqs = self._seqs()
            if name in seqs and seqs[name][0] > seq:
                return
            seqs[name] = (seq, digest)
            self.repository.root.mkdir(parents=True, exist_ok=True)
            write_atomically(self.repository.root / SEQ,
                             json.dumps({k: list(v) for k, v in sorted(seqs.items())}) + "\n")

    def _seqs(self) -> dict[str, tuple[int, str]]:
        try:
            doc = json.loads((self.repository.root / SEQ).read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            # Unreadable must not reopen every model to replays: refuse until it is fixed.
            raise Rejected("internal", f"cannot read {SEQ}: {exc}") from None
        if not isinstance(doc, dict):
            raise Rejected("internal", f"{SEQ} is not a JSON object")
        return {k: (int(v[0]), str(v[1])) for k, v in doc.items()
                if isinstance(v, list) and len(v) == 2 and isinstance(v[0], int)}

    # -- the install in progress -------------------------------------------------------------
    def begin(self, name: str, version: int, sha256: str) -> None:
        """Before the repository changes: a restart that finds this undoes the install."""
        folder = self.repository.model_dir(name)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(folder / PENDING, f"{version} {sha256}\n")

    def pending(self, name: str) -> tuple[int | None, str] | None:
        """(version, artifact sha256) of the install a restart cut, None when there is none;
        the version is None when the journal is unreadable (it is then only cleared)."""
        try:
            text = (self.repository.model_dir(name) / PENDING).read_text()
        except FileNotFoundError:
            return None
        version, _, sha256 = text.strip().partition(" ")
        return (int(version) if version.isdigit() else None), sha256

    def end(self, name: str) -> None:
        (self.repository.model_dir(name) / PENDING).unlink(missing_ok=True)

    # -- installs cut by restarts ------------------------------------------------------------
    def crashes(self, name: str, sha256: str) -> int:
        """How often installing this artifact of `name` was cut by a restart."""
        return self._crashes(name).get(sha256, 0)

    def count_crash(self, name: str, sha256: str) -> int:
        counts = self._crashes(name)
        counts[sha256] = counts.get(sha256, 0) + 1
        write_atomically(self.repository.model_dir(name) / CRASHES, json.dumps(counts) + "\n")
        return counts[sha256]

    def _crashes(self, name: str) -> dict[str, int]:
        try:
            counts = json.loads((self.repository.model_dir(name) / CRASHES).read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in counts.items() if isinstance(v, int)} \
            if isinstance(counts, dict) else {}

    # -- what installed a version ------------------------------------------------------------
    @staticmethod
    def record(files: Path, manifest: Mapping[str, Any]) -> None:
        """Keep the manifest with a staged version's files (it moves in with them)."""
        write_atomically(files / RECORD, json.dumps(dict(manifest), sort_keys=True))

    def installed_sha256(self, name: str, version: int) -> str | None:
        """The artifact sha256 that installed `name:version` over the air, if it was."""
        try:
            record = json.loads((self.repository.version_dir(name, version) / RECORD)
                                .read_text())
            return str(record["artifact"]["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
