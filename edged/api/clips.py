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
  The bytes are read from the file as the client takes them, CHUNK at a time (a 1 GB
  segment costs a chunk of memory, not a GB), from a file opened before the answer starts
  (the budget deleting it meanwhile does not cut it short).
- `GET /v2/edged/span?stream=S&since=T&until=T`: the stream's continuous segments that
  overlap [since, until] joined into one MP4 by remux (whole segments: it starts at the
  keyframe at or before `since`), made as it is sent (a fragmented MP4, chunked: a span cut
  short lacks the chunked end, so a client knows). Until not after since, a span longer than
  MAX_SPAN_S or a format change within it: 400; no segments there: 404.
"""

from __future__ import annotations

import asyncio
import math
import os
import re
from collections.abc import Callable

from edged.api.filebody import FileBody
from edged.api.http.messages import Handler, Request, Response, json_response
from edged.api.page import SAME_ORIGIN
from edged.api.spanbody import SpanBody
from edged.core.errors import ClipNotFound, InvalidInput
from edged.core.numbers import ascii_int
from edged.recording.concat import check_formats
from edged.recording.store import ClipStore, valid_id

DEFAULT_LIMIT, MAX_LIMIT = 100, 10_000
MAX_SPAN_S = 24 * 3600.0  # the longest span one export joins
RANGE = re.compile(r"^bytes=([0-9]{0,15})-([0-9]{0,15})$")
# The status page plays clips in a <video>; another site's page may not (as the live views).
VIDEO_HEADERS = {**SAME_ORIGIN, "Accept-Ranges": "bytes"}


class ClipRoutes:
    def __init__(self, store: Callable[[], ClipStore | None]) -> None:
        """`store` gives the daemon's clip store (None: no stream keeps clips)."""
        self.store = store

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/v2/edged/clips", self.index),
                ("GET", "/v2/edged/clips/{id}", self.video),
                ("GET", "/v2/edged/span", self.span)]

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
            file = await asyncio.to_thread(path.open, "rb")
        except FileNotFoundError as exc:  # deleted by the budget a moment ago
            raise ClipNotFound(f"no clip {clip_id!r} is kept") from exc
        size = os.fstat(file.fileno()).st_size
        span = byte_range(request.headers.get("range"), size)
        if span == ():
            file.close()
            return Response(b"", status=416, content_type="video/mp4",
                            headers={**SAME_ORIGIN, "Content-Range": f"bytes */{size}"})
        status, headers = 200, dict(VIDEO_HEADERS)
        start, end = 0, size - 1
        if span:
            start, end = span
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        headers["Content-Length"] = str(end - start + 1)
        response = Response(status=status, content_type="video/mp4", headers=headers)
        response.stream = FileBody(file, start, end - start + 1)
        return response

    async def span(self, request: Request) -> Response:
        query = request.query
        stream = query.get("stream")
        since = _time(query.get("since"), "since")
        until = _time(query.get("until"), "until")
        if not stream or since is None or until is None:
            raise InvalidInput("a span needs stream, since and until (Unix s)")
        if until <= since:
            raise InvalidInput(f"until ({until}) must be after since ({since})")
        if until - since > MAX_SPAN_S:
            raise InvalidInput(f"a span is at most {MAX_SPAN_S / 3600:.0f} h, this one "
                               f"{(until - since) / 3600:.1f} h: export it in parts")
        store = self._store()
        infos = sorted(store.list(stream=stream, kind="segment", since=since, until=until),
                       key=lambda c: c.start_time)
        if not infos:
            raise ClipNotFound(f"no segments of {stream[:64]!r} between {since} and {until}")
        check_formats(infos)
        name = f"{infos[0].stream}-{int(since)}-{int(until)}.mp4"
        response = Response(content_type="video/mp4", headers={
            **SAME_ORIGIN, "Transfer-Encoding": "chunked",
            "Content-Disposition": f'attachment; filename="{name}"',
            "X-Edged-Segments": str(len(infos)),
            "X-Edged-Span": f"{infos[0].start_time:.3f}-{infos[-1].end_time:.3f}"})
        response.stream = SpanBody([store.path(i) for i in infos])
        return response


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
