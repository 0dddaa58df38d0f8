"""Reporting what the engine found: each `Changes` to its topics under the device's prefix,
and each object's snapshot into the disk store. It knows the topics, not MQTT: it calls
`publish(kind, suffix, payload, retain=...)`, the MQTT link's own signature.

The topics are `edged.mqtt.topics`' (under `<prefix>/`): `events` (one event, JSON,
`docs/schemas/events.schema.json`), and per stream the retained counts, zone counts, line
totals and the newest object's snapshot of each label, and the last face named and plate read
(`streams/<stream>/recognized/face|plate`: the `tracked_object_update` that told it, as
Frigate's Home Assistant integration keeps a last recognised face and plate per camera).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from edged.events.engine import Changes, LineTotals
from edged.events.store import SnapshotStore
from edged.mqtt import topics

logger = logging.getLogger(__name__)

class Publish(Protocol):
    def __call__(self, kind: Literal["events"], suffix: str, payload: bytes, *,
                 retain: bool = False) -> None: ...


# One encoder made once: json.dumps with separators builds one a call.
_ENCODE = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode


def compact(value: Any) -> bytes:
    return _ENCODE(value).encode()


class EventPublisher:
    """One stream's reporting. `publish` None: MQTT is off (snapshots are still stored);
    `store` None: snapshots are not kept on disk."""

    def __init__(self, stream: str, publish: Publish | None,
                 store: SnapshotStore | None) -> None:
        self.stream = stream
        self.publish = publish
        self.store = store
        self.messages = 0  # published since start (the stats' events_published)
        self._labels: dict[str, str] = {}  # live object id -> label, for the store
        self._recognized: dict[str, bytes] = {}  # topic suffix -> the last one (republished)

    def changes(self, changes: Changes) -> None:
        """Events in order, then counts, zone counts, lines and snapshots; every changed
        object snapshot into the store."""
        ended = []
        for event in changes.events:
            after = event["after"]
            self._labels[after["id"]] = after["label"]
            if event["type"] == "end":
                ended.append(after["id"])
            self._send(topics.EVENTS, compact(event))
        for update in changes.updates:
            body = compact(update)
            self._send(topics.TRACKED_OBJECT_UPDATE, body)
            self._remember(update, body)
        self.state(changes.counts, changes.zone_counts, changes.lines)
        for label, (_id, jpeg) in changes.snapshots.items():
            self._send(topics.snapshot(self.stream, label), jpeg, retain=True)
        if self.store is not None:
            for object_id, jpeg in changes.object_snapshots.items():
                self.store.put(object_id, jpeg, self._labels.get(object_id))
            for object_id, jpeg in changes.plate_snapshots.items():  # (after its snapshot)
                self.store.put_plate(object_id, jpeg)
        for object_id in ended:  # (an end's last snapshot came in the same changes)
            self._labels.pop(object_id, None)

    def state(self, counts: Mapping[str, int], zone_counts: Mapping[str, Mapping[str, int]],
              lines: Mapping[str, LineTotals]) -> None:
        """Retained counts, zone counts and line totals (the changed ones, or the whole state
        again after a reconnect)."""
        for label, n in counts.items():
            self._send(topics.count(self.stream, label), str(n).encode(), retain=True)
        for zone, by_label in zone_counts.items():
            for label, n in by_label.items():
                self._send(topics.zone_count(self.stream, zone, label), str(n).encode(),
                           retain=True)
        for line, totals in lines.items():
            self._send(topics.line_counts(self.stream, line), compact(totals), retain=True)

    def _remember(self, update: Mapping[str, Any], body: bytes) -> None:
        """A named face, or any plate read (known or not: Frigate's plate sensor shows the
        plate where no name is known), as the stream's last recognised one, retained. An
        unknown face is not one recognised: it stays on tracked_object_update only."""
        kind = {"face": "face", "lpr": "plate"}.get(str(update.get("type")))
        if kind is None or (kind == "face" and not update.get("name")):
            return
        suffix = topics.recognized(self.stream, kind)
        self._recognized[suffix] = body
        self._send(suffix, body, retain=True)

    def recognized(self) -> None:
        """The last recognised face and plate again (after a reconnect)."""
        for suffix, body in list(self._recognized.items()):
            self._send(suffix, body, retain=True)

    def _send(self, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        if self.publish is None:
            return
        self.publish("events", suffix, payload, retain=retain)
        self.messages += 1
