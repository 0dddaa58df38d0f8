"""What a stream's events add up to, for people and dashboards rather than subscribers: the
objects tracked now per label and per zone, line crossings since start, events by type, the
last object that came or went (`Tally`, one per stream); and the latest event of each recent
object across streams (`RecentEvents`, the status page's list). Both are written by the streams'
threads as their events are published and read from any thread."""

from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from typing import Any

from edged.events.engine import Changes
from edged.processing.draw import short_id

RECENT_OBJECTS = 100


class Tally:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._zones: dict[str, dict[str, int]] = {}
        self._lines: dict[str, dict[str, dict[str, int]]] = {}
        self._events: Counter[str] = Counter()
        self._last: dict[str, Any] | None = None

    def add(self, changes: Changes, now: float) -> None:
        """A frame's published changes (counts and zones hold what changed; lines their whole
        totals); `now`: wall-clock time."""
        last = None
        for event in changes.events:
            if event["type"] != "update":
                after = event["after"]
                last = {"type": event["type"], "label": after["label"], "id": after["id"],
                        "short_id": short_id(after["id"]), "zones": list(after["entered_zones"]),
                        "time": now}
        with self._lock:
            self._counts.update(changes.counts)
            for zone, by_label in changes.zone_counts.items():
                self._zones.setdefault(zone, {}).update(by_label)
            self._lines.update(changes.lines)
            self._events.update(event["type"] for event in changes.events)
            if last is not None:
                self._last = last

    def view(self) -> dict[str, Any]:
        """`objects` (label → tracked now) and `last_event`, for the status report."""
        with self._lock:
            return {"objects": dict(self._counts),
                    "last_event": dict(self._last) if self._last else None}

    def totals(self) -> dict[str, Any]:
        """Everything, for /metrics: `objects`, `zones` (zone → label → now), `lines` (line →
        label → {in, out} since start), `events` (type → published since start)."""
        with self._lock:
            return {"objects": dict(self._counts),
                    "zones": {z: dict(c) for z, c in self._zones.items()},
                    "lines": {n: {label: dict(d) for label, d in t.items()}
                              for n, t in self._lines.items()},
                    "events": dict(self._events)}


class RecentEvents:
    """The latest event of each of the last RECENT_OBJECTS objects, newest first: an object's
    new, updates and end replace one another, so the list shows objects, not a firehose; an
    ended object's description joins its row (`describe`)."""

    def __init__(self, keep: int = RECENT_OBJECTS) -> None:
        self.keep = keep
        self._lock = threading.Lock()
        self._by_id: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def add(self, changes: Changes, now: float) -> None:
        if not changes.events:
            return
        with self._lock:
            for event in changes.events:
                after = event["after"]
                kept = self._by_id.get(after["id"], {}).get("description")
                self._by_id[after["id"]] = {"type": event["type"], "time": now,
                                            "object": after}
                if kept is not None:
                    self._by_id[after["id"]]["description"] = kept
                self._by_id.move_to_end(after["id"])
            while len(self._by_id) > self.keep:
                self._by_id.popitem(last=False)

    def describe(self, object_id: str, record: dict[str, Any]) -> None:
        """An object's description (edged/describer: described, failed or skipped), shown
        with its row from now on; nothing when the object is no longer listed."""
        with self._lock:
            row = self._by_id.get(object_id)
            if row is not None:
                row["description"] = record

    def rows(self, *, stream: str | None = None, limit: int = RECENT_OBJECTS
             ) -> list[dict[str, Any]]:
        with self._lock:
            rows = [dict(row) for row in reversed(self._by_id.values())]  # (describe adds)
        if stream is not None:
            rows = [r for r in rows if r["object"]["stream"] == stream]
        return rows[:limit]
