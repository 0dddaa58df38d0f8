"""Presence sensors' faults a second read found: two gallery changes from two API threads at
once, a plain name spelling another name's token, a known plate's name UTF-8 cannot write."""

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
    """The daemon's watcher hands the hub a way to read the names (`faces_from`), read under
    the hub's lock: an enrolment whose read is held up holds the next one's watcher back, so
    the hub ends with the newest list. (Read first and handed in after, as before, enrolment
    A's older ["Ana"] reached the hub after B's ["Ana", "Bo"] and withdrew Bo's sensor.) The
    window is held open: A's read waits until B's enrolment is over, or a second."""
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
    gallery.watch(lambda: hub.faces_from(gallery.enrolled))  # as the daemon does
    a = threading.Thread(name="A", target=lambda: gallery.add(
        "Ana", np.eye(8, dtype=np.float32)[0], "emb:1"))
    b = threading.Thread(name="B", target=lambda: gallery.add(
        "Bo", np.eye(8, dtype=np.float32)[1], "emb:1"))
    a.start()
    assert read.wait(5)
    b.start()
    # B's enrolment ends here when its watcher need not wait for A's (what went wrong), and
    # waits on the hub's lock, which A's read holds, when it must
    b.join(1.0)
    release.set()
    a.join(5)
    b.join(5)
    assert sorted(gallery.enrolled()) == ["Ana", "Bo"]
    states = dict(out.sent)
    assert states["presence/face/Ana"] == b"OFF" and states["presence/face/Bo"] == b"OFF", \
        out.sent
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


def test_config_when_a_known_plate_name_has_a_lone_surrogate_refuses_it_naming_the_line(
        ) -> None:
    """YAML's "\\ud800" escape makes a str no UTF-8 writer takes; as a known plate's name it
    reached presence's token (`name.encode()`) at the stream's start and stopped the daemon
    with a traceback. The config refuses such strings now, keys and values, naming the
    line; token() itself no longer raises on one."""
    import pytest
    from support.events import stream

    from edged.core.errors import ConfigError
    from edged.events.presence import token

    keys = ('lpr: {enabled: true, known_plates: {"Van \\ud800": [ABC123]}}\n'
            'secondary: [{model: r, labels: [car], as: text}]\n')
    with pytest.raises(ConfigError, match="lone surrogate") as caught:
        stream(keys)
    assert any(issue.line for issue in caught.value.issues), caught.value.issues
    with pytest.raises(ConfigError, match="lone surrogate"):
        stream('lpr: {enabled: true, known_plates: {Van: ["AB\\udc00C"]}}\n'
               'secondary: [{model: r, labels: [car], as: text}]\n')
    assert token("Van \ud800").startswith("Van_")


def test_hub_when_a_republish_meets_a_removal_leaves_the_removal_last() -> None:
    """A reconnect's republish (paho's thread) and a removal (a deletion, a reload) at once:
    the configs are sent under the hub's lock, so the republished old config cannot reach the
    broker after the empty one that removed it (a ghost entity until the next change)."""
    from edged.streams.events_stage import EventsHub

    entered, go = threading.Event(), threading.Event()

    class SlowLink:
        def __init__(self) -> None:
            self.sent: list[tuple[str, bytes]] = []

        def publish(self, *args: object, **kwargs: object) -> None:
            pass

        def publish_to(self, kind: str, topic: str, payload: bytes, *,
                       retain: bool = False) -> None:
            if threading.current_thread().name == "R" and not entered.is_set():
                entered.set()
                go.wait(5)  # the republish is preempted in the middle of its sends
            self.sent.append((topic, payload))

    link = SlowLink()
    hub = EventsHub(link, device=None)  # type: ignore[arg-type]
    hub.announce("cam", {"homeassistant/sensor/x/config": b"old"})
    republish = threading.Thread(name="R", target=hub.republish)
    republish.start()
    assert entered.wait(5)
    removal = threading.Thread(target=hub.withdraw, args=("cam",))
    removal.start()
    removal.join(1.0)  # done here when it need not wait for the republish (what went wrong)
    go.set()
    republish.join(5)
    removal.join(5)
    said = [p for t, p in link.sent if t == "homeassistant/sensor/x/config"]
    assert said[-1] == b"", said
    hub.presence.close()
