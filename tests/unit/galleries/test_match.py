"""Matching by cosine similarity, the negatives rule and the grouping of unknown faces, on
vectors whose similarities a test can state."""

from __future__ import annotations

import numpy as np

from edged.galleries.match import best_match, cluster, nearest_group, unit, unit_rows


def _near(base: np.ndarray, similarity: float, rng: np.random.Generator) -> np.ndarray:
    """A unit vector whose cosine with the unit `base` is exactly `similarity`."""
    noise = rng.standard_normal(base.shape).astype(np.float32)
    noise -= noise @ base * base
    noise /= np.linalg.norm(noise)
    return unit(similarity * base + np.sqrt(1 - similarity ** 2) * noise)


def _gallery(rows: list[tuple[str, bool, np.ndarray]]
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str], np.ndarray]:
    names = sorted({n for n, _, _ in rows})
    codes = np.array([names.index(n) for n, _, _ in rows])
    negative = np.array([neg for _, neg, _ in rows])
    return unit_rows(np.stack([v for _, _, v in rows])), codes, negative, names, \
        np.arange(len(rows))


def test_best_match_when_a_face_is_close_to_one_name_returns_it_with_its_cosine() -> None:
    rng = np.random.default_rng(0)
    ana, bo = unit(rng.standard_normal(512)), unit(rng.standard_normal(512))
    vectors, codes, negative, names, ids = _gallery([("ana", False, ana), ("bo", False, bo)])
    query = _near(ana, 0.8, rng)
    found = best_match(query, vectors, codes, negative, names, ids, threshold=0.5)
    assert found is not None and found.name == "ana" and found.entry == 0
    assert abs(found.similarity - 0.8) < 1e-4


def test_best_match_when_nothing_reaches_the_threshold_is_none() -> None:
    rng = np.random.default_rng(1)
    ana = unit(rng.standard_normal(512))
    vectors, codes, negative, names, ids = _gallery([("ana", False, ana)])
    assert best_match(_near(ana, 0.4, rng), vectors, codes, negative, names, ids, 0.5) is None


def test_best_match_when_a_negative_is_closer_refuses_that_name_and_takes_the_next() -> None:
    rng = np.random.default_rng(2)
    ana, bo = unit(rng.standard_normal(512)), unit(rng.standard_normal(512))
    stranger = _near(ana, 0.6, rng)  # looks like ana at 0.6: a false match without the rule
    vectors, codes, negative, names, ids = _gallery(
        [("ana", False, ana), ("ana", True, stranger), ("bo", False, bo)])
    query = _near(stranger, 0.95, rng)
    assert float(query @ ana) >= 0.5  # would be ana without its negative
    assert best_match(query, vectors, codes, negative, names, ids, 0.5) is None
    # ana herself still matches: closer to her entry than to the negative
    found = best_match(_near(ana, 0.9, rng), vectors, codes, negative, names, ids, 0.5)
    assert found is not None and found.name == "ana"


def test_best_match_when_two_names_pass_the_more_similar_wins() -> None:
    rng = np.random.default_rng(3)
    ana = unit(rng.standard_normal(64))
    bo = _near(ana, 0.7, rng)
    vectors, codes, negative, names, ids = _gallery([("ana", False, ana), ("bo", False, bo)])
    found = best_match(_near(bo, 0.95, rng), vectors, codes, negative, names, ids, 0.5)
    assert found is not None and found.name == "bo"


def test_nearest_group_when_a_member_is_close_enough_joins_its_group() -> None:
    rng = np.random.default_rng(4)
    a, b = unit(rng.standard_normal(128)), unit(rng.standard_normal(128))
    members = unit_rows(np.stack([a, b]))
    groups = np.array([7, 9])
    assert nearest_group(_near(b, 0.8, rng), members, groups, 0.6)[0] == 9
    assert nearest_group(_near(b, 0.3, rng), members, groups, 0.6)[0] is None


def test_cluster_when_two_people_are_seen_from_several_angles_makes_two_groups() -> None:
    rng = np.random.default_rng(5)
    a, b = unit(rng.standard_normal(512)), unit(rng.standard_normal(512))
    rows = [_near(a, 0.85, rng), _near(b, 0.85, rng), _near(a, 0.85, rng),
            _near(b, 0.85, rng), _near(a, 0.85, rng)]
    assert cluster(np.stack(rows), threshold=0.5) == [0, 1, 0, 1, 0]
