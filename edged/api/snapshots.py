"""edged's own extension of the socket API: the objects' snapshots the daemon keeps on disk
(`cache.snapshots_mb`, `edged/events/store.py`).

- `GET /v2/edged/snapshots[?stream=S&label=L&limit=N]`: `{"snapshots": [{id, stream, label,
  size, time, described, plate}], "used_bytes", "budget_bytes"}`, newest first (`time`: when
  it was written, Unix s; `described`, `plate`: what is kept beside it; `limit` 100 unless
  given, at most 10000);
- `GET /v2/edged/snapshots/{id}`: the JPEG (`image/jpeg`); 400 for an id that is not one
  (checked before it comes near the filesystem), 404 for one not kept;
- `GET /v2/edged/snapshots/{id}/description`: the object's description as the describer kept
  it (JSON: `state` described, with the summary as published, or failed, with why); 404
  when none is kept;
- `GET /v2/edged/snapshots/{id}/plate`: the picture of the object's licence plate (JPEG: its
  voted plate's best read, the plate as the recogniser read it); 404 when none is kept (no
  plate read on it, or a stream without `lpr`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from edged.api.http.messages import Handler, Request, Response, json_response
from edged.core.errors import InvalidInput, SnapshotNotFound
from edged.core.numbers import ascii_int
from edged.events.store import SnapshotStore, StoredSnapshot, valid_id

DEFAULT_LIMIT, MAX_LIMIT = 100, 10_000


class SnapshotRoutes:
    def __init__(self, store: Callable[[], SnapshotStore | None]) -> None:
        """`store` gives the daemon's store (None: it keeps no snapshots)."""
        self.store = store

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/v2/edged/snapshots", self.index),
                ("GET", "/v2/edged/snapshots/{id}", self.image),
                ("GET", "/v2/edged/snapshots/{id}/description", self.description),
                ("GET", "/v2/edged/snapshots/{id}/plate", self.plate)]

    def _store(self) -> SnapshotStore:
        store = self.store()
        if store is None:
            raise SnapshotNotFound("this daemon keeps no snapshots (cache.snapshots_mb: 0, or "
                                   "its folder could not be used: see the log)")
        return store

    async def index(self, request: Request) -> Response:
        store = self._store()
        stream, label = request.query.get("stream"), request.query.get("label")
        limit = _limit(request.query.get("limit"))
        rows = [_row(item) for item in store.list()
                if (stream is None or item.stream == stream)
                and (label is None or item.label == label)][:limit]
        return json_response({"snapshots": rows, "used_bytes": store.used_bytes,
                                  "budget_bytes": store.budget_bytes})

    async def image(self, request: Request) -> Response:
        return await self._kept(request, lambda: self._store().read,
                                "no snapshot {} is kept", "image/jpeg")

    async def plate(self, request: Request) -> Response:
        return await self._kept(request, lambda: self._store().plate,
                                "no plate picture of {} is kept", "image/jpeg")

    async def description(self, request: Request) -> Response:
        return await self._kept(request, lambda: self._store().description,
                                "no description of {} is kept", "application/json")

    @staticmethod
    async def _kept(request: Request, reader: Callable[[], Callable[[str], bytes | None]],
                    missing: str, content_type: str) -> Response:
        """One object's kept file (read off the loop), or a typed 400/404; the id is judged
        before the store is asked for (`reader` gives the store's read)."""
        object_id = request.match_info["id"]
        if not valid_id(object_id):
            raise InvalidInput(f"{object_id[:64]!r} is not a snapshot id")
        body = await asyncio.to_thread(reader(), object_id)
        if body is None:
            raise SnapshotNotFound(missing.format(repr(object_id)))
        return Response(body, content_type=content_type)


def _row(item: StoredSnapshot) -> dict[str, Any]:
    return {"id": item.id, "stream": item.stream, "label": item.label, "size": item.size,
            "time": round(item.mtime, 3), "described": bool(item.described),
            "plate": bool(item.plate)}


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    limit = ascii_int(raw)
    if limit is None or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be an integer from 1 to {MAX_LIMIT}, got {raw[:16]!r}")
    return limit
