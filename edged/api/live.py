"""edged's own extension of the socket API: what a stream sees, annotated.

- `GET /v2/edged/streams/{name}/latest.jpg[?raw=1][&h=N]`: the stream's latest processed frame
  as JPEG, with its boxes, zones, lines and state drawn (`raw=1`: the frame alone; `h`: scaled
  down to N pixels high). 404 for a stream that is not running, 503 before its first frame;
- `GET /v2/edged/streams/{name}/live.mjpeg[?raw=1][&h=N][&fps=F]`: the same as a
  `multipart/x-mixed-replace` stream (what browsers and Home Assistant's MJPEG camera read),
  a part per new frame at most `api.live_fps` a second (or F, if lower), at most
  `api.live_viewers` at once per stream (503 past that).

Pictures are drawn on a worker thread when asked for, from the stream's last results, and
shared by every viewer of the same size: at most one drawing per frame and per 1/live_fps,
whoever asks. The stream's own thread never draws; nobody watching costs nothing. At most
DRAWINGS_AT_ONCE `latest.jpg` askers of a stream have a worker thread at once (the rest wait
their turn on the loop): a client asking for hundreds of sizes at once takes neither the
workers live viewers draw on, nor more memory than those few drawings."""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Protocol

from edged.api.http.messages import Handler, Request, Response
from edged.api.page import SAME_ORIGIN
from edged.core.errors import InvalidInput, NoPicture, StreamNotFound, TooManyViewers

logger = logging.getLogger(__name__)

BOUNDARY = "edgedframe"
# Of a live_fps period: a picture drawn this recently is shared (the rest of the period keeps
# one viewer's own pace, which asks once a period, from reusing its own last picture).
SHARED_SHARE = 0.9
MAX_HEIGHT = 4320
KEEPALIVE_S = 5.0  # a stream with no new frame sends its last one again this often
STOP_CHECK_S = 0.25  # a live view notices the server stopping within this
NO_STORE = {**SAME_ORIGIN, "Cache-Control": "no-store"}
DRAWINGS_AT_ONCE = 2  # latest.jpg pictures in the works per stream


class Picture(Protocol):
    @property
    def seq(self) -> int: ...  # the frame's sequence number in its stream

    @property
    def jpeg(self) -> bytes: ...


class Viewable(Protocol):
    """A running stream's live view (`edged.streams.live.LiveView`)."""

    def picture(self, *, raw: bool, height: int | None, max_age_s: float) -> Picture | None:
        ...

    def watch(self) -> Callable[[], None] | None: ...  # a release, or None when full


class LiveRoutes:
    def __init__(self, views: Callable[[str], Viewable | None], *, max_fps: float,
                 stopping: Callable[[], bool] = lambda: False) -> None:
        """`views` gives a running stream's live view by name (None: no such stream);
        `stopping` says the server is stopping (live views then end)."""
        self.views = views
        self.max_fps = max_fps
        self.stopping = stopping
        # Per live view (gone with it): the turns of its latest.jpg askers.
        self._turns: weakref.WeakKeyDictionary[Viewable, asyncio.Semaphore] = \
            weakref.WeakKeyDictionary()

    def routes(self) -> list[tuple[str, str, Handler]]:
        base = "/v2/edged/streams/{name}"
        return [("GET", base + "/latest.jpg", self.latest),
                ("GET", base + "/live.mjpeg", self.live)]

    def _view(self, request: Request) -> Viewable:
        name = request.match_info["name"]
        view = self.views(name)
        if view is None:
            raise StreamNotFound(f"no running stream {name[:64]!r} with pictures")
        return view

    async def latest(self, request: Request) -> Response:
        view = self._view(request)
        raw, height = _options(request)
        turns = self._turns.get(view)
        if turns is None:
            turns = self._turns[view] = asyncio.Semaphore(DRAWINGS_AT_ONCE)
        async with turns:
            picture = await asyncio.to_thread(view.picture, raw=raw, height=height,
                                              max_age_s=SHARED_SHARE / self.max_fps)
        if picture is None:
            raise NoPicture(f"stream {request.match_info['name']!r} has no frame yet")
        return Response(picture.jpeg, content_type="image/jpeg",
                        headers={**NO_STORE, "X-Frame-Seq": str(picture.seq)})

    async def live(self, request: Request) -> Response:
        view = self._view(request)
        raw, height = _options(request)
        fps = _number(request.query.get("fps"), "fps", 0.2, self.max_fps) or self.max_fps
        release = view.watch()
        if release is None:
            raise TooManyViewers(f"stream {request.match_info['name']!r} has as many live "
                              "viewers as api.live_viewers allows; latest.jpg still answers")
        response = Response(content_type=f"multipart/x-mixed-replace; boundary={BOUNDARY}",
                            headers=NO_STORE)
        name = request.match_info["name"]

        def ended() -> bool:
            """The server stops, or the stream is gone or was restarted (a reload): the
            client connects again, to the stream as it is now."""
            return self.stopping() or self.views(name) is not view

        response.stream = _Watch(_parts(view, raw, height, 1.0 / fps,
                                        SHARED_SHARE / self.max_fps, stopping=ended), release)
        return response


class _Watch:
    """One viewer's parts; closing them, read or not, gives the viewer's place back."""

    def __init__(self, parts: AsyncGenerator[bytes, None], release: Callable[[], None]) -> None:
        self._parts = parts
        self._release = release

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._parts

    async def aclose(self) -> None:
        try:
            await self._parts.aclose()
        finally:
            self._release()


async def _parts(view: Viewable, raw: bool, height: int | None, period_s: float,
                 max_age_s: float = 0.0, *,
                 stopping: Callable[[], bool] = lambda: False,
                 clock: Callable[[], float] | None = None,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
                 ) -> AsyncGenerator[bytes, None]:
    """A part per new frame, at most one per `period_s`; the last again after KEEPALIVE_S
    without a new one (so a client sees the stream is alive, and a gone one is noticed).
    Pictures up to `max_age_s` old are shared with the stream's other viewers. Ends when
    `stopping()` says so."""
    clock = clock or asyncio.get_running_loop().time
    last_seq: int | None = None
    sent_at = due = clock()
    while not stopping():
        picture = await asyncio.to_thread(view.picture, raw=raw, height=height,
                                          max_age_s=max_age_s)
        now = clock()
        if picture is not None and (picture.seq != last_seq or now - sent_at >= KEEPALIVE_S):
            last_seq, sent_at = picture.seq, now
            yield part(picture)
        due = max(due + period_s, clock())  # behind: no burst to catch up
        while (left := due - clock()) > 0 and not stopping():
            await sleep(min(left, STOP_CHECK_S))


def part(picture: Picture) -> bytes:
    """One picture as a part of the multipart answer."""
    return (f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\nContent-Length: "
            f"{len(picture.jpeg)}\r\nX-Frame-Seq: {picture.seq}\r\n\r\n"
            ).encode("ascii") + picture.jpeg + b"\r\n"


def _options(request: Request) -> tuple[bool, int | None]:
    query = request.query
    raw = query.get("raw", "0")
    if raw not in ("0", "1", "true", "false"):
        raise InvalidInput(f"raw must be 1 or 0, got {raw[:16]!r}")
    height = _number(query.get("h"), "h", 16, MAX_HEIGHT)
    return raw in ("1", "true"), None if height is None else int(height)


def _number(raw: str | None, name: str, low: float, high: float) -> float | None:
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not low <= value <= high:
        raise InvalidInput(f"{name} must be a number from {low:g} to {high:g}, got {raw[:16]!r}")
    return value
