"""Presence: a slow gallery read (a change behind a 10,000-row reindex) does not hold the
streams' frame loops."""

from __future__ import annotations

import threading

from edged.streams.presence_hub import PresenceHub


class Sent:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def publish(self, kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        self.sent.append((suffix, payload))


def test_hub_when_a_gallery_read_is_slow_a_streams_seen_does_not_wait_for_it() -> None:
    """faces_from reads the gallery (its lock, a SQLite query) under the hub's lock, which
    every stream's events stage takes from its frame loop (`seen`): a deletion's or a
    bulk enrolment's reindex then stalls the streams (measured: 214 ms worst `seen` during
    4 deletions on a 10 000-entry gallery, 8 ms before; 1.8 s behind a 20 000-face
    add_many). The read is held open here; `seen` must not wait for it."""
    out = Sent()
    hub = PresenceHub(out.publish, None, None, off_delay_s=30.0)
    entered, release = threading.Event(), threading.Event()

    def read() -> list[str]:
        entered.set()
        release.wait(5)
        return ["Ana"]

    reader = threading.Thread(target=hub.faces_from, args=(read,))
    reader.start()
    assert entered.wait(5)
    seen = threading.Thread(target=hub.seen, args=("cam#1", frozenset({("face", "Ana")})))
    seen.start()
    seen.join(1.0)
    stalled = seen.is_alive()
    release.set()
    reader.join(5)
    seen.join(5)
    hub.close()
    assert not stalled, "a stream's seen() waited for the gallery read"
