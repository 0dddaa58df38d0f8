"""State classification: a region of the frame read by a classifier (the test repository's
`colors` model) every interval or when the region changed, published once per change after
`debounce` agreeing reads, retained per state and on state_changes, in the published schema;
a region outside the frame, or a model that is no classifier, is a config error naming the
key."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from support.events import stream

from edged.config import parse_config
from edged.core.errors import ConfigError
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.streams.state_config import StateConfig
from edged.streams.states import Debounce, StateWatcher, pixel_box

SCHEMA = json.loads((Path(__file__).resolve().parents[3] / "docs" / "schemas" /
                     "state-change.schema.json").read_text())
RED, GREEN = (0, 0, 255), (0, 255, 0)  # BGR


def test_debounce_when_reads_flicker_changes_only_after_k_in_a_row() -> None:
    debounce = Debounce(2)
    reads = ["open", "open", "shut", "open", "shut", "shut", "shut", "open"]
    assert [debounce.read(r) for r in reads] == [False, True, False, False, False, True,
                                                 False, False]
    assert debounce.state == "shut"


def test_debounce_when_k_is_one_follows_every_read() -> None:
    debounce = Debounce(1)
    assert [debounce.read(r) for r in ["a", "a", "b"]] == [True, False, True]


def picture(colour: tuple[int, int, int]) -> np.ndarray:
    frame = np.zeros((120, 160, 3), np.uint8)
    frame[20:60, 100:150] = colour  # the region: a spot whose colour is its state
    return frame


def test_state_when_the_region_changes_colour_publishes_once_per_change(
        core: tuple[ModelCache, Scheduler]) -> None:
    sent: list[tuple[str, dict, bool]] = []
    cfg = StateConfig("spot", "colors", [[100, 20], [150, 60]], interval_s=100.0, debounce=2,
                      change_threshold=0.01)
    watcher = StateWatcher("drive", cfg, "streams[0].states[0]", core[1],
                           lambda topic, body, retain: sent.append(
                               (topic, json.loads(body), retain)))
    frames = [picture(RED)] * 4 + [picture(GREEN)] * 4
    changed = [watcher.frame(f, 1000.0 + i, float(i)) for i, f in enumerate(frames)]
    # red read first (nothing seen yet) and confirmed on the next frame; then nothing read
    # until the region's picture changes (green), confirmed on the next frame likewise
    assert changed == [False, True, False, False, False, True, False, False]
    assert watcher.reads == 4
    retained = [body for topic, body, _ in sent if topic == "streams/drive/states/spot"]
    assert [(b["previous"], b["state"]) for b in retained] == [(None, "red"), ("red", "green")]
    for topic, body, retain in sent:
        jsonschema.validate(body, SCHEMA)
        assert retain == (topic != "state_changes")


def test_state_when_read_every_frame_debounces_a_single_odd_read(
        core: tuple[ModelCache, Scheduler]) -> None:
    sent: list[tuple[str, dict, bool]] = []
    cfg = StateConfig("spot", "colors", [[100, 20], [150, 60]], interval_s=0.1, debounce=2,
                      on_change=False)
    watcher = StateWatcher("drive", cfg, "streams[0].states[0]", core[1],
                           lambda topic, body, retain: sent.append(
                               (topic, json.loads(body), retain)))
    colours = [RED, RED, GREEN, RED, RED, GREEN, GREEN, GREEN]
    changed = [watcher.frame(picture(c), 1000.0 + i, float(i)) for i, c in enumerate(colours)]
    assert changed == [False, True, False, False, False, False, True, False]
    retained = [body for topic, body, _ in sent if topic == "streams/drive/states/spot"]
    assert [(b["previous"], b["state"]) for b in retained] == [(None, "red"), ("red", "green")]
    assert [b["time"] for b in retained] == [1001.0, 1006.0]
    changes = [body for topic, body, _ in sent if topic == "state_changes"]
    assert [b["type"] for b in changes] == ["state", "state"]
    for _, body, _ in sent:
        jsonschema.validate(body, SCHEMA)
    assert watcher.view() == {"state": "green", "score": retained[-1]["score"],
                              "since": 1006.0}


def test_state_when_only_the_picture_outside_the_region_changes_is_not_read_again(
        core: tuple[ModelCache, Scheduler]) -> None:
    cfg = StateConfig("spot", "colors", [[100, 20], [150, 60]], interval_s=100.0, debounce=1)
    watcher = StateWatcher("drive", cfg, "k", core[1], None)
    first = picture(RED)
    second = first.copy()
    second[80:120, 0:80] = 255  # a change elsewhere
    watcher.frame(first, 1000.0, 0.0)
    watcher.frame(second, 1001.0, 1.0)
    assert watcher.reads == 1
    third = second.copy()
    third[20:60, 100:150] = GREEN
    assert watcher.frame(third, 1002.0, 2.0) is True and watcher.state == "green"


def test_state_when_its_region_is_outside_the_frame_is_a_config_error_naming_the_key(
        core: tuple[ModelCache, Scheduler]) -> None:
    cfg = StateConfig("spot", "colors", [[100, 20], [400, 60]])
    with pytest.raises(ConfigError, match=r"streams\[0\]\.states\[0\]\.region: .*outside the "
                                          r"160x120 frame"):
        pixel_box(cfg, 160, 120, "streams[0].states[0]")
    watcher = StateWatcher("drive", cfg, "streams[0].states[0]", core[1], None)
    assert watcher.frame(picture(RED), 1000.0, 0.0) is False
    assert watcher.disabled is not None and "states[0].region" in watcher.disabled


def test_state_when_in_fractions_is_read_at_any_frame_size() -> None:
    cfg = StateConfig("spot", "colors", [[0.5, 0.25], [1.0, 0.5]], units="fractions")
    assert pixel_box(cfg, 160, 120, "k") == (80, 30, 160, 60)
    assert pixel_box(cfg, 1920, 1080, "k") == (960, 270, 1920, 540)


def test_state_when_its_model_is_no_classifier_is_refused(
        core: tuple[ModelCache, Scheduler]) -> None:
    cfg = StateConfig("spot", "tiny_cnn", [[0, 0], [10, 10]])  # raw: no classes
    with pytest.raises(ConfigError, match=r"streams\[0\]\.states\[0\]\.model: .*not a "
                                          r"classify model"):
        StateWatcher("drive", cfg, "streams[0].states[0]", core[1], None)


@pytest.mark.parametrize(("keys", "error"), [
    ("states: [{name: spot, model: colors, region: [[0.2, 0.2], [1.5, 0.5]], "
     "units: fractions}]", r"states\[0\]\.region: .*outside fractions"),
    ("size: [640, 480]\nstates: [{name: spot, model: colors, region: [[0, 0], [700, 10]]}]",
     r"states\[0\]\.region: .*outside the stream's size 640x480"),
    ("states: [{name: spot, model: colors, region: [[0, 0], [0, 10]]}]",
     r"states\[0\]\.region: the region has no area"),
    ("states: [{name: spot, model: colors, region: [[0, 0], [5, 5]]}, "
     "{name: spot, model: colors, region: [[0, 0], [5, 5]]}]", r"states\[1\]\.name: duplicate"),
    ("states: [{name: spot, model: colors, region: [[0, 0], [5, 5]], every_s: 3}]",
     r"every_s"),
])
def test_states_config_when_wrong_names_the_key(keys: str, error: str) -> None:
    with pytest.raises(ConfigError, match=error):
        stream(keys)


def test_states_config_when_the_stream_is_a_sensor_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"streams\[0\]\.states: states classify regions"):
        parse_config("streams:\n  - {name: t, source: 'mqtt://sensors/t', model: m, "
                     "states: [{name: spot, model: colors, region: [[0, 0], [5, 5]]}]}\n")


def test_state_when_a_candidate_is_followed_by_doubtful_reads_gives_it_up_and_waits_for_the_gate(
        core: tuple[ModelCache, Scheduler]) -> None:
    """A confident odd read waits for its confirmation on the next frames, whatever the gate;
    reads under min_score that follow give the candidate up, and an unchanged picture is then
    not read again until interval_s (it was read at every frame, for ever)."""
    cfg = StateConfig("spot", "colors", [[100, 20], [150, 60]], interval_s=100.0, debounce=2,
                      min_score=0.5)
    watcher = StateWatcher("drive", cfg, "k", core[1], None)
    reads = iter([("red", 0.9), ("red", 0.9), ("green", 0.9)] + [("green", 0.4)] * 20)
    watcher._classify = lambda region: next(reads)  # type: ignore[method-assign]
    still = picture(RED)
    watcher.frame(still, 1000.0, 0.0)
    assert watcher.frame(still, 1001.0, 1.0) is True and watcher.state == "red"
    changed = still.copy()
    changed[20:60, 100:150] = GREEN  # the picture changes once: a confident "green"
    watcher.frame(changed, 1002.0, 2.0)
    assert watcher.debounce.candidate == "green"
    for i in range(10):  # then the same picture, read with doubt once, and not again
        watcher.frame(changed, 1003.0 + i, 3.0 + i)
    assert watcher.reads == 4 and watcher.state == "red"
