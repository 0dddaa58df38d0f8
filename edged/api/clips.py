"""edged's own extension of the socket API: the event clips the daemon keeps
(`recording.dir`, `edged/recording/store.py`), on the Unix socket and the TCP listener alike,
under the same owner checks as every route.

- `GET /v2/edged/clips[?stream=S&event=E&kind=K&since=T&until=T&limit=N]`: `{"clips": [{id,
  stream, start_time, end_time, duration, events, size, codec, width, height, packets, kind,
  url}],
  "used_bytes", "budget_bytes"}`, newest first (`kind`: `clip`, an event's, or `segment`, of
  continuous recording; `since`/`until`: Unix s, those overlapping them; `limit` 100 unless
  given, at most 10000);
- `GET /v2/edged/clips/{id}`: the MP4 (`video/mp4`), with `Accept-Ranges: bytes`. A `Range:
  bytes=a-b` (or `a-`, or `-n`) answers 206 with `Content-Range`; a range that starts past the
  end is 416 (`Content-Range: bytes */size`); several ranges, or one that does not parse, are
  ignored (the whole file, 200), as RFC 9110 allows. An id that is not one is 400 (checked
  against the store's pattern before it comes near a path: no `/`, no `..`), one not kept 404.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Callable
from pathlib import Path

from edged.api.http.messages import Handler, Request, Response, json_response
from edged.api.page import SAME_ORIGIN
from edged.core.errors import ClipNotFound, InvalidInput
from edged.core.numbers import ascii_int
from edged.recording.store import ClipStore, valid_id

DEFAULT_LIMIT, MAX_LIMIT = 100, 10_000
MAX_BODY = 256 * 2**20  # a clip is read into memory to be sent: one this large is refused
RANGE = re.compile(r"^bytes=([0-9]{0,15})-([0-9]{0,15})$")
# The status page plays clips in a <video>; another site's page may not (as the live views).
VIDEO_HEADERS = {**SAME_ORIGIN, "Accept-Ranges": "bytes"}


class ClipRoutes:
    def __init__(self, store: Callable[[], ClipStore | None]) -> None:
        """`store` gives the daemon's clip store (None: no stream keeps clips)."""
        self.store = store

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/v2/edged/clips", self.index),
                ("GET", "/v2/edged/clips/{id}", self.video)]

    def _store(self) -> ClipStore:
        store = self.store()
        if store is None:
            raise ClipNotFound("this daemon keeps no clips (no stream has clips.enabled)")
        return store

    async def index(self, request: Request) -> Response:
        store = self._store()
        query = request.query
        limit = _number(query.get("limit"), "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        since = _time(query.get("since"), "since")
        until = _time(query.get("until"), "until")
        kind = query.get("kind")
        if kind not in (None, "clip", "segment"):
            raise InvalidInput(f"kind must be clip or segment, got {kind[:16]!r}")
        clips = store.list(stream=query.get("stream"), event=query.get("event"), since=since,
                           until=until, kind=kind)[:limit]
        return json_response({"clips": [c.row() for c in clips],
                              "used_bytes": store.used_bytes,
                              "budget_bytes": store.budget_bytes})

    async def video(self, request: Request) -> Response:
        clip_id = request.match_info["id"]
        if not valid_id(clip_id):
            raise InvalidInput(f"{clip_id[:64]!r} is not a clip id")
        store = self._store()
        info = store.get(clip_id)
        if info is None:
            raise ClipNotFound(f"no clip {clip_id!r} is kept")
        path = store.path(info)
        try:
            size = path.stat().st_size
        except FileNotFoundError as exc:  # deleted by the budget a moment ago
            raise ClipNotFound(f"no clip {clip_id!r} is kept") from exc
        span = byte_range(request.headers.get("range"), size)
        if span is None:
            if size > MAX_BODY:
                raise InvalidInput(f"clip {clip_id} is {size} bytes: ask for it in ranges "
                                   f"(Range: bytes=0-{MAX_BODY - 1})")
            body = await asyncio.to_thread(_read, path, 0, size)
            return Response(body, content_type="video/mp4", headers=dict(VIDEO_HEADERS))
        if not span:
            return Response(b"", status=416, content_type="video/mp4",
                            headers={**SAME_ORIGIN, "Content-Range": f"bytes */{size}"})
        start, end = span
        end = min(end, start + MAX_BODY - 1)
        body = await asyncio.to_thread(_read, path, start, end - start + 1)
        return Response(body, status=206, content_type="video/mp4",
                        headers={**VIDEO_HEADERS,
                                 "Content-Range": f"bytes {start}-{end}/{size}"})


def byte_range(header: str | None, size: int) -> tuple[int, int] | tuple[()] | None:
    """The one range a `Range` header asks for, as (first, last) byte; () when it cannot be
    satisfied (416); None when there is none to honour (no header, several ranges, or one
    that does not parse: the whole file)."""
    if header is None:
        return None
    match = RANGE.match(header.strip())
    if match is None:
        return None
    first, last = match.group(1), match.group(2)
    if not first and not last:
        return None
    if not first:  # the last n bytes
        n = int(last)
        if n == 0 or size == 0:
            return ()
        return max(0, size - n), size - 1
    start = int(first)
    end = int(last) if last else size - 1
    if last and end < start:
        return None  # invalid: ignored
    if start >= size:
        return ()
    return start, min(end, size - 1)


def _read(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(length)


def _number(raw: str | None, name: str, default: int, low: int, high: int) -> int:
    if raw is None:
        return default
    value = ascii_int(raw)
    if value is None or not low <= value <= high:
        raise InvalidInput(f"{name} must be an integer from {low} to {high}, got {raw[:16]!r}")
    return value


def _time(raw: str | None, name: str) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw) if raw.isascii() and len(raw) <= 32 else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise InvalidInput(f"{name} must be a time in Unix seconds, got {raw[:16]!r}")
    return value
