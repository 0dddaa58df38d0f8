"""edged's own extension of the socket API: the face gallery (`faces:`, edged/galleries/).
Vectors never leave the device: these routes list names, counts and groups, and take images.

- `GET /v2/edged/galleries/faces`: `{"names": [{name, entries, negatives}], "groups":
  [{group, sightings, first_seen, last_seen}], "counts": {entries, max_entries, unknowns,
  max_unknowns}, "embedder": {embedder, stale, without_crop, reembedding, reembedded, error}}`;
- `GET /v2/edged/galleries/faces/names/{name}`: that name's entries (ids, negative, embedder,
  source, created);
- `POST /v2/edged/galleries/faces/names/{name}`: enrol the one face of the body (a JPEG, PNG,
  BMP or WebP image), or of an event's snapshot (`{"snapshot": "<event id>"}`, JSON); 201
  with the entry. `.../names/{name}/negatives` the same as a negative: "this face is not
  {name}". Errors: `image_invalid`, `no_face`, `several_faces`, `gallery_full` (507, naming
  the bound), `invalid_input` (a name with path or topic tricks);
- `DELETE /v2/edged/galleries/faces/names/{name}`, `DELETE .../entries/{id}`;
- `GET .../groups`; `GET .../groups/{group}` (its kept sightings); `POST
  .../groups/{group}/name` (`{"name": "Ana"}`: every kept sighting of the unknown group
  enrolled under the name); `DELETE .../groups/{group}`;
- `GET .../entries/{id}/crop`, `GET .../sightings/{id}/crop`: the aligned face (PNG) an entry
  or an unknown sighting was made from, to see whom a group is before naming it;
- `POST .../reembed`: re-embed the rows an older embedder made, on the one background
  re-embedding (started, or the running one joined: it does not wait); 202 with its state
  `{"embedder": {...}}`.

An enrolment body is charged to the API's shared body budget (`api.max_bodies_mb`) until it is
answered, as inference bodies are. A gallery file that fails (locked, read-only, closed at
shutdown) answers 503 `faces_unavailable`.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from edged.api.http.budget import BodyBudget, read_body
from edged.api.http.messages import Handler, Request, Response, json_response
from edged.api.page import SAME_ORIGIN
from edged.core.errors import (
    FacesUnavailable,
    IdentityNotFound,
    InvalidInput,
    SnapshotNotFound,
)
from edged.core.numbers import ascii_int
from edged.events.store import SnapshotStore, valid_id
from edged.galleries.store import Gallery

MAX_IMAGE_BYTES = 16 * 1024 * 1024
PREFIX = "/v2/edged/galleries/faces"
T = TypeVar("T")


class Faces(Protocol):
    """The daemon's face pipeline (`edged.streams.faces.FaceService`)."""

    @property
    def gallery(self) -> Gallery: ...
    def enrol(self, name: str, image: bytes | memoryview, *, negative: bool = False,
              source: str | None = None) -> dict[str, Any]: ...
    def reembed_state(self) -> dict[str, Any]: ...
    def reembed(self) -> dict[str, Any]: ...


