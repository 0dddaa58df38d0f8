"""The gallery under faults (review of issue 50's faces): a corrupt kept crop is skipped and
counted, not the end of the whole re-embedding; rows already re-embedded match while the rest
are done; NaN vectors are refused, not a new unknown group each time; a vector of another
width matches nothing instead of raising on the stream thread; names typed decomposed (NFD)
are the same names as composed (NFC)."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import cv2
import numpy as np
import pytest

from edged.core.errors import InvalidEmbedding
from edged.galleries.match import best_match, nearest_group, unit
from edged.galleries.store import Gallery, check_identity_name
from edged.streams.faces import decode_image


def _open(tmp_path: Path) -> Gallery:
    return Gallery(tmp_path / "faces.sqlite", max_entries=100, max_unknowns=100)


def _crop(value: int) -> bytes:
    return cv2.imencode(".png", np.full((4, 4, 3), value, np.uint8))[1].tobytes()


def _embed(pngs: list[bytes]) -> np.ndarray:
    """A crop's grey level picks its axis (decoding as the face pipeline does)."""
    return np.stack([np.eye(8, dtype=np.float32)[int(decode_image(p)[0, 0, 0]) % 8]
                     for p in pngs])


def test_gallery_reembed_when_a_kept_crop_is_corrupt_skips_that_row_and_does_the_rest(
        tmp_path: Path) -> None:
    gallery = _open(tmp_path)
    gallery.set_embedder("emb:1")
    ids = [gallery.add(f"p{i}", np.eye(8, dtype=np.float32)[i], "emb:1", crop=_crop(i))
           for i in range(5)]
    bad = gallery.add("broken", np.ones(8, np.float32), "emb:1", crop=b"\x89PNG\r\n\x1a\nbad")
    gallery.set_embedder("emb:2")
    skipped: list[int] = []
    assert gallery.reembed("emb:2", _embed, batch=4, skipped=skipped) == 5
    assert skipped == [bad]
    assert gallery.stale("emb:2") == (1, 0)  # the bad row stays stale, the others are done
    for i, entry in enumerate(ids):
        found = gallery.match(np.eye(8, dtype=np.float32)[i], 0.9)
        assert found is not None and (found.name, found.entry) == (f"p{i}", entry)
    # a second run skips it again and ends (it used to fail at the same row every time)
    again: list[int] = []
    assert gallery.reembed("emb:2", _embed, skipped=again) == 0 and again == [bad]


def test_gallery_reembed_when_a_vector_is_not_finite_skips_that_row(tmp_path: Path) -> None:
    gallery = _open(tmp_path)
    gallery.set_embedder("emb:1")
    for i in range(3):
        gallery.add(f"p{i}", np.eye(8, dtype=np.float32)[i], "emb:1", crop=_crop(i))
    gallery.set_embedder("emb:2")

    def embed(pngs: list[bytes]) -> np.ndarray:
        vectors = _embed(pngs)
        vectors[1] = np.nan
        return vectors
    skipped: list[int] = []
    assert gallery.reembed("emb:2", embed, skipped=skipped) == 2 and len(skipped) == 1


def test_gallery_reembed_when_in_progress_already_matches_the_rows_done(tmp_path: Path) -> None:
    gallery = _open(tmp_path)
    gallery.set_embedder("emb:1")
    for i in range(6):
        gallery.add(f"p{i}", np.eye(8, dtype=np.float32)[i], "emb:1", crop=_crop(i))
    gallery.set_embedder("emb:2")
    seen: list[str | None] = []

    def embed(pngs: list[bytes]) -> np.ndarray:
        found = gallery.match(np.eye(8, dtype=np.float32)[0], 0.9)  # p0: the first batch
        seen.append(found.name if found else None)
        return _embed(pngs)
    assert gallery.reembed("emb:2", embed, batch=2, reindex_every_s=0) == 6
    assert seen == [None, "p0", "p0"]  # known after its batch, not only at the end


def test_gallery_sighting_when_not_recorded_tells_the_group_and_keeps_nothing(
        tmp_path: Path) -> None:
    gallery = _open(tmp_path)
    kept = gallery.sighting(np.eye(8)[0], "e", group_threshold=0.5, keep_below=0.9)
    told = gallery.sighting(np.eye(8)[0] + 0.1, "e", group_threshold=0.5, keep_below=0.9,
                            record=False)
    new = gallery.sighting(np.eye(8)[3], "e", group_threshold=0.5, keep_below=0.9,
                           record=False)
    assert (told.group, told.kept) == (kept.group, False)
    assert (new.group, new.kept) == (None, False)
    assert gallery.counts()["unknowns"] == 1 and len(gallery.groups()) == 1


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_gallery_when_a_vector_is_not_finite_refuses_it_and_starts_no_group(
        tmp_path: Path, bad: float) -> None:
    gallery = _open(tmp_path)
    vector = np.ones(8, np.float32)
    vector[2] = bad
    with pytest.raises(InvalidEmbedding) as caught:
        gallery.sighting(vector, "e", group_threshold=0.5, keep_below=0.9)
    assert caught.value.code == "embedding_invalid"
    with pytest.raises(InvalidEmbedding):
        gallery.add("Ana", vector, "e")
    assert gallery.groups() == [] and gallery.counts()["entries"] == 0


def test_unit_when_not_finite_raises_invalid_embedding() -> None:
    with pytest.raises(InvalidEmbedding):
        unit(np.array([1.0, np.nan], np.float32))
    assert np.allclose(unit(np.array([3.0, 4.0])), [0.6, 0.8])


def test_match_when_the_query_is_of_another_width_matches_nothing() -> None:
    vectors = np.eye(4, dtype=np.float32)
    query = unit(np.ones(8, np.float32))  # an embedder swapped between current() and embed()
    assert best_match(query, vectors, np.arange(4), np.zeros(4, bool), list("abcd"),
                      np.arange(4), 0.1) is None
    assert nearest_group(query, vectors, np.arange(4), 0.1) == (None, -1.0)


def test_gallery_when_the_vector_width_changed_matches_nothing_and_does_not_raise(
        tmp_path: Path) -> None:
    gallery = _open(tmp_path)
    gallery.add("Ana", np.eye(8, dtype=np.float32)[0], "e")
    gallery.sighting(np.eye(8)[1], "e", group_threshold=0.5, keep_below=0.9)
    assert gallery.match(np.ones(16, np.float32), 0.1) is None
    told = gallery.sighting(np.ones(16), "e", group_threshold=0.5, keep_below=0.9,
                            record=False)
    assert told.group is None


def test_identity_name_when_typed_decomposed_is_the_composed_name(tmp_path: Path) -> None:
    nfd = unicodedata.normalize("NFD", "José")
    assert nfd != "José" and check_identity_name(nfd) == "José"
    gallery = _open(tmp_path)
    gallery.add(nfd, np.eye(8, dtype=np.float32)[0], "e")
    gallery.add("José", np.eye(8, dtype=np.float32)[1], "e")
    assert gallery.names() == [{"name": "José", "entries": 2, "negatives": 0}]
    assert gallery.delete_name(nfd) == 2

