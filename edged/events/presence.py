"""Who is here: per name, whether a tracked object with that name is in view on any stream.

A name is a face's enrolled name (the gallery's) or a known plate's (`lpr.known_plates`); its
kind is `face` or `plate`. Each stream says which (kind, name) pairs its live announced
objects carry (`StreamEvents.present`); a name is present while any stream has it. It turns
on at once and off only `off_delay_s` after the last stream let it go, so a track lost for a
moment (a face turned away, a car behind a van) does not toggle it. Nothing here does I/O or
keeps time of its own: callers pass a monotonic `now`, and ask `due(now)` for the offs whose
delay is over (`next_due()` says when to ask).

Names may be any Unicode (a gallery's names are letters of any script, spaces, `.`, `'`, `-`;
a known plate's name is any YAML key), so they become topic levels and Home Assistant ids
through `token`: a name of ASCII letters, digits, `_` and `-` stays as it is (unless it ends
as a hashed token does: `_` and ten hex digits); any other becomes its slug and a hash of the
exact name, so no two names share a token and none can
add a topic level, a wildcard or a character Home Assistant refuses in an id.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

Name = tuple[str, str]  # (kind, name): ("face", "Ana"), ("plate", "Neighbour")
Change = tuple[str, str, bool]  # (kind, name, present)
KINDS = ("face", "plate")

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_NOT_ID = re.compile(r"[^A-Za-z0-9]+")
_HASHED = re.compile(r".*_[0-9a-f]{10}")  # what a hashed token ends with


def token(name: str) -> str:
    """The name as one topic level and part of a Home Assistant id: itself when it is ASCII
    letters, digits, `_` and `-` (up to 64, starting with a letter or digit), else its slug
    (up to 40) and the first 10 hex digits of its UTF-8 SHA-256, e.g. `Ana_Lopez_1f0c...`,
    `x_<hash>` for a name with no ASCII letter or digit."""
    if _SAFE.fullmatch(name) and not _HASHED.fullmatch(name):
        return name
    # (a plain name that ends as a hashed token does is hashed too: else "Ana_Mar_a_<hash of
    # 'Ana María'>" would be its own token and share that one; surrogatepass: a lone
    # surrogate, which the config refuses, still gets a token rather than an exception)
    slug = _NOT_ID.sub("_", name).strip("_")[:40].rstrip("_") or "x"
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{slug}_{digest}"


class Presence:
    """The present names across streams, with the off delay."""

    def __init__(self, off_delay_s: float) -> None:
        self.off_delay_s = off_delay_s
        self._streams: dict[str, frozenset[Name]] = {}
        self._on: set[Name] = set()  # present as last said (on, or in its off delay)
        self._leaving: dict[Name, float] = {}  # name -> when it turns off (no stream has it)

    def update(self, stream: str, names: Iterable[Name], now: float) -> list[Change]:
        """A stream's present names now (empty: none, or the stream stopped); the changes to
        say now: names turned on, and with no off delay the ones turned off."""
        held = frozenset(names)
        if held:
            self._streams[stream] = held
        else:
            self._streams.pop(stream, None)
        everywhere = self.names()
        changes: list[Change] = []
        for name in sorted(everywhere):
            self._leaving.pop(name, None)
            if name not in self._on:
                self._on.add(name)
                changes.append((*name, True))
        for name in sorted(self._on - everywhere):
            self._leaving.setdefault(name, now + self.off_delay_s)
        return changes + self.due(now)

    def due(self, now: float) -> list[Change]:
        """The names whose off delay is over: off now."""
        gone = sorted(name for name, at in self._leaving.items() if at <= now)
        for name in gone:
            del self._leaving[name]
            self._on.discard(name)
        return [(*name, False) for name in gone]

    def next_due(self) -> float | None:
        """When the next off falls due (None: none waits)."""
        return min(self._leaving.values(), default=None)

    def names(self) -> set[Name]:
        """The names some stream has now."""
        return set().union(*self._streams.values()) if self._streams else set()

    def present(self, kind: str, name: str) -> bool:
        """Whether the name is on as last said (in its off delay included)."""
        return (kind, name) in self._on
