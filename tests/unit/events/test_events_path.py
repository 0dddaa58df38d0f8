"""Objects' paths for their descriptions: a point when an object moved (or stood a while),
bounded however long it stays."""

from __future__ import annotations

from edged.events.path import MAX_POINTS, Paths


def test_paths_when_an_object_moves_records_its_bottom_centre_from_its_start() -> None:
    paths = Paths()
    for i in range(5):
        paths.observe(100.0 + i, [("a", [10.0 * i, 0.0, 10.0 * i + 10, 20.0]),
                                  (None, [0, 0, 1, 1])])
    assert paths.take("a") == [(float(i), 10.0 * i + 5, 20.0) for i in range(5)]
    assert paths.take("a") == [] and len(paths) == 0


def test_paths_when_an_object_stands_still_adds_a_point_every_few_seconds() -> None:
    paths = Paths()
    for i in range(40):
        paths.observe(i * 0.25, [("a", [0.0, 0.0, 10.0, 10.0])])
    assert [t for t, _x, _y in paths.take("a")] == [0.0, 2.0, 4.0, 6.0, 8.0]


def test_paths_when_an_object_stays_long_keeps_at_most_max_points() -> None:
    paths = Paths()
    for i in range(1000):
        paths.observe(i * 1.0, [("a", [float(i), 0.0, i + 10.0, 10.0])])
    path = paths.take("a")
    assert len(path) <= MAX_POINTS and path[0][0] == 0.0 and path[-1][0] == 999.0
