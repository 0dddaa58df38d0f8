"""The plate's own picture where nothing keeps it: no event says there is one."""

from __future__ import annotations

from typing import Any

import numpy as np
from support.events import T0, det, stream

from edged.processing.detections import Detections
from edged.streams.events_stage import EventsHub

LPR = """
    lpr: {enabled: true, min_score: 0.5}
    secondary: [{model: plate_rec, labels: [car], as: text}]
    snapshots: {enabled: true}
    track: {min_hits: 2, max_age_s: 0.3, update_interval_s: 0}
"""


class Link:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def publish(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        if suffix == "events":
            import json
            self.events.append(json.loads(payload))

    def publish_to(self, kind: str, topic: str, payload: bytes, *,
                   retain: bool = False) -> None:
        pass


def test_events_when_no_store_keeps_plate_pictures_do_not_say_there_is_one() -> None:
    """`cache.snapshots_mb: 0` (or a snapshot folder that could not be opened): the hub has no
    store, so no plate picture is kept anywhere (it has no MQTT topic either, unlike the
    object's snapshot) and GET /v2/edged/snapshots/<id>/plate answers 404: the events said
    `has_plate_snapshot: true` all the same (docs/schemas/events.schema.json: 'kept with its
    snapshot and served by GET .../plate'), and the status page drew a broken <img>."""
    link = Link()
    hub = EventsHub(link, device=None, store=None)  # as open_store returns for snapshots_mb 0
    stage = hub.stage(stream(LPR), ["car"])
    for i in range(4):
        row = det((100, 100, 300, 200), label="car", text="MLB803", text_score=0.9 + i / 100)
        found = Detections.from_rows([row])
        found.text_views[0] = np.full((20, 60, 3), 50, np.uint8)
        stage.frame(T0 + i / 10, found, np.zeros((480, 640, 3), np.uint8))
    stage.close()
    said = [e["after"].get("has_plate_snapshot") for e in link.events]
    assert said and not any(said), said
