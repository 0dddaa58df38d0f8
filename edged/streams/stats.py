"""A stream's statistics as read at one moment, typed: what the pipeline, its source and its
events stage count, read under their own locks and put together once. The stats message, the
status report and `/metrics` read these; `as_dict()` is the published row."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.sources import SourceStats


@dataclass(frozen=True)
class Percentiles:
    p50: float
    p99: float

    @classmethod
    def of(cls, array: np.ndarray) -> Percentiles | None:
        """p50 and p99 of the values (milliseconds, to the microsecond); None when empty.
        (Callers copy their window under their lock and compute outside it.)"""
        if not array.size:
            return None
        return cls(round(float(np.percentile(array, 50)), 3),
                   round(float(np.percentile(array, 99)), 3))


@dataclass(frozen=True)
class EventsStats:
    """A detect stream's events stage: messages published, frames it failed on, and how long
    a frame's events took."""

    events_published: int
    events_failed: int
    events_ms: Percentiles | None = None

    def as_dict(self) -> dict[str, Any]:
        return _flat(self)


@dataclass(frozen=True)
class StreamStats:
    """One stream: frames through the model (`processed`), failed on the way (`failed`), or
    published without what a secondary model would add (`secondary_failed`); the last frame
    error; its source's counters and state; its events stage's; the latency from capture to
    publish over the last frames; frames the change gate kept from the model (`gated`: their
    picture had not changed; apart from the source's back-pressure `dropped`)."""

    processed: int
    failed: int
    secondary_failed: int
    frame_error: str | None
    source: SourceStats
    events: EventsStats | None = None
    latency_ms: Percentiles | None = None
    gated: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The published row (stats message, status report). Its `last_error` is the
        source's: the row has one key for both, and the source's is what it has shown.
        `gated` came later than the other keys and is the row's last (their bytes are as
        they were)."""
        row: dict[str, Any] = {"processed": self.processed, "failed": self.failed,
                               "secondary_failed": self.secondary_failed, "last_error": None}
        row.update(_flat(self.source))  # its last_error takes the key's place
        if self.events is not None:
            row.update(_flat(self.events))
        if self.latency_ms is not None:
            row["latency_ms"] = dataclasses.asdict(self.latency_ms)
        row["gated"] = self.gated
        return row


def _flat(stats: Any) -> dict[str, Any]:
    """A stats dataclass as a row: nested percentiles as dicts, absent ones left out."""
    row = {}
    for f in dataclasses.fields(stats):
        value = getattr(stats, f.name)
        if isinstance(value, Percentiles):
            row[f.name] = dataclasses.asdict(value)
        elif value is not None or f.name not in ("events_ms",):
            row[f.name] = value
    return row
