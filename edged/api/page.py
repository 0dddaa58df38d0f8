"""The status page on the API's listeners: `GET /` is the page, `GET /ui/{file}` its CSS and
JavaScript, the files shipped in `edged/web/` (read once, served from memory). The page only
reads the daemon's own GET endpoints; it changes nothing.

On the loopback TCP listener the listener's guards apply as to any request (a loopback Host
only, nothing another site's page sends: `edged.api.http.browsers`). The answers add what
keeps another site from using them: a Content-Security-Policy that allows this origin only
(no inline script, nothing fetched from elsewhere), no framing, and
`Cross-Origin-Resource-Policy: same-origin`."""

from __future__ import annotations

from importlib import resources

from edged.api.http.messages import Handler, HttpError, Request, Response

TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}
ASSETS = ("app.js", "zones.js", "gallery.js", "style.css")
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "media-src 'self'; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
# On every answer the page and its live views give: this origin only.
SAME_ORIGIN = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
               "Cross-Origin-Resource-Policy": "same-origin"}
PAGE_HEADERS = {**SAME_ORIGIN, "Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
                "Cache-Control": "no-cache"}


class PageRoutes:
    def __init__(self) -> None:
        self._files: dict[str, bytes] = {}

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/", self.index), ("GET", "/ui/{file}", self.asset)]

    def _read(self, name: str) -> bytes:
        data = self._files.get(name)
        if data is None:
            data = self._files[name] = (resources.files("edged.web") / name).read_bytes()
        return data

    async def index(self, _request: Request) -> Response:
        return self._answer("index.html")

    async def asset(self, request: Request) -> Response:
        name = request.match_info["file"]
        if name not in ASSETS:  # a fixed list: no path from the request reaches the disk
            raise HttpError(404, "Not Found")
        return self._answer(name)

    def _answer(self, name: str) -> Response:
        return Response(self._read(name), content_type=TYPES[name[name.rfind("."):]],
                        headers=dict(PAGE_HEADERS))
