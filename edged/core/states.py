"""The states that cross rooms, as enums: a model version's (the cache reports it; the API,
metrics and the stats message read it), a stream source's (sources; the daemon, metrics and
health read it) and an OTA update's (the device reports it; `edged ota push` follows it).
They are `StrEnum`s, so they compare, format and serialise to JSON as their value, while a
typo is an AttributeError instead of a state nobody ever enters. This module imports nothing
of edged's, so any room can use it."""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - the 3.10 spelling of the same thing

    class StrEnum(str, Enum):
        __hash__ = str.__hash__  # "active" in {OtaState.ACTIVE}, as on 3.11

        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


class ModelState(StrEnum):
    """A model version's state, in KServe's and Triton's words."""

    READY = "READY"  # loaded and warm
    LOADING = "LOADING"
    UNAVAILABLE = "UNAVAILABLE"  # not loaded (loads on first request), or its load failed


class SourceState(StrEnum):
    """A stream source's state machine (`sources.base.ALLOWED` says which moves are legal)."""

    CONNECTING = "connecting"
    STREAMING = "streaming"
    RECONNECTING = "reconnecting"
    STOPPED = "stopped"


class OtaState(StrEnum):
    """The states a device reports on <prefix>/ota/<model>/status, in the order an update
    passes them; the final ones are retained, and they end what `edged ota push` follows."""

    RECEIVED = "received"
    DOWNLOADING = "downloading"
    VERIFYING = "verifying"
    INSTALLING = "installing"
    WARMING = "warming"
    SHADOWING = "shadowing"  # a shadow rollout: installed beside the serving version, proving
    ACTIVE = "active"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"
