"""One device's face gallery in SQLite: enrolled entries (a name's faces, and its negatives),
unknown sightings in groups, each row's vector (float32 blob, unit length), the embedder that
made it (`model:version`) and the aligned crop it came from (PNG, lossless: re-embedding a crop
gives what enrolling it afresh would). Every change is committed before the call returns, so
the gallery survives restarts; matching reads an in-memory index rebuilt after each change
(an immutable snapshot: the stream threads read it without the lock).

Bounds: `max_entries` enrolled rows (an enrolment past it raises GalleryFull naming it),
`max_unknowns` unknown sightings (past it a new sighting gets no group and is not kept)."""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edged.core.errors import (
    GalleryFull,
    IdentityNotFound,
    InvalidEmbedding,
    InvalidImage,
    InvalidInput,
)
from edged.galleries.index import Index, appended, load_index
from edged.galleries.match import Match, best_match, nearest_group, unit

logger = logging.getLogger(__name__)

# A name: letters (any script), digits, spaces and . ' - _, up to 64; no path or topic tricks
# (/, \, .., NUL, +, #, control characters), no leading dot or space.
_NAME = re.compile(r"[^\W_][\w .'-]{0,63}")
SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, negative INTEGER NOT NULL,
    vector BLOB NOT NULL, embedder TEXT NOT NULL, crop BLOB, source TEXT, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS unknowns (
    id INTEGER PRIMARY KEY AUTOINCREMENT, grp INTEGER NOT NULL, vector BLOB NOT NULL,
    embedder TEXT NOT NULL, crop BLOB, source TEXT, seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def check_identity_name(name: str) -> str:
    """The name in Unicode's composed form (NFC: "José" typed with a combining accent is the
    same name as with "é"), or InvalidInput saying why it cannot be one."""
    if isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    if not isinstance(name, str) or not _NAME.fullmatch(name) or ".." in name \
            or name != name.strip():
        raise InvalidInput(f"{str(name)[:64]!r} is not a name: use letters, digits, spaces "
                           "and . ' - _ (1-64, starting with a letter or digit; no '/', "
                           "'..' or control characters)")
    return name


@dataclass(frozen=True)
class Sighting:
    """An unknown face's verdict: its group (None: none, the unknowns are full) and whether
    the sighting was kept (a new look at the face) or only counted."""

    group: int | None
    kept: bool
    similarity: float


class Gallery:
    """One gallery file. Every use of the connection holds the lock (threads share it:
    streams, the API, the re-embedding); `match` reads the index without it."""

    def __init__(self, path: Path, *, max_entries: int, max_unknowns: int) -> None:
        self.path = path
        self.max_entries = max_entries
        self.max_unknowns = max_unknowns
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._entries = Index()
        self._unknowns = Index()
        self._unknown_count = 0
        self._watchers: list[Callable[[], None]] = []
        with self._lock:
            self._reindex()

    def watch(self, changed: Callable[[], None]) -> None:
        """Call `changed()` after each change of the enrolled entries (an enrolment, a group
        named, a deletion), outside the lock (it may read the gallery): who is enrolled
        decides what the daemon announces (presence sensors)."""
        self._watchers.append(changed)

    def _changed(self) -> None:
        for changed in self._watchers:
            try:
                changed()
            except Exception:  # a watcher's bug must not fail the enrolment that was made
                logger.exception("gallery %s: a watcher failed", self.path)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- enrolled --------------------------------------------------------------------------
    def add(self, name: str, vector: np.ndarray, embedder: str, *, crop: bytes | None = None,
            negative: bool = False, source: str | None = None) -> int:
        """Enrol one face under `name` (a negative: "this face is not `name`"); its id."""
        name = check_identity_name(name)
        with self._lock:
            self._room_for(1)
            row = self._db.execute(
                "INSERT INTO entries (name, negative, vector, embedder, crop, source, created) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (name, int(negative), unit(vector).tobytes(), embedder, crop, source,
                 time.time())).lastrowid
            assert row is not None
            if self._embedder() in (None, embedder):  # one row more: no rebuild
                self._entries = appended(self._entries, int(row), name, negative, unit(vector))
            else:
                self._reindex()
        self._changed()
        return int(row)

    def add_many(self, faces: list[tuple[str, np.ndarray, bool]], embedder: str, *,
                 source: str | None = None) -> int:
        """Enrol (name, vector, negative) rows at once, all or none (an import, a benchmark);
        how many."""
        faces = [(check_identity_name(n), v, neg) for n, v, neg in faces]
        now = time.time()
        with self._lock:
            self._room_for(len(faces))
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO entries (name, negative, vector, embedder, crop, source, "
                    "created) VALUES (?, ?, ?, ?, NULL, ?, ?)",
                    [(n, int(neg), unit(v).tobytes(), embedder, source, now)
                     for n, v, neg in faces])
            self._reindex()
        self._changed()
        return len(faces)

    def names(self) -> list[dict[str, Any]]:
        """Each name with its counts of entries and negatives."""
        with self._lock:
            rows = self._db.execute(
                "SELECT name, SUM(1 - negative), SUM(negative) FROM entries GROUP BY name "
                "ORDER BY name").fetchall()
        return [{"name": n, "entries": int(p), "negatives": int(q)} for n, p, q in rows]

    def enrolled(self) -> list[str]:
        """The names with at least one face (not only negatives): the ones a face can match."""
        with self._lock:
            rows = self._db.execute("SELECT DISTINCT name FROM entries WHERE negative = 0 "
                                    "ORDER BY name").fetchall()
        return [str(n) for (n,) in rows]

    def entries(self, name: str | None = None) -> list[dict[str, Any]]:
        query = "SELECT id, name, negative, embedder, source, created, crop IS NOT NULL " \
                "FROM entries" + (" WHERE name = ?" if name is not None else "") + " ORDER BY id"
        with self._lock:
            rows = self._db.execute(query, (name,) if name is not None else ()).fetchall()
        return [{"id": i, "name": n, "negative": bool(neg), "embedder": e, "source": s,
                 "created": round(c, 3), "has_crop": bool(h)}
                for i, n, neg, e, s, c, h in rows]

    def delete_name(self, name: str) -> int:
        """Forget a name's entries and negatives; how many. IdentityNotFound: none."""
        name = check_identity_name(name)
        with self._lock:
            gone = self._db.execute("DELETE FROM entries WHERE name = ?", (name,)).rowcount
            self._reindex()
        if not gone:
            raise IdentityNotFound(f"no one is enrolled as {name!r}")
        self._changed()
        return int(gone)

    def delete_entry(self, entry: int) -> None:
        with self._lock:
            gone = self._db.execute("DELETE FROM entries WHERE id = ?", (entry,)).rowcount
            self._reindex()
        if not gone:
            raise IdentityNotFound(f"no gallery entry {entry}")
        self._changed()

    def crop(self, entry: int) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT crop FROM entries WHERE id = ?", (entry,)).fetchone()
        if row is None:
            raise IdentityNotFound(f"no gallery entry {entry}")
        return row[0]

    def match(self, vector: np.ndarray, threshold: float) -> Match | None:
        """The enrolled name `vector` is (the negatives rule applies), else None. Only rows
        made by the same embedder as `vector` count: call `stale` after a swap."""
        index = self._entries
        return best_match(unit(vector), index.vectors, index.codes, index.negative,
                          index.names, index.ids, threshold) if len(index.ids) else None

    # -- unknown ---------------------------------------------------------------------------
    def sighting(self, vector: np.ndarray, embedder: str, *, group_threshold: float,
                 keep_below: float, crop: bytes | Callable[[], bytes] | None = None,
                 source: str | None = None, record: bool = True) -> Sighting:
        """An unmatched face: the group of its nearest kept sighting (or a new group); kept
        when it looks unlike every kept one (below `keep_below`) and the bound allows.
        `crop` may be a function that makes it: called only for a sighting that is kept (a
        face standing in view is not encoded frame after frame). `record=False`: only the
        nearest group is told, nothing is kept (a re-embedding in progress: the face may be a
        known one whose rows are not re-embedded yet)."""
        query = unit(vector)
        with self._lock:
            index = self._unknowns
            group, similarity = nearest_group(query, index.vectors, index.codes,
                                              group_threshold)
            if not record or (similarity >= keep_below and group is not None):
                return Sighting(group, False, round(similarity, 5))
            if self._unknown_count >= self.max_unknowns:
                return Sighting(group, False, round(similarity, 5))
            if group is None:
                group = self._next_group()
            kept = crop() if callable(crop) else crop
            self._db.execute("INSERT INTO unknowns (grp, vector, embedder, crop, source, seen) "
                             "VALUES (?, ?, ?, ?, ?, ?)",
                             (group, query.tobytes(), embedder, kept, source, time.time()))
            self._reindex(entries=False)  # (the unknowns are few: max_unknowns)
        return Sighting(group, True, round(similarity, 5))

    def groups(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._db.execute("SELECT grp, COUNT(*), MIN(seen), MAX(seen) FROM unknowns "
                                    "GROUP BY grp ORDER BY grp").fetchall()
        return [{"group": g, "sightings": n, "first_seen": round(a, 3),
                 "last_seen": round(b, 3)} for g, n, a, b in rows]

    def sightings(self, group: int) -> list[dict[str, Any]]:
        """An unknown group's kept sightings (ids, when, where); IdentityNotFound: none."""
        with self._lock:
            rows = self._db.execute("SELECT id, seen, source, crop IS NOT NULL FROM unknowns "
                                    "WHERE grp = ? ORDER BY id", (group,)).fetchall()
        if not rows:
            raise IdentityNotFound(f"no unknown group {group}")
        return [{"id": i, "seen": round(t, 3), "source": s, "has_crop": bool(c)}
                for i, t, s, c in rows]

    def sighting_crop(self, sighting: int) -> bytes | None:
        with self._lock:
            row = self._db.execute("SELECT crop FROM unknowns WHERE id = ?",
                                   (sighting,)).fetchone()
        if row is None:
            raise IdentityNotFound(f"no unknown sighting {sighting}")
        return row[0]

    def name_group(self, group: int, name: str) -> int:
        """Enrol every kept sighting of an unknown group under `name` (the group is gone);
        how many. GalleryFull when they do not all fit (nothing is moved)."""
        name = check_identity_name(name)
        with self._lock:
            rows = self._db.execute("SELECT vector, embedder, crop, source FROM unknowns "
                                    "WHERE grp = ?", (group,)).fetchall()
            if not rows:
                raise IdentityNotFound(f"no unknown group {group}")
            self._room_for(len(rows))
            now = time.time()
            with self._transaction():
                self._db.executemany(
                    "INSERT INTO entries (name, negative, vector, embedder, crop, source, "
                    "created) VALUES (?, 0, ?, ?, ?, ?, ?)",
                    [(name, v, e, c, s or f"group {group}", now) for v, e, c, s in rows])
                self._db.execute("DELETE FROM unknowns WHERE grp = ?", (group,))
            self._reindex()
        self._changed()
        return len(rows)

    def delete_group(self, group: int) -> None:
        with self._lock:
            gone = self._db.execute("DELETE FROM unknowns WHERE grp = ?", (group,)).rowcount
            self._reindex()
        if not gone:
            raise IdentityNotFound(f"no unknown group {group}")

    # -- the embedder ----------------------------------------------------------------------
    def embedders(self) -> dict[str, int]:
        """How many rows (enrolled and unknown) each embedder made."""
        counts: dict[str, int] = {}
        with self._lock:
            for table in ("entries", "unknowns"):
                rows = self._db.execute(f"SELECT embedder, COUNT(*) FROM {table} "
                                        "GROUP BY embedder").fetchall()
                for key, n in rows:
                    counts[key] = counts.get(key, 0) + int(n)
        return counts

    def stale(self, embedder: str) -> tuple[int, int]:
        """(rows another embedder made that have a crop to re-embed from, those without)."""
        with self._lock:
            with_crop, without = self._db.execute(
                "SELECT SUM(crop IS NOT NULL), SUM(crop IS NULL) FROM entries "
                "WHERE embedder != ?", (embedder,)).fetchone()
        return int(with_crop or 0), int(without or 0)

    def reembed(self, embedder: str, embed: Callable[[list[bytes]], np.ndarray], *,
                batch: int = 32, skipped: list[int] | None = None,
                reindex_every_s: float = 1.0) -> int:
        """Re-embed every row another embedder made from its kept crop (`embed`: PNG crops →
        [N, D] vectors), enrolled and unknown; rows without a crop stay (they match nothing
        until enrolled again). Returns how many rows were re-embedded.

        A row whose crop does not decode (InvalidImage from `embed`) or whose vector is not
        finite is skipped, its id appended to `skipped` and logged: one bad row does not stop
        the others (it stays stale, and a later run skips it again). The index is rebuilt as
        batches land (at most every `reindex_every_s`), so rows already re-embedded match
        while the rest are done."""
        done = 0
        rebuilt = time.monotonic()
        for table in ("entries", "unknowns"):
            after = -1  # rows are walked by id: a skipped row is not read again
            while True:
                with self._lock:
                    rows = self._db.execute(
                        f"SELECT id, crop FROM {table} WHERE embedder != ? AND id > ? "
                        "AND crop IS NOT NULL ORDER BY id LIMIT ?",
                        (embedder, after, batch)).fetchall()
                if not rows:
                    break
                after = int(rows[-1][0])
                updates = self._embedded(table, rows, embed, skipped)
                if updates:
                    with self._lock, self._transaction():
                        self._db.executemany(
                            f"UPDATE {table} SET vector = ?, embedder = ? WHERE id = ?",
                            [(v, embedder, i) for i, v in updates])
                done += len(updates)
                if time.monotonic() - rebuilt >= reindex_every_s:
                    with self._lock:
                        self._reindex()
                    rebuilt = time.monotonic()
        with self._lock:
            self._reindex()
        return done

    @staticmethod
    def _embedded(table: str, rows: list[tuple[int, bytes]],
                  embed: Callable[[list[bytes]], np.ndarray], skipped: list[int] | None
                  ) -> list[tuple[int, bytes]]:
        """(id, unit vector blob) of each row that embeds; the batch at once, and row by row
        only when the batch fails on a crop (so the bad one is told apart)."""
        try:
            vectors = list(embed([crop for _, crop in rows]))
            if len(vectors) != len(rows):
                raise ValueError(f"{len(vectors)} vectors for {len(rows)} crops (zip)")
            results: list[np.ndarray | Exception] = list(vectors)
        except InvalidImage:
            results = []
            for _, crop in rows:
                try:
                    results.append(embed([crop])[0])
                except InvalidImage as exc:
                    results.append(exc)
        updates = []
        for (row, _), vector in zip(rows, results, strict=True):
            try:
                if isinstance(vector, Exception):
                    raise vector
                updates.append((row, unit(vector).tobytes()))
            except (InvalidImage, InvalidEmbedding) as exc:
                logger.error("gallery: %s row %d is not re-embedded (skipped): %s", table, row,
                             exc, extra={"code": exc.code})
                if skipped is not None:
                    skipped.append(row)
        return updates

    def set_embedder(self, embedder: str) -> None:
        """Match only rows this embedder made from now on (the index is rebuilt)."""
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('embedder', ?)",
                             (embedder,))
            self._reindex()

    def counts(self) -> dict[str, int]:
        with self._lock:
            entries = self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        return {"entries": int(entries), "max_entries": self.max_entries,
                "unknowns": self._unknown_count, "max_unknowns": self.max_unknowns}

    # -- inside ----------------------------------------------------------------------------
    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """BEGIN ... COMMIT, or ROLLBACK when the block raises (the file keeps all or none)."""
        self._db.execute("BEGIN")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def _room_for(self, more: int) -> None:
        held = self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0]
        if held + more > self.max_entries:
            raise GalleryFull(f"the gallery holds {held} of at most {self.max_entries} faces "
                              f"(faces.max_entries); {more} more do not fit: delete some, or "
                              "raise the bound")

    def _next_group(self) -> int:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'next_group'").fetchone()
        group = int(row[0]) if row else 1
        self._db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('next_group', ?)",
                         (str(group + 1),))
        return group

    def _embedder(self) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = 'embedder'").fetchone()
        return row[0] if row else None

    def _reindex(self, *, entries: bool = True) -> None:
        """Rebuild the indexes from the file (under the lock): only the current embedder's
        rows, so that vectors of two embedders are never compared."""
        embedder = self._embedder()
        if entries:
            self._entries = load_index(self._rows(
                "SELECT id, name, negative, vector FROM entries WHERE embedder = ?", embedder))
        self._unknowns = load_index(self._rows(
            "SELECT id, grp, 0, vector FROM unknowns WHERE embedder = ?", embedder),
            numeric=True)
        self._unknown_count = int(self._db.execute("SELECT COUNT(*) FROM unknowns")
                                  .fetchone()[0])

    def _rows(self, query: str, embedder: str | None) -> Iterator[tuple[Any, ...]]:
        if embedder is None:  # nothing said yet: every row (a gallery of one embedder)
            query = query.replace(" WHERE embedder = ?", "")
            return iter(self._db.execute(query).fetchall())
        return iter(self._db.execute(query, (embedder,)).fetchall())
