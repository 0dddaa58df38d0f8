"""Which objects get a clip: `clips.labels` and `clips.zones` pick them as Frigate's required
zones do (an object qualifies once it entered one of the zones)."""

from __future__ import annotations

import pytest

from edged.streams.events_stage import wants_clip


@pytest.mark.parametrize(("labels", "zones", "label", "entered", "expected"), [
    ([], [], "car", [], True),
    (["person"], [], "car", [], False),
    (["person", "car"], [], "car", [], True),
    ([], ["door"], "car", [], False),
    ([], ["door"], "car", ["street"], False),
    ([], ["door"], "car", ["street", "door"], True),
    (["car"], ["door"], "person", ["door"], False),
])
def test_wants_clip_when_labels_and_zones_are_set_picks_like_required_zones(
        labels: list[str], zones: list[str], label: str, entered: list[str],
        expected: bool) -> None:
    assert wants_clip(labels, zones, {"label": label, "entered_zones": entered}) is expected
