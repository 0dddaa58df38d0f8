"""Review findings (branch hrev): presence sensors' known names when the gallery changes from
two API threads at once. These tests FAIL on the reviewed code; they show the defect."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

from edged.galleries.store import Gallery
from edged.streams.presence_hub import PresenceHub


class Sent:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        self.sent.append((suffix, payload))


def test_hub_when_two_enrolments_race_keeps_both_names_announced(tmp_path: Path) -> None:
    """The daemon's watcher (edged/daemon.py: `gallery.watch(lambda: presence.faces_known(
    gallery.enrolled()))`) reads the names, then takes the hub's lock: an enrolment whose
    watcher read before another's but reaches the hub after it hands the hub the older list,
    and the newer name is removed (retained state emptied, discovery config dropped) until
    the next gallery change. Here the window is held open deterministically."""
    gallery = Gallery(tmp_path / "faces.sqlite", max_entries=10, max_unknowns=10)
    out = Sent()
    hub = PresenceHub(out.publish, None, None, off_delay_s=0.0)
    read, release = threading.Event(), threading.Event()
    original = gallery.enrolled

    def slow_first_read() -> list[str]:  # thread A: reads, then is preempted
        names = original()
        if threading.current_thread().name == "A":
            read.set()
            release.wait(5)
        return names

    gallery.enrolled = slow_first_read  # type: ignore[method-assign]
    gallery.watch(lambda: hub.faces_known(gallery.enrolled()))  # as the daemon does
    a = threading.Thread(name="A", target=lambda: gallery.add(
        "Ana", np.eye(8, dtype=np.float32)[0], "emb:1"))
    a.start()
    assert read.wait(5)
    gallery.add("Bo", np.eye(8, dtype=np.float32)[1], "emb:1")  # thread B (here: main)
    release.set()
    a.join(5)
    assert sorted(gallery.enrolled()) == ["Ana", "Bo"]
    # Bo is enrolled, but the hub was last told ["Ana"]: his sensor was withdrawn
    assert out.sent[-1] != ("presence/face/Bo", b""), out.sent
    hub.close()
    gallery.close()


def test_token_when_a_plain_name_spells_another_names_token_is_not_shared() -> None:
    """docs/events.md: 'never one token for two names'; presence.token passes a plain ASCII
    name through as it is, so a plain name that happens to spell another name's slug_hash
    (a valid gallery name: letters, digits and `_`; any known plate name) shares its topic
    level and Home Assistant unique_id (presence_configs keeps one config of the two)."""
    from edged.events.discovery import DeviceInfo, presence_configs
    from edged.events.presence import token

    fancy = "Ana María"
    plain = token(fancy)  # 'Ana_Mar_a_<10 hex>': itself a valid gallery name
    configs = presence_configs(DeviceInfo("edge-01", "edged/edge-01", "homeassistant", "1"),
                               [("face", fancy), ("face", plain)])
    assert token(plain) != token(fancy)
    assert len(configs) == 2


def test_stage_when_a_known_plate_name_has_a_lone_surrogate_is_refused_as_config() -> None:
    """YAML's "\\ud800" escape makes a str Python cannot encode as UTF-8. The config takes it
    as a known plate's name; with MQTT on, EventsHub.stage -> presence.plates_known ->
    token(name) -> name.encode() raises UnicodeEncodeError, which StreamSet._open (catching
    EdgedError only) lets out of streams.start: the daemon's start fails with a traceback
    instead of a ConfigError naming the key (or the stream starting)."""
    import pytest
    from support.events import stream

    from edged.core.errors import ConfigError
    from edged.streams.events_stage import EventsHub

    class Link:
        def publish(self, *args: object, **kwargs: object) -> None:
            pass

        def publish_to(self, *args: object, **kwargs: object) -> None:
            pass

    keys = ('lpr: {enabled: true, known_plates: {"Van \\ud800": [ABC123]}}\n'
            'secondary: [{model: r, labels: [car], as: text}]\n')
    try:
        cfg = stream(keys)
    except ConfigError:
        return  # refused where it is read: fine
    hub = EventsHub(Link(), device=None)  # type: ignore[arg-type]
    try:
        hub.stage(cfg, ["car"])
    except ConfigError:
        return
    except UnicodeEncodeError as exc:
        pytest.fail(f"untyped error out of EventsHub.stage: {exc!r}")
