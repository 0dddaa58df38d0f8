"""Presence in the running daemon: the names to announce (the gallery's enrolled faces, the
streams' known plates), their Home Assistant binary sensors, and their retained `ON`/`OFF` on
`<prefix>/presence/<kind>/<token>` as the streams' objects come and go (`edged/events/
presence.py` decides; this publishes, and wakes itself for the offs its delay holds back).

The streams' threads, the API's (an enrolment, a deletion) and its own timer call in; one
lock orders what is published, so an `ON` and its `OFF` never cross on the way to the link.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Literal, Protocol

from edged.events.discovery import DeviceInfo, presence_configs
from edged.events.presence import Change, Name, Presence, token
from edged.mqtt import topics

logger = logging.getLogger(__name__)

ON, OFF = b"ON", b"OFF"
DEFAULT_OFF_DELAY_S = 30.0  # (mqtt.presence_off_delay_s)
ANNOUNCED_AS = ""  # the key of presence's discovery configs among the streams' (no stream's)


class Publish(Protocol):
    def __call__(self, kind: Literal["events"], suffix: str, payload: bytes, *,
                 retain: bool = False) -> None: ...


class PresenceHub:
    """`publish`: the link's (None: MQTT is off, nothing is said); `announce(key, configs)`:
    the events hub's discovery diffing (None: no discovery)."""

    def __init__(self, publish: Publish | None, device: DeviceInfo | None,
                 announce: Callable[[str, dict[str, bytes]], None] | None, *,
                 off_delay_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.publish = publish
        self.device = device
        self.announce = announce
        self.clock = clock
        self.presence = Presence(off_delay_s)
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # orders the gallery's reads (faces_from)
        self._faces: frozenset[str] = frozenset()
        self._plates: dict[str, frozenset[str]] = {}  # stream -> its known plates' names
        self._known: frozenset[Name] = frozenset()  # announced: faces and every stream's plates
        self._timer: threading.Timer | None = None
        self._closed = False

    def faces_known(self, names: Iterable[str]) -> None:
        """The gallery's enrolled names now (after an enrolment or a deletion)."""
        with self._lock:
            self._faces = frozenset(names)
            self._rename()

    def faces_from(self, read: Callable[[], Iterable[str]]) -> None:
        """`faces_known(read())` with the names read under a lock of their own, held until
        the hub has them: two gallery changes in two threads then reach the hub in the order
        they read, so the last list the hub keeps is the newest (read first and handed in
        after, an older list could withdraw a name just enrolled). Not the hub's lock: the
        streams' frame loops (`seen`) take that one and must not wait for the gallery (a
        read behind a 10,000-row change). The gallery calls its watchers outside its own
        lock, so the locks are only ever taken reading, gallery, hub."""
        with self._reading:
            names = frozenset(read())
            with self._lock:
                self._faces = names
                self._rename()

    def plates_known(self, stream: str, names: Iterable[str]) -> None:
        """A stream's known plates' names (none: it reads no plates, or it is gone)."""
        with self._lock:
            held = frozenset(names)
            if held:
                self._plates[stream] = held
            else:
                self._plates.pop(stream, None)
            self._rename()

    def seen(self, stream: str, names: Iterable[Name]) -> None:
        """The names a stream's live objects carry now (from its thread; `stream`: whatever
        key the stream's events stage goes by)."""
        with self._lock:
            self._say(self.presence.update(stream, names, self.clock()))
            self._arm()

    def republish(self) -> None:
        """Every announced name's state again (after a reconnect)."""
        with self._lock:
            for kind, name in sorted(self._known):
                self._send(kind, name, ON if self.presence.present(kind, name) else OFF)

    def close(self) -> None:
        """Off now for every announced name still on (the streams have stopped: a daemon
        that is down sees no one), and no more timers."""
        with self._lock:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            for kind, name in sorted(self._known):
                if self.presence.present(kind, name):
                    self._send(kind, name, OFF)

    def _rename(self) -> None:
        """Announce the names known now, each with its state; remove the ones gone (their
        discovery config and their retained state emptied)."""
        known = frozenset({("face", n) for n in self._faces}
                          | {("plate", n) for names in self._plates.values() for n in names})
        before, self._known = self._known, known
        if self.announce is not None and self.device is not None and known != before:
            self.announce(ANNOUNCED_AS, presence_configs(self.device, known))
        for kind, name in sorted(before - known):
            self._send(kind, name, b"")
        for kind, name in sorted(known - before):
            self._send(kind, name, ON if self.presence.present(kind, name) else OFF)

    def _say(self, changes: list[Change]) -> None:
        for kind, name, present in changes:
            if (kind, name) in self._known:  # (a name deleted while in view: not said)
                self._send(kind, name, ON if present else OFF)

    def _send(self, kind: str, name: str, payload: bytes) -> None:
        if self.publish is not None:
            self.publish("events", topics.presence(kind, token(name)), payload, retain=True)

    def _arm(self) -> None:
        """A timer for the next off the delay holds back (replacing the last)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self.presence.next_due()
        if due is None or self._closed:
            return
        self._timer = threading.Timer(max(0.0, due - self.clock()), self._wake)
        self._timer.daemon = True
        self._timer.start()

    def _wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._say(self.presence.due(self.clock()))
            self._arm()
