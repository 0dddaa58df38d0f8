"""What the warm cache holds of one loaded version (`Entry`), and a caller's hold on it
(`Lease`): a version is not unloaded while a lease on it is out."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from edged.backends import Session
from edged.model.repository import ModelVersion

if TYPE_CHECKING:
    from edged.inference.cache import ModelCache


@dataclass
class Entry:
    model: ModelVersion
    session: Session
    backend: str
    nbytes: int
    load_seconds: float
    last_used: float
    refs: int = 0
    retiring: bool = False  # swapped out: unload once the last lease is returned
    precision: str = "fp32"  # what was loaded: fp32 | fp16 | int8 (edged.inference.precision)
    # Served on a fallback until the chosen backend is ready (an engine building): completes
    # when it is, and the cache then swaps this entry for one on that backend.
    upgrade: Future[None] | None = None


class Lease:
    """A model in use: it is not unloaded until every lease on it is released."""

    def __init__(self, cache: ModelCache, entry: Entry) -> None:
        self._cache = cache
        self.entry = entry
        self.model = entry.model
        self.session = entry.session
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._cache._release(self.entry)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