class GalleryRoutes:
    def __init__(self, faces: Callable[[], Faces | None],
                 snapshots: Callable[[], SnapshotStore | None],
                 bodies: BodyBudget | None = None) -> None:
        self.faces = faces
        self.snapshots = snapshots
        self.bodies = bodies or BodyBudget(MAX_IMAGE_BYTES)

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", PREFIX, self.index),
                ("POST", f"{PREFIX}/reembed", self.reembed),
                ("GET", f"{PREFIX}/groups", self.groups),
                ("GET", f"{PREFIX}/groups/{{group}}", self.group),
                ("GET", f"{PREFIX}/entries/{{id}}/crop", self.entry_crop),
                ("GET", f"{PREFIX}/sightings/{{id}}/crop", self.sighting_crop),
                ("POST", f"{PREFIX}/groups/{{group}}/name", self.name_group),
                ("DELETE", f"{PREFIX}/groups/{{group}}", self.delete_group),
                ("DELETE", f"{PREFIX}/entries/{{id}}", self.delete_entry),
                ("GET", f"{PREFIX}/names/{{name}}", self.entries),
                ("POST", f"{PREFIX}/names/{{name}}", self.enrol),
                ("POST", f"{PREFIX}/names/{{name}}/negatives", self.negative),
                ("DELETE", f"{PREFIX}/names/{{name}}", self.delete_name)]

    def _faces(self) -> Faces:
        faces = self.faces()
        if faces is None:
            raise FacesUnavailable("this daemon runs no face pipeline (faces.enabled: false, or "
                                   "its gallery could not be opened: see the log)")
        return faces

    async def index(self, _request: Request) -> Response:
        faces = self._faces()
        gallery = faces.gallery
        return json_response(await _gallery(lambda: {
            "names": gallery.names(), "groups": gallery.groups(), "counts": gallery.counts(),
            "embedder": faces.reembed_state()}))

    async def entries(self, request: Request) -> Response:
        gallery = self._faces().gallery
        name = request.match_info["name"]
        rows = await _gallery(gallery.entries, name)
        if not rows:
            return json_response({"error": f"no one is enrolled as {name[:64]!r}",
                                  "code": "identity_not_found"}, status=404)
        return json_response({"name": name, "entries": rows})

    async def enrol(self, request: Request) -> Response:
        return await self._enrol(request, negative=False)

    async def negative(self, request: Request) -> Response:
        return await self._enrol(request, negative=True)

    async def _enrol(self, request: Request, *, negative: bool) -> Response:
        faces = self._faces()
        name = request.match_info["name"]
        charge = self.bodies.charge()  # held until answered: the image is decoded from it
        try:
            body = await read_body(request, MAX_IMAGE_BYTES, charge)
            image: bytes | memoryview = body
            source = "upload"
            if request.content_type == "application/json":
                image, source = await self._snapshot(body)
            entry = await asyncio.to_thread(faces.enrol, name, image, negative=negative,
                                            source=source)
        finally:
            charge.release()
        return json_response(entry, status=201)

    async def _snapshot(self, body: memoryview) -> tuple[bytes, str]:
        try:
            asked = json.loads(bytes(body))
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"the body is not JSON: {exc}") from exc
        object_id = asked.get("snapshot") if isinstance(asked, dict) else None
        if not isinstance(object_id, str) or not valid_id(object_id):
            raise InvalidInput('expected {"snapshot": "<event id>"} naming a kept snapshot')
        store = self.snapshots()
        if store is None:
            raise SnapshotNotFound("this daemon keeps no snapshots (cache.snapshots_mb: 0)")
        jpeg = await asyncio.to_thread(store.read, object_id)
        if jpeg is None:
            raise SnapshotNotFound(f"no snapshot {object_id!r} is kept")
        return jpeg, f"snapshot {object_id}"

    async def delete_name(self, request: Request) -> Response:
        gallery = self._faces().gallery
        gone = await _gallery(gallery.delete_name, request.match_info["name"])
        return json_response({"deleted": gone})

    async def delete_entry(self, request: Request) -> Response:
        gallery = self._faces().gallery
        await _gallery(gallery.delete_entry, _number(request.match_info["id"], "id"))
        return json_response({"deleted": 1})

    async def groups(self, _request: Request) -> Response:
        gallery = self._faces().gallery
        return json_response({"groups": await _gallery(gallery.groups)})

    async def group(self, request: Request) -> Response:
        gallery = self._faces().gallery
        group = _number(request.match_info["group"], "group")
        rows = await _gallery(gallery.sightings, group)
        return json_response({"group": group, "sightings": rows})

    async def entry_crop(self, request: Request) -> Response:
        gallery = self._faces().gallery
        crop = await _gallery(gallery.crop, _number(request.match_info["id"], "id"))
        return _png(crop)

    async def sighting_crop(self, request: Request) -> Response:
        gallery = self._faces().gallery
        crop = await _gallery(gallery.sighting_crop,
                                       _number(request.match_info["id"], "id"))
        return _png(crop)

    async def name_group(self, request: Request) -> Response:
        gallery = self._faces().gallery
        group = _number(request.match_info["group"], "group")
        body = bytes(await read_body(request, 4096))
        try:
            asked = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"the body is not JSON: {exc}") from exc
        name = asked.get("name") if isinstance(asked, dict) else None
        if not isinstance(name, str):
            raise InvalidInput('expected {"name": "<name>"}')
        moved = await _gallery(gallery.name_group, group, name)
        return json_response({"name": name, "group": group, "enrolled": moved}, status=201)

    async def delete_group(self, request: Request) -> Response:
        gallery = self._faces().gallery
        await _gallery(gallery.delete_group, _number(request.match_info["group"],
                                                              "group"))
        return json_response({"deleted": 1})

    async def reembed(self, _request: Request) -> Response:
        faces = self._faces()
        state = await _gallery(faces.reembed)
        return json_response({"embedder": state}, status=202)


async def _gallery(call: Callable[..., T], *args: Any) -> T:
    """`call(*args)` on a thread; a failing gallery file is 503 faces_unavailable."""
    try:
        return await asyncio.to_thread(call, *args)
    except sqlite3.Error as exc:
        raise FacesUnavailable(f"the face gallery failed: {exc}") from exc


def _png(crop: bytes | None) -> Response:
    if crop is None:
        raise IdentityNotFound("that row keeps no crop (enrolled without one)")
    # An aligned face is biometric: this origin only, as the page's live views, and not
    # kept in a browser's cache
    return Response(crop, content_type="image/png",
                    headers={**SAME_ORIGIN, "Cache-Control": "no-store"})


def _number(raw: str, what: str) -> int:
    value = ascii_int(raw)
    if value is None or value < 0:
        raise InvalidInput(f"{what} must be a non-negative integer, got {raw[:16]!r}")
    return value
