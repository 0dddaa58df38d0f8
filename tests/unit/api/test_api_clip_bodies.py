"""The clips routes over edged's own HTTP layer on a real Unix socket: a 1 GiB recording is
answered from the file a chunk at a time (the reads are counted, and the process's peak memory
does not grow by anything like the file), a Range too; a span export's bad requests get their
typed errors before anything is streamed."""

from __future__ import annotations

import json
import resource
import socket
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from support.routes import served_routes

from edged.api import clips as clip_routes
from edged.api.clips import ClipRoutes
from edged.api.filebody import CHUNK
from edged.recording.store import ClipInfo, ClipStore

GIB = 2**30
CLIP = ClipInfo("1000.000-door-s1", "door", 1000.0, 1010.0, (), GIB, "h264", 176, 144, 300,
                kind="segment")


@pytest.fixture
def store(tmp_path: Path) -> ClipStore:
    folder = tmp_path / "rec" / "door"
    folder.mkdir(parents=True)
    with (folder / f"{CLIP.id}.mp4").open("wb") as f:
        f.truncate(GIB)  # sparse: a GiB to read, nothing on the disk
    (folder / f"{CLIP.id}.json").write_text(json.dumps(asdict(CLIP)))
    return ClipStore(tmp_path / "rec", 4 * GIB, 0)


@pytest.fixture
def socket_path(store: ClipStore, tmp_path: Path) -> Iterator[str]:
    with served_routes(ClipRoutes(lambda: store).routes(), tmp_path / "c.sock") as path:
        yield path


def get(path: str, target: str, headers: str = "") -> tuple[int, dict[str, str], int, bytes]:
    """Status, headers, the body's length (read in 1 MiB pieces and dropped) and its first
    4 KiB."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(path)
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{headers}\r\n"
                     .encode())
        buf = bytearray()
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            assert chunk, bytes(buf)
            buf += chunk
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        found = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        size, first = len(rest), bytearray(rest[:4096])
        while chunk := sock.recv(2**20):
            size += len(chunk)
            if len(first) < 4096:
                first += chunk[:4096 - len(first)]
        return int(lines[0].split()[1]), found, size, bytes(first)


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def test_clip_body_when_a_gib_is_asked_is_read_in_chunks_without_holding_it(
        socket_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies: list[clip_routes.FileBody] = []
    real = clip_routes.FileBody
    monkeypatch.setattr(clip_routes, "FileBody",
                        lambda *a, **k: bodies.append(real(*a, **k)) or bodies[-1])
    before = peak_rss()
    status, headers, size, first = get(socket_path, f"/v2/edged/clips/{CLIP.id}")
    assert status == 200 and size == GIB and first == bytes(4096)
    assert headers["content-length"] == str(GIB) and headers["accept-ranges"] == "bytes"
    status, headers, size, _ = get(socket_path, f"/v2/edged/clips/{CLIP.id}",
                                   "Range: bytes=100-\r\n")
    assert status == 206 and size == GIB - 100
    assert headers["content-range"] == f"bytes 100-{GIB - 1}/{GIB}"
    grew = peak_rss() - before
    assert grew < 64 * 2**20, f"the peak memory grew by {grew / 2**20:.0f} MiB for a GiB"
    assert [b.reads for b in bodies] == [GIB // CHUNK, -(-(GIB - 100) // CHUNK)]


@pytest.mark.parametrize(("query", "status", "code"), [
    ("stream=door&since=1005&until=1000", 400, "invalid_input"),
    ("stream=door&since=1000&until=1000", 400, "invalid_input"),
    ("stream=door&since=0&until=200000", 400, "invalid_input"),
    ("stream=door&since=1000", 400, "invalid_input"),
    ("since=1000&until=1001", 400, "invalid_input"),
    ("stream=door&since=abc&until=1001", 400, "invalid_input"),
    ("stream=door&since=2000&until=2001", 404, "clip_not_found"),
    ("stream=gate&since=1000&until=1001", 404, "clip_not_found"),
])
def test_span_when_asked_wrongly_answers_a_typed_error(socket_path: str, query: str,
                                                       status: int, code: str) -> None:
    got, headers, _size, first = get(socket_path, f"/v2/edged/span?{query}")
    assert got == status and headers["content-type"].startswith("application/json")
    assert json.loads(first)["code"] == code
