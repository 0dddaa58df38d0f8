"""What a describer is asked: the subject (an ended event's data, its best snapshot, its path)
made into chat messages for a text model (the data only) or a vision model (the data and the
snapshot as an image data URL), and the key an answer is cached under."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from edged.describer.summary import SCHEMA

MAX_PATH_POINTS = 16  # the path's points in the prompt at most (evenly picked)

SYSTEM = (
    "You review events from a security camera and answer with one JSON object, nothing "
    "else, with these keys: title (under 10 words: the activity and where), scene (what "
    "happens from start to finish), shortSummary (two sentences for a notification), "
    "confidence (a decimal from 0 to 1), potential_threat_level (0 = normal activity, 1 = "
    "suspicious, 2 = an active threat), other_concerns (a list of strings, may be empty). "
    "Say only what the data {seen} shows.")


@dataclass(frozen=True)
class Subject:
    """One ended event to describe. `event`: its `end` payload's `after` (as published on
    `<prefix>/events`); `jpeg`: its best snapshot (None: snapshots off); `path`: where it
    went, [seconds since its start, x, y] of its box's bottom centre in frame pixels;
    `crossings`: the lines it crossed, (line, "in" | "out") in order."""

    object_id: str
    stream: str
    event: Mapping[str, Any]
    jpeg: bytes | None = None
    path: Sequence[tuple[float, float, float]] = field(default_factory=tuple)
    crossings: Sequence[tuple[str, str]] = field(default_factory=tuple)

    @property
    def label(self) -> str:
        return str(self.event.get("label", ""))

    @property
    def duration_s(self) -> float:
        start, end = self.event.get("start_time"), self.event.get("end_time")
        return max(0.0, float(end) - float(start)) if start is not None and end is not None \
            else 0.0


def facts(subject: Subject, *, times: bool = True) -> dict[str, Any]:
    """The event's data as the model reads it; `times` False leaves out what differs at
    every event (its id and clock times), for the cache key."""
    event = subject.event
    data: dict[str, Any] = {"camera": subject.stream, "object": subject.label}
    if event.get("sub_label"):
        data["identified_as"] = event["sub_label"]
    data["top_score"] = event.get("top_score")
    if times:
        for key in ("start_time", "end_time"):
            if event.get(key) is not None:
                data[key] = _iso(float(event[key]))
    data["duration_s"] = round(subject.duration_s, 1)
    data["zones_entered"] = list(event.get("entered_zones") or [])
    if subject.crossings:
        data["lines_crossed"] = [{"line": line, "direction": direction}
                                 for line, direction in subject.crossings]
    if event.get("box"):
        data["last_box"] = [round(float(v)) for v in event["box"]]
    if subject.path:
        data["path"] = [[round(t, 1), round(x), round(y)] for t, x, y in thin(subject.path)]
    return data


def messages(subject: Subject, *, vision: bool, instructions: str = ""
             ) -> list[dict[str, Any]]:
    """Chat messages asking for the subject's review summary: the data as JSON text, and for
    a vision model with a snapshot, the picture as an image part."""
    seen = "and the picture" if vision and subject.jpeg is not None else ""
    system = SYSTEM.format(seen=seen).replace("  ", " ")
    if instructions:
        system += " " + instructions.strip()
    text = "Event: " + json.dumps(facts(subject), separators=(",", ":"))
    if not (vision and subject.jpeg is not None):
        return [{"role": "system", "content": system}, {"role": "user", "content": text}]
    url = "data:image/jpeg;base64," + base64.b64encode(subject.jpeg).decode()
    return [{"role": "system", "content": system},
            {"role": "user", "content": [{"type": "text", "text": text},
                                         {"type": "image_url", "image_url": {"url": url}}]}]


def cache_key(subject: Subject, *, vision: bool, model: str, instructions: str) -> str:
    """What an answer is cached under: the snapshot's sha256 when a vision model sees it (the
    picture is what it describes), else the event's data without its id and times; with the
    model, the prompt and the schema, so a change to any of them asks again."""
    if vision and subject.jpeg is not None:
        seen = hashlib.sha256(subject.jpeg).hexdigest()
    else:
        seen = hashlib.sha256(json.dumps(facts(subject, times=False), sort_keys=True)
                              .encode()).hexdigest()
    asked = hashlib.sha256(json.dumps([model, SYSTEM, instructions, SCHEMA], sort_keys=True)
                           .encode()).hexdigest()
    return f"{seen}:{asked}"


def thin(path: Sequence[tuple[float, float, float]],
         limit: int = MAX_PATH_POINTS) -> list[tuple[float, float, float]]:
    """At most `limit` points of a path, evenly spread, its first and last kept."""
    if len(path) <= limit:
        return list(path)
    step = (len(path) - 1) / (limit - 1)
    return [path[round(i * step)] for i in range(limit)]


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")
