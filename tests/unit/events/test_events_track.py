"""Tracking: detections become tracks whose numbers last while the object is in view, through
short occlusions and past each other; new tracks wait for min_hits, gone ones end after
max_age_s, and no more than max_tracks live at once. The matcher is the optimal assignment."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pytest
from support.events import Box, moved, path

from edged.events.assign import cluster_assign, greedy_assign, hungarian
from edged.events.config import TrackConfig
from edged.events.track import Tracker, TrackStep

FPS = 10.0


def feed(tracker: Tracker, frame: int, *detections: tuple[Box, str, float]) -> TrackStep:
    boxes = np.array([b for b, _l, _s in detections], float).reshape(-1, 4)
    scores = np.array([s for _b, _l, s in detections], float)
    return tracker.update(frame / FPS, boxes, scores, [label for _b, label, _s in detections])


def keys(step: TrackStep) -> dict[int, int]:
    """detection index → track number, for this frame."""
    return {tr.detection: tr.key for tr in step.seen if tr.detection is not None}


def test_tracker_when_an_object_moves_across_keeps_one_number() -> None:
    tracker = Tracker(TrackConfig(min_hits=3))
    steps = [feed(tracker, f, (box, "person", 0.9))
             for f, box in enumerate(path((10, 100, 50, 200), (12, 0), 30))]
    assert {keys(s)[0] for s in steps} == {1}
    assert [i for i, s in enumerate(steps) if s.confirmed] == [2]  # the third frame
    assert not any(s.ended for s in steps)


def test_tracker_when_hidden_for_a_few_frames_within_max_age_keeps_its_number() -> None:
    tracker = Tracker(TrackConfig(max_age_s=1.0))
    boxes = path((10, 100, 50, 200), (10, 0), 30)
    numbers = set()
    for f, box in enumerate(boxes):
        hidden = 10 <= f < 16  # 0.6 s behind a pillar, still walking
        step = feed(tracker, f) if hidden else feed(tracker, f, (box, "person", 0.9))
        assert not step.ended
        numbers |= set(keys(step).values())
    assert numbers == {1}


def test_tracker_when_two_objects_cross_paths_both_keep_their_numbers() -> None:
    tracker = Tracker(TrackConfig())
    left_to_right = path((0, 100, 40, 200), (15, 0), 40)
    right_to_left = path((585, 104, 625, 204), (-15, 0), 40)  # they overlap fully mid-way
    first: dict[str, int] = {}
    for f in range(40):
        step = feed(tracker, f, (left_to_right[f], "person", 0.9),
                    (right_to_left[f], "person", 0.9))
        for index, name in ((0, "a"), (1, "b")):
            assert first.setdefault(name, keys(step)[index]) == keys(step)[index], f
    assert first["a"] != first["b"]


def test_tracker_when_an_object_returns_after_max_age_it_gets_a_new_number() -> None:
    tracker = Tracker(TrackConfig(max_age_s=1.0, min_hits=1))
    box: Box = (100, 100, 150, 200)
    assert keys(feed(tracker, 0, (box, "person", 0.9))) == {0: 1}
    assert feed(tracker, 10).ended == []  # 1.0 s unseen: not yet over max_age_s
    gone = feed(tracker, 11)
    assert [tr.key for tr in gone.ended] == [1]
    assert keys(feed(tracker, 12, (box, "person", 0.9))) == {0: 2}


def test_tracker_when_seen_fewer_frames_than_min_hits_never_confirms_or_ends() -> None:
    tracker = Tracker(TrackConfig(min_hits=3))
    box: Box = (100, 100, 150, 200)
    steps = [feed(tracker, 0, (box, "person", 0.9)), feed(tracker, 1, (box, "person", 0.9)),
             feed(tracker, 2), feed(tracker, 3, (box, "person", 0.9))]
    assert not any(s.confirmed or s.ended for s in steps)
    assert keys(steps[3]) == {0: 2}  # the flicker was forgotten; this is a new track


def test_tracker_when_labels_differ_never_matches_them() -> None:
    tracker = Tracker(TrackConfig(min_hits=1))
    box: Box = (100, 100, 150, 200)
    feed(tracker, 0, (box, "person", 0.9))
    step = feed(tracker, 1, (box, "car", 0.9))
    assert [(tr.key, tr.label) for tr in step.seen] == [(2, "car")]


def test_tracker_when_detections_are_weak_they_keep_objects_alive_but_start_none() -> None:
    tracker = Tracker(TrackConfig(min_hits=1, high_score=0.5))
    box: Box = (100, 100, 150, 200)
    feed(tracker, 0, (box, "person", 0.9))
    half_hidden = feed(tracker, 1, (moved(box, 2), "person", 0.3), ((400, 100, 450, 200),
                                                                    "person", 0.3))
    assert keys(half_hidden) == {0: 1}
    assert len(tracker.tracks) == 1


def test_tracker_when_full_drops_the_object_unseen_longest_with_a_log_line(
        caplog: pytest.LogCaptureFixture) -> None:
    tracker = Tracker(TrackConfig(max_tracks=3, min_hits=1), stream="door")
    boxes: list[Box] = [(0, 0, 40, 80), (100, 0, 140, 80), (200, 0, 240, 80), (300, 0, 340, 80)]
    feed(tracker, 0, *[(b, "person", 0.9) for b in boxes[:3]])
    feed(tracker, 1, (boxes[1], "person", 0.9), (boxes[2], "person", 0.9))  # the first hides
    with caplog.at_level(logging.WARNING, logger="edged.events.track"):
        step = feed(tracker, 2, (boxes[1], "person", 0.9), (boxes[2], "person", 0.9),
                    (boxes[3], "person", 0.9))
    assert [tr.key for tr in step.ended] == [1]
    assert sorted(tr.key for tr in tracker.tracks) == [2, 3, 4]
    assert "stream door: 1 objects dropped to stay within track.max_tracks=3" in caplog.text


def test_tracker_when_full_and_everyone_is_in_view_the_newcomer_waits() -> None:
    tracker = Tracker(TrackConfig(max_tracks=2, min_hits=1))
    boxes: list[Box] = [(0, 0, 40, 80), (100, 0, 140, 80), (200, 0, 240, 80)]
    step = feed(tracker, 0, *[(b, "person", s) for b, s in zip(boxes, (0.9, 0.8, 0.7),
                                                                 strict=True)])
    assert sorted(keys(step)) == [0, 1] and not step.ended
    for f in range(1, 50):  # memory stays bounded however long it goes on
        feed(tracker, f, *[(moved(b, 0, f), "person", 0.9) for b in boxes])
        assert len(tracker.tracks) == 2


def test_cluster_assign_when_greedy_would_strand_a_track_matches_both() -> None:
    similarity = np.array([[0.9, 0.8], [0.8, 0.1]])
    assert greedy_assign(similarity, 0.3) == [(0, 0)]  # the best pair first leaves row 1 out
    assert cluster_assign(similarity, 0.3) == [(0, 1), (1, 0)]


def test_cluster_assign_when_the_best_overlap_is_under_the_threshold_drops_it() -> None:
    similarity = np.array([[0.25, 0.0], [0.0, 0.7], [0.0, 0.0]])
    assert cluster_assign(similarity, 0.3) == [(1, 1)]
    assert cluster_assign(np.zeros((0, 3)), 0.3) == []


def test_hungarian_when_compared_with_every_permutation_finds_the_largest_total() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        rows, cols = (int(v) for v in rng.integers(1, 6, 2))
        weights = (rng.random((rows, cols)) * (rng.random((rows, cols)) < 0.7)).round(2)
        pairs = hungarian(weights.tolist())
        assert len({r for r, _c in pairs}) == len({c for _r, c in pairs}) == min(rows, cols)
        if rows <= cols:
            best = max(sum(weights[r, c] for r, c in enumerate(perm))
                       for perm in itertools.permutations(range(cols), rows))
        else:
            best = max(sum(weights[r, c] for c, r in enumerate(perm))
                       for perm in itertools.permutations(range(rows), cols))
        assert sum(weights[r, c] for r, c in pairs) == pytest.approx(best)


def test_tracker_when_an_object_moves_its_own_width_a_frame_still_confirms_it() -> None:
    tracker = Tracker(TrackConfig(min_hits=3))  # a walker at 5 fps: no overlap frame to frame
    steps = [feed(tracker, f, (box, "person", 0.9))
             for f, box in enumerate(path((10, 100, 50, 200), (40, 0), 8))]
    assert [i for i, s in enumerate(steps) if s.confirmed] == [2]
    assert {keys(s)[0] for s in steps} == {1}


def test_tracker_when_frames_come_a_fraction_of_a_millisecond_apart_speed_stays_sane() -> None:
    """A one-pixel jitter over a 0.2 ms capture gap is no 5000 px/s speed: the speed is
    measured over at least VELOCITY_BASE_S, and the object keeps its number after a long
    gap that follows the burst."""
    tracker = Tracker(TrackConfig(max_age_s=1.0))
    t, numbers = 0.0, set()
    for i in range(40):
        jitter = (i % 2) * 1.0
        box = (100 + jitter, 100, 150 + jitter, 200)
        t += 0.0002 if i % 10 else 0.5  # bursts of ten, 0.5 s apart
        step = tracker.update(t, np.array([box], float), np.array([0.9]), ["face"])
        numbers |= {tr.key for tr in step.seen}
        assert np.abs(tracker.tracks[0].velocity).max() < 50.0, i
    assert numbers == {1}
