"""The gallery's SQLite file: enrolments survive a reopen, the bound refuses with its number,
names with path or topic tricks are refused, unknown sightings group and a group can be named,
and rows of another embedder are not compared until re-embedded from their crops."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edged.core.errors import GalleryFull, IdentityNotFound, InvalidInput
from edged.galleries.match import unit
from edged.galleries.store import Gallery


def _open(tmp_path: Path, **bounds: int) -> Gallery:
    return Gallery(tmp_path / "g" / "faces.sqlite", max_entries=bounds.get("entries", 10),
                   max_unknowns=bounds.get("unknowns", 10))


def test_gallery_when_reopened_keeps_its_entries_and_matches(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    ana = rng.standard_normal(512).astype(np.float32)
    gallery = _open(tmp_path)
    gallery.set_embedder("emb:1")
    entry = gallery.add("Ana María", ana, "emb:1", crop=b"png")
    gallery.close()
    again = _open(tmp_path)
    found = again.match(ana * 3, threshold=0.5)
    assert found is not None and (found.name, found.entry) == ("Ana María", entry)
    assert again.names() == [{"name": "Ana María", "entries": 1, "negatives": 0}]
    again.close()


def test_gallery_when_full_refuses_naming_its_bound(tmp_path: Path) -> None:
    gallery = _open(tmp_path, entries=2)
    for i in range(2):
        gallery.add("ana", np.eye(8, dtype=np.float32)[i], "emb:1")
    with pytest.raises(GalleryFull, match=r"at most 2 faces \(faces.max_entries\)"):
        gallery.add("bo", np.eye(8, dtype=np.float32)[3], "emb:1")
    assert gallery.counts()["entries"] == 2


@pytest.mark.parametrize("name", ["../etc", "a/b", "..", ".hidden", "", "x" * 65, "a\x00b",
                                  "a+b", "#", " ana", "ana\n", "_x"])
def test_gallery_when_a_name_has_path_or_topic_tricks_refuses_it(tmp_path: Path,
                                                                 name: str) -> None:
    with pytest.raises(InvalidInput, match="is not a name"):
        _open(tmp_path).add(name, np.ones(8, np.float32), "emb:1")


def test_gallery_when_unknowns_look_alike_groups_them_and_a_name_enrols_the_group(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    a, b = unit(rng.standard_normal(64)), unit(rng.standard_normal(64))
    gallery = _open(tmp_path)
    seen = [gallery.sighting(v, "emb:1", group_threshold=0.5, keep_below=0.99, crop=b"c")
            for v in (a, b, unit(a + 0.2 * b), a)]
    assert [s.group for s in seen] == [1, 2, 1, 1]
    assert [s.kept for s in seen] == [True, True, True, False]  # the last: seen already
    assert gallery.name_group(1, "ana") == 2
    assert gallery.match(a, 0.5).name == "ana"  # type: ignore[union-attr]
    assert [g["group"] for g in gallery.groups()] == [2]
    with pytest.raises(IdentityNotFound):
        gallery.name_group(1, "ana")


def test_gallery_when_unknowns_are_full_gives_no_new_group(tmp_path: Path) -> None:
    gallery = _open(tmp_path, unknowns=1)
    eye = np.eye(8, dtype=np.float32)
    assert gallery.sighting(eye[0], "e", group_threshold=0.5, keep_below=0.99).group == 1
    full = gallery.sighting(eye[1], "e", group_threshold=0.5, keep_below=0.99)
    assert (full.group, full.kept) == (None, False)


def test_gallery_when_the_embedder_changes_matches_only_after_reembedding(
        tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    old = rng.standard_normal(32).astype(np.float32)
    rotation = np.linalg.qr(rng.standard_normal((32, 32)))[0].astype(np.float32)
    gallery = _open(tmp_path)
    gallery.set_embedder("emb:1")
    gallery.add("ana", old, "emb:1", crop=b"ana-crop")
    gallery.add("bo", rng.standard_normal(32).astype(np.float32), "emb:1")  # no crop
    gallery.set_embedder("emb:2")
    new = rotation @ old  # what emb:2 makes of ana's crop
    assert gallery.match(new, 0.5) is None  # emb:1's vectors are not compared
    assert gallery.stale("emb:2") == (1, 1)
    assert gallery.reembed("emb:2", lambda crops: np.stack([new for _ in crops])) == 1
    assert gallery.match(new, 0.5).name == "ana"  # type: ignore[union-attr]
    assert gallery.stale("emb:2") == (0, 1)


def test_gallery_when_rows_are_appended_matches_as_the_index_rebuilt_from_the_file(
        tmp_path: Path) -> None:
    """The appended index (a shortcut: no rebuild from the file per enrolment) answers as the
    full rebuild does, for seeded enrolments, negatives, deletes and queries."""
    rng = np.random.default_rng(7)
    gallery = _open(tmp_path, entries=500)
    gallery.set_embedder("emb:1")
    people = [rng.standard_normal(64).astype(np.float32) for _ in range(12)]
    ids = []
    for i in range(300):
        who = int(rng.integers(12))
        noisy = people[who] + 0.6 * rng.standard_normal(64).astype(np.float32)
        ids.append(gallery.add(f"p{who}", noisy, "emb:1", negative=bool(rng.random() < 0.1)))
        if i % 50 == 49:  # a delete rebuilds from the file; appends go on from there
            gallery.delete_entry(ids.pop(int(rng.integers(len(ids)))))
    appended = gallery._entries
    gallery._reindex()  # the full path: everything read back from the file
    rebuilt = gallery._entries
    matched = 0
    for _ in range(200):
        query = unit(people[int(rng.integers(12))]
                     + 0.8 * rng.standard_normal(64).astype(np.float32))
        gallery._entries = appended
        fast = gallery.match(query, 0.3)
        gallery._entries = rebuilt
        assert fast == gallery.match(query, 0.3)
        matched += fast is not None
    assert matched > 100  # the answers compared are mostly names, not all None


def test_gallery_when_a_reembedding_fails_midway_keeps_the_file_whole_and_usable(
        tmp_path: Path) -> None:
    gallery = _open(tmp_path)
    gallery.set_embedder("emb:1")
    for i in range(3):
        gallery.add("ana", np.eye(8, dtype=np.float32)[i], "emb:1", crop=b"c")
    gallery.set_embedder("emb:2")
    with pytest.raises(ValueError, match="zip"):  # one vector for three crops
        gallery.reembed("emb:2", lambda crops: np.ones((1, 8), np.float32))
    assert gallery.stale("emb:2") == (3, 0)  # rolled back: nothing half-written
    gallery.add("bo", np.ones(8, np.float32), "emb:2")  # no transaction left open
    assert gallery.counts()["entries"] == 4


def test_gallery_when_who_is_enrolled_changes_tells_its_watchers(tmp_path: Path) -> None:
    gallery = _open(tmp_path)
    seen: list[list[str]] = []
    gallery.watch(lambda: seen.append(gallery.enrolled()))  # (it may read the gallery)
    gallery.watch(lambda: 1 / 0)  # a broken watcher does not fail the enrolment
    entry = gallery.add("Ana", np.eye(8, dtype=np.float32)[0], "emb:1")
    gallery.add("Bo", np.eye(8, dtype=np.float32)[1], "emb:1", negative=True)
    assert seen == [["Ana"], ["Ana"]]  # a name with only negatives is not one faces match
    gallery.add_many([("Cy", np.eye(8, dtype=np.float32)[2], False)], "emb:1")
    gallery.delete_entry(entry)
    gallery.delete_name("Cy")
    assert seen[2:] == [["Ana", "Cy"], ["Cy"], []]
    with pytest.raises(IdentityNotFound):
        gallery.delete_name("Cy")
    assert len(seen) == 5  # nothing changed: no call
    gallery.close()
