"""edged's own extension of the socket API: the objects the detect streams saw lately.

`GET /v2/edged/events[?stream=S&limit=N]`: `{"events": [{"type", "time", "object"}]}`, the
latest event of each recent object, newest first (`type`: new, update or end; `time`: when it
was published, Unix s; `object`: the event's `after`, as published on `<prefix>/events`, with
`has_snapshot` saying whether `GET /v2/edged/snapshots/{id}` has its picture). `limit` 20
unless given, at most 100."""

from __future__ import annotations

from collections.abc import Callable

from edged.api.http.messages import Handler, Request, Response, json_response
from edged.core.errors import InvalidInput
from edged.core.numbers import ascii_int
from edged.events.tally import RECENT_OBJECTS, RecentEvents

DEFAULT_LIMIT = 20


class EventRoutes:
    def __init__(self, recent: Callable[[], RecentEvents | None]) -> None:
        """`recent` gives the daemon's recent objects (None: it has no detect streams)."""
        self.recent = recent

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/v2/edged/events", self.index)]

    async def index(self, request: Request) -> Response:
        raw = request.query.get("limit")
        limit = DEFAULT_LIMIT if raw is None else ascii_int(raw)
        if limit is None or not 1 <= limit <= RECENT_OBJECTS:
            raise InvalidInput(f"limit must be an integer from 1 to {RECENT_OBJECTS}, "
                               f"got {(raw or '')[:16]!r}")
        recent = self.recent()
        rows = [] if recent is None else recent.rows(stream=request.query.get("stream"),
                                                     limit=limit)
        return json_response({"events": rows})
