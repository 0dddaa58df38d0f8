"""Licence plates on tracked objects (Frigate's LPR, in edged's events room): a text cascade
reads each frame's plate crop; the reads of one object are voted so that its plate does not
flicker from frame to frame, and the winner is matched against the operator's known plates.

- **The vote** (`PlateVote`): a read counts when its score reaches `min_score` and its text,
  normalised (upper case, only letters and digits), is at least `min_length` long and fits
  `format` (a regex) where one is set. The object's plate is the text read most often; a new
  text takes over only when it has been read more often than the current one (a tie keeps
  the plate it has, so one confident misread between two good reads never shows). The
  plate's score is the mean of its reads' scores. Frigate keeps "the most confident result";
  a count lets three good reads of the truth beat one lucky misread. A read repeated exactly
  (a still picture, or frames the change gate held back) counts once.
- **Known plates** (`KnownPlates`): `{name: [plate, ...]}`; a plate entry is a literal
  (compared normalised, and tolerating `match_distance` edits: Levenshtein, as Frigate's
  `match_distance` tolerates characters) or a regex (any entry with regex characters, matched
  in full against the normalised text, as Frigate's known plates take `^ABC.*`). The first
  name whose entry matches, in the config's order, names the object (`sub_label`).
- **The plate's own picture**: each read comes with the picture the recogniser read (the
  plate's corners warped upright, or its crop), and the vote keeps, per text, the picture of
  its best-scoring read, so the object's plate picture is its winning text's best read (what
  Frigate keeps as an LPR event's plate crop). At most `MAX_VIEWS` texts keep one: a ninth
  text takes the place of the one read least often (never the winner's), when read as often.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from edged.core.schema import at_least, between, setting

MAX_VIEWS = 8  # texts of one object that keep their best read's picture
# A kept picture's longest side: a plate warped upright is well under it, but a text cascade
# on whole cars (`labels: [car], as: text`) reads the car's crop, and 8 full-size car crops an
# object would be megabytes held for a picture shown at plate size.
MAX_VIEW_SIDE = 320
_REGEX_CHARS = set(".^$*+?[](){}|\\")
_NOT_PLATE = re.compile(r"[^0-9A-Z\u0080-\uffff]")  # (CJK province characters are kept)


def _check_known(known: dict[str, list[str]]) -> str | None:
    for name, plates in known.items():
        if not name.strip():
            return "a known plate's name cannot be empty"
        if not plates:
            return f"{name!r} lists no plates"
        for plate in plates:
            if is_pattern(plate):
                try:
                    re.compile(plate)
                except re.error as exc:
                    return f"{name!r}: {plate!r} is not a valid regex ({exc})"
            elif not normalise(plate):
                return f"{name!r}: {plate!r} has no letters or digits"
    return None


def _check_format(pattern: str | None) -> str | None:
    if pattern is None:
        return None
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"{pattern!r} is not a valid regex ({exc})"
    return None


@dataclass(frozen=True)
class LprConfig:
    """Licence plates (`streams[].lpr`): the text a `secondary: [{as: text}]` cascade reads
    on a plate is voted over the object's frames, published as `recognized_license_plate` and
    matched against known plates (Frigate's fields and matching)."""

    enabled: bool = setting(False, "vote the text cascade's reads per tracked object and "
                                   "publish recognized_license_plate (+ _score) on its events")
    min_score: float = setting(0.8, "reads scoring below this do not vote (Frigate's "
                                    "recognition_threshold)", check=between(0, 1))
    min_length: int = setting(3, "reads shorter than this (letters and digits) do not vote",
                              check=at_least(1))
    format: str | None = setting(None, "a regex a plate must match in full (normalised: upper "
                                       "case, letters and digits only), e.g. '^[A-Z]{3}[0-9]{3}$'",
                                 check=_check_format)
    known_plates: dict[str, list[str]] = setting(
        factory=dict, help="name -> its plates; a plate is a literal (tolerating "
                           "match_distance differing characters) or a regex ('^ABC.*'); "
                           "the name becomes the object's sub_label", check=_check_known)
    match_distance: int = setting(1, "characters (edits) a literal known plate may differ by",
                                  check=between(0, 4))


def normalise(text: str) -> str:
    """Upper case, letters and digits only: 'mlb 803' and 'MLB-803' are one plate."""
    return _NOT_PLATE.sub("", text.upper())


def is_pattern(plate: str) -> bool:
    return bool(set(plate) & _REGEX_CHARS)


def edit_distance(a: str, b: str, limit: int) -> int:
    """Levenshtein distance, or `limit + 1` as soon as it must exceed `limit`."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1,
                               previous[j - 1] + (ca != cb)))
        if min(current) > limit:
            return limit + 1
        previous = current
    return previous[-1]


class KnownPlates:
    def __init__(self, known: Mapping[str, Sequence[str]], match_distance: int) -> None:
        self.distance = match_distance
        self._entries: list[tuple[str, str | None, re.Pattern[str] | None]] = []
        for name, plates in known.items():
            for plate in plates:
                if is_pattern(plate):
                    self._entries.append((name, None, re.compile(plate)))
                else:
                    self._entries.append((name, normalise(plate), None))

    def __bool__(self) -> bool:
        return bool(self._entries)

    def match(self, plate: str) -> str | None:
        """The name of the first known plate `plate` (normalised) is, or None."""
        text = normalise(plate)
        for name, literal, pattern in self._entries:
            if pattern is not None and pattern.fullmatch(text):
                return name
            if literal is not None and edit_distance(literal, text, self.distance) \
                    <= self.distance:
                return name
        return None


@dataclass
class PlateVote:
    """One object's reads."""

    cfg: LprConfig
    sums: dict[str, float] = field(default_factory=dict)
    reads: dict[str, int] = field(default_factory=dict)
    plate: str | None = None
    last: tuple[str, float] | None = None  # the last read, as it came
    # text -> (score, picture) of its best read (a copy, BGR); at most MAX_VIEWS texts
    views: dict[str, tuple[float, np.ndarray]] = field(default_factory=dict)

    def add(self, text: str | None, score: float | None, view: np.ndarray | None = None) -> bool:
        """One frame's read (and `view`, the picture read); True when the object's plate
        changed. A read that repeats the last one exactly (text and score: the same picture,
        or a frame the change gate held back, which hands on the last answer) counts once."""
        if text is None or score is None or score < self.cfg.min_score:
            return False
        if self.last == (text, float(score)):
            return False
        self.last = (text, float(score))
        plate = normalise(text)
        if len(plate) < self.cfg.min_length or (
                self.cfg.format is not None and not re.fullmatch(self.cfg.format, plate)):
            return False
        self.sums[plate] = self.sums.get(plate, 0.0) + float(score)
        self.reads[plate] = self.reads.get(plate, 0) + 1
        changed = self.plate is None or (plate != self.plate
                                         and self.reads[plate] > self.reads[self.plate])
        if changed:
            self.plate = plate
        if view is not None and view.size:
            self._keep_view(plate, float(score), view)
        return changed

    def best_view(self) -> tuple[float, np.ndarray] | None:
        """(score, picture) of the voted plate's best read, or None (no picture of it)."""
        return self.views.get(self.plate) if self.plate is not None else None

    def _keep_view(self, plate: str, score: float, view: np.ndarray) -> None:
        held = self.views.get(plate)
        if held is not None and held[0] >= score:
            return
        if held is None and len(self.views) >= MAX_VIEWS:
            weakest = min((p for p in self.views if p != self.plate),
                          key=lambda p: (self.reads[p], self.views[p][0]), default=None)
            if weakest is None or self.reads[weakest] > self.reads[plate]:
                return
            del self.views[weakest]
        # a copy: the view may be the frame's own pixels, which the next frame overwrites
        self.views[plate] = (score, _bounded_copy(view))

    @property
    def score(self) -> float | None:
        """The mean score of the plate's reads."""
        if self.plate is None:
            return None
        return round(self.sums[self.plate] / self.reads[self.plate], 4)


def _bounded_copy(view: np.ndarray) -> np.ndarray:
    """The picture as kept: a copy, shrunk (INTER_AREA) to MAX_VIEW_SIDE on its longest side
    when it is larger."""
    height, width = view.shape[:2]
    side = max(height, width)
    if side <= MAX_VIEW_SIDE:
        return np.array(view, copy=True, order="C")
    factor = MAX_VIEW_SIDE / side
    size = (max(1, round(width * factor)), max(1, round(height * factor)))
    return cv2.resize(np.ascontiguousarray(view), size, interpolation=cv2.INTER_AREA)


class Plates:
    """A stream's plate reading: each object's vote, its known name as its sub_label, and the
    `lpr` updates (Frigate's `tracked_object_update`) when an announced object's plate is
    first read or changes."""

    def __init__(self, cfg: LprConfig) -> None:
        self.cfg = cfg
        self.known = KnownPlates(cfg.known_plates, cfg.match_distance)

    def observe(self, obj: Any, text: str | None, score: float | None,
                view: np.ndarray | None = None) -> None:
        """This frame's read of `obj` (a TrackedObject) and the picture read; its plate and
        name follow the vote."""
        if obj.plate is None:
            obj.plate = PlateVote(self.cfg)
        if not obj.plate.add(text, score, view):
            return
        name = self.known.match(obj.plate.plate) if self.known else None
        if name is not None:
            obj.sub_label, obj.sub_label_score = name, obj.plate.score
        elif obj.plate_name is not None:  # it was a known plate, now read as another
            obj.sub_label = obj.sub_label_score = None
        obj.plate_name = name

    @staticmethod
    def update(obj: Any, stream: str, timestamp: float) -> dict[str, Any] | None:
        """The `lpr` update of an announced object whose plate was not yet told, or None."""
        vote = obj.plate
        if obj.id is None or vote is None or vote.plate is None or vote.plate == obj.plate_sent:
            return None
        obj.plate_sent = vote.plate
        return {"type": "lpr", "id": obj.id, "stream": stream, "camera": stream,
                "name": obj.plate_name, "known": obj.plate_name is not None,
                "plate": vote.plate, "score": vote.score, "timestamp": timestamp}
