"""What a stream's events add up to (objects now, per zone, line crossings, events by type,
the last object that came or went) and the recent objects across streams, each object once
with its latest event."""

from __future__ import annotations

from typing import Any

from edged.events.engine import Changes
from edged.events.tally import RecentEvents, Tally


def event(kind: str, object_id: str, label: str = "red", stream: str = "cam",
          zones: list[str] | None = None) -> dict[str, Any]:
    after = {"id": object_id, "stream": stream, "label": label,
             "entered_zones": zones or [], "has_snapshot": kind != "new"}
    return {"type": kind, "before": None, "after": after}


def test_tally_when_changes_come_keeps_counts_zones_lines_and_the_last_new_or_end() -> None:
    tally = Tally()
    tally.add(Changes(events=[event("new", "1.0-cam-1", zones=["right"])],
                      counts={"red": 1, "blue": 0}, zone_counts={"right": {"red": 1}},
                      lines={"middle": {"red": {"in": 1, "out": 0}}}), now=50.0)
    tally.add(Changes(events=[event("update", "1.0-cam-1")], counts={}), now=51.0)
    assert tally.view() == {"objects": {"red": 1, "blue": 0}, "last_event": {
        "type": "new", "label": "red", "id": "1.0-cam-1", "short_id": "#1",
        "zones": ["right"], "time": 50.0}}
    tally.add(Changes(events=[event("end", "1.0-cam-1")], counts={"red": 0},
                      zone_counts={"right": {"red": 0}}), now=52.0)
    totals = tally.totals()
    assert totals["objects"] == {"red": 0, "blue": 0}
    assert totals["zones"] == {"right": {"red": 0}}
    assert totals["lines"] == {"middle": {"red": {"in": 1, "out": 0}}}
    assert totals["events"] == {"new": 1, "update": 1, "end": 1}
    assert tally.view()["last_event"]["type"] == "end"


def test_recent_events_when_an_object_has_several_events_keeps_its_latest_newest_first() -> None:
    recent = RecentEvents(keep=2)
    recent.add(Changes(events=[event("new", "a"), event("new", "b", stream="door")]), 1.0)
    recent.add(Changes(events=[event("update", "a")]), 2.0)
    assert [(r["object"]["id"], r["type"]) for r in recent.rows()] == [("a", "update"),
                                                                        ("b", "new")]
    recent.add(Changes(events=[event("new", "c")]), 3.0)
    assert [r["object"]["id"] for r in recent.rows()] == ["c", "a"]  # b fell off
    assert [r["object"]["id"] for r in recent.rows(stream="cam", limit=1)] == ["c"]


def test_recent_events_when_an_object_is_described_shows_it_with_its_row() -> None:
    recent = RecentEvents()
    after = {"id": "1.000-door-1", "stream": "door", "label": "car"}
    recent.add(Changes(events=[{"type": "new", "before": None, "after": after}]), 1.0)
    recent.describe("1.000-door-1", {"state": "described", "summary": {"title": "t"}})
    recent.describe("gone", {"state": "failed"})  # not listed: nothing to show it with
    recent.add(Changes(events=[{"type": "end", "before": after, "after": after}]), 2.0)
    [row] = recent.rows()
    assert row["type"] == "end" and row["description"]["summary"] == {"title": "t"}
