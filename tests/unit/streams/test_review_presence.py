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
