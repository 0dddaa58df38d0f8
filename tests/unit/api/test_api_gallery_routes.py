"""The gallery's routes over edged's own HTTP layer on a real Unix socket (review of issue 50's
faces): an enrolment body is charged to the API's shared body budget and refused as
inference bodies are when it does not fit; a gallery file that fails (closed at shutdown,
locked) is 503 `faces_unavailable` on every route, not 500 `internal`; `POST .../reembed`
answers 202 with the state at once."""

from __future__ import annotations

import json
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.routes import served_routes

from edged.api.galleries import PREFIX, GalleryRoutes
from edged.api.http.budget import BodyBudget
from edged.galleries.store import Gallery

MIB = 2**20


class Faces:
    """The routes' view of the face pipeline over a real gallery file; enrolment keeps what it
    was given (the pipeline's own tests enrol real faces)."""

    def __init__(self, gallery: Gallery) -> None:
        self.gallery = gallery
        self.enrolled: list[int] = []

    def enrol(self, name: str, image: bytes | memoryview, *, negative: bool = False,
              source: str | None = None) -> dict[str, Any]:
        self.enrolled.append(len(image))
        return {"id": 1, "name": name}

    def reembed_state(self) -> dict[str, Any]:
        return {"reembedding": False}

    def reembed(self) -> dict[str, Any]:
        return {"reembedding": True}


@pytest.fixture
def gallery(tmp_path: Path) -> Iterator[Gallery]:
    gallery = Gallery(tmp_path / "faces.sqlite", max_entries=10, max_unknowns=10)
    gallery.add("Ana", np.eye(8, dtype=np.float32)[0], "e")
    gallery.sighting(np.eye(8)[1], "e", group_threshold=0.5, keep_below=0.9)
    yield gallery
    gallery.close()


@pytest.fixture
def budget() -> BodyBudget:
    return BodyBudget(1 * MIB)


@pytest.fixture
def served(gallery: Gallery, budget: BodyBudget, tmp_path: Path) -> Iterator[tuple[str, Faces]]:
    faces = Faces(gallery)
    routes = GalleryRoutes(lambda: faces, lambda: None, budget)
    with served_routes(routes.routes(), tmp_path / "g.sock") as path:
        yield path, faces


def call(path: str, method: str, target: str, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                     f"Content-Type: image/png\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode() + body)
        buf = bytearray()
        while chunk := sock.recv(65536):
            buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(rest) if rest.strip() else {}


def test_gallery_enrol_when_the_body_exceeds_the_shared_budget_is_refused_as_inference_is(
        served: tuple[str, Faces], budget: BodyBudget) -> None:
    path, faces = served
    status, answer = call(path, "POST", f"{PREFIX}/names/Ana", b"\x00" * (2 * MIB))
    assert (status, answer["code"]) == (413, "too_large")
    assert "api.max_bodies_mb" in answer["error"]
    budget.take(MIB - 1000)  # other requests' bodies in flight hold nearly all of it
    status, answer = call(path, "POST", f"{PREFIX}/names/Ana", b"\x00" * 4096)
    assert (status, answer["code"]) == (503, "overloaded")
    budget.give(MIB - 1000)
    assert call(path, "POST", f"{PREFIX}/names/Ana", b"\x00" * 4096)[0] == 201
    assert faces.enrolled == [4096] and budget.held == 0  # given back once answered


@pytest.mark.parametrize(("method", "target", "body"), [
    ("GET", PREFIX, b""), ("GET", f"{PREFIX}/groups", b""), ("GET", f"{PREFIX}/groups/1", b""),
    ("GET", f"{PREFIX}/names/Ana", b""), ("DELETE", f"{PREFIX}/names/Ana", b""),
    ("DELETE", f"{PREFIX}/entries/1", b""), ("DELETE", f"{PREFIX}/groups/1", b""),
    ("POST", f"{PREFIX}/groups/1/name", b'{"name": "Bo"}'),
    ("GET", f"{PREFIX}/entries/1/crop", b""), ("GET", f"{PREFIX}/sightings/1/crop", b"")])
def test_gallery_routes_when_the_file_is_closed_answer_faces_unavailable(
        served: tuple[str, Faces], gallery: Gallery, method: str, target: str, body: bytes
        ) -> None:
    gallery.close()  # (shutdown, a lost mount): sqlite3.ProgrammingError on every use
    status, answer = call(served[0], method, target, body)
    assert (status, answer["code"]) == (503, "faces_unavailable"), answer
    assert "gallery failed" in answer["error"]


def test_gallery_routes_when_the_file_is_locked_answer_faces_unavailable(
        served: tuple[str, Faces], gallery: Gallery) -> None:
    gallery._db.execute("PRAGMA busy_timeout = 0")
    other = sqlite3.connect(str(gallery.path), isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another writer holds the file
    try:
        for method, target in (("DELETE", f"{PREFIX}/names/Ana"),
                               ("DELETE", f"{PREFIX}/groups/1")):
            status, answer = call(served[0], method, target)
            assert (status, answer["code"]) == (503, "faces_unavailable"), answer
            assert "locked" in answer["error"]
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert call(served[0], "DELETE", f"{PREFIX}/names/Ana")[0] == 200


def test_gallery_reembed_route_answers_202_with_the_state(served: tuple[str, Faces]) -> None:
    assert call(served[0], "POST", f"{PREFIX}/reembed", b"{}") == \
        (202, {"embedder": {"reembedding": True}})
