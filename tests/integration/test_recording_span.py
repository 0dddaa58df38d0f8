"""The span route on real segments (the corpus clip encoded by PyAV's libx264, written by
the segment recorder) served by edged's own HTTP layer: the joined MP4 as ffprobe reads it,
made as it is sent; a client that goes away stops the remux; a segment that vanished halfway
cuts the answer short without its last chunk, and `edged clips export --stream` says so and
leaves no file."""

from __future__ import annotations

import argparse
import asyncio
import http.client
import socket
from pathlib import Path

import numpy as np
import pytest
from support.routes import served_routes
from support.video import carphone_frames, carphone_h264, ffprobe

from edged.api.clips import ClipRoutes
from edged.api.spanbody import SpanBody
from edged.core.errors import ToolError
from edged.ops.client import EdgedClient
from edged.ops.clips import export_span
from edged.recording.config import RecordConfig
from edged.recording.segments import SegmentRecorder
from edged.recording.store import ClipInfo, ClipStore
from edged.sources.base import Backoff, FrameQueue
from edged.sources.demux import DemuxSource


@pytest.fixture(scope="module")
def segments(real_models: Path, tmp_path_factory: pytest.TempPathFactory) -> ClipStore:
    """12 s of carphone recorded in 2 s segments."""
    frames: list[np.ndarray] = carphone_frames(real_models)
    video = carphone_h264(frames, tmp_path_factory.mktemp("video"))
    store = ClipStore(tmp_path_factory.mktemp("rec"), 10**9, 0)
    recorder = SegmentRecorder("door", RecordConfig(enabled=True, segment_s=2.0), store)
    source = DemuxSource("door", f"file://{video}", FrameQueue(4, "block"), watchdog_s=5.0,
                         backoff=Backoff(0.2, 1.0), sink=recorder)
    source.start()  # (played at its rate: the segments' times are the packets' wall times)
    try:
        while source.queue.get(5.0) is not None:
            pass
    finally:
        source.stop(10.0)
        recorder.close()
    assert len(store.list()) >= 5
    return store


def in_order(store: ClipStore) -> list[ClipInfo]:
    return sorted(store.list(), key=lambda c: c.start_time)


def test_span_when_asked_over_the_socket_joins_the_segments_into_one_mp4(
        segments: ClipStore, tmp_path: Path) -> None:
    rows = in_order(segments)
    since, until = rows[1].start_time + 0.1, rows[3].start_time + 0.1
    with served_routes(ClipRoutes(lambda: segments).routes(), tmp_path / "s.sock") as path:
        out = tmp_path / "span.mp4"
        export_span(EdgedClient(path), argparse.Namespace(
            stream="door", since=since, until=until, output=out))
    probe = ffprobe(out)
    assert probe["frames"][0]["key_frame"] == 1 and float(probe["frames"][0]["pts_time"]) == 0
    assert len(probe["frames"]) == sum(r.packets for r in rows[1:4])
    lasted = sum(float(ffprobe(segments.path(r))["format"]["duration"]) for r in rows[1:4])
    assert abs(float(probe["format"]["duration"]) - lasted) <= 2 / 30


def test_span_when_a_segment_vanishes_halfway_is_cut_short_and_export_keeps_no_file(
        segments: ClipStore, tmp_path: Path) -> None:
    rows = in_order(segments)
    # A store of its own whose third segment's file is gone (retention, a disk pulled).
    copy = ClipStore(tmp_path / "rec", 10**9, 0)
    for row in rows:
        folder = tmp_path / "rec" / "door"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{row.id}.mp4").write_bytes(segments.path(row).read_bytes())
        copy.add(row)
    copy.path(rows[2]).unlink()
    with served_routes(ClipRoutes(lambda: copy).routes(), tmp_path / "s.sock") as path:
        out = tmp_path / "span.mp4"
        with pytest.raises(ToolError, match="cut short"):
            export_span(EdgedClient(path), argparse.Namespace(
                stream="door", since=rows[0].start_time, until=rows[-1].end_time,
                output=out))
        assert not out.exists() and not out.with_name("span.mp4.part").exists()
        conn = http.client.HTTPConnection("x")  # the raw answer: chunked, without its end
        conn.sock = _unix(path)
        conn.request("GET", f"/v2/edged/span?stream=door&since={rows[0].start_time}"
                            f"&until={rows[-1].end_time}")
        answer = conn.getresponse()
        assert answer.status == 200 and answer.getheader("Transfer-Encoding") == "chunked"
        with pytest.raises(http.client.IncompleteRead):
            answer.read()


def test_span_body_when_its_client_goes_stops_the_remux(segments: ClipStore) -> None:
    body = SpanBody([segments.path(r) for r in in_order(segments)])

    async def first_piece_then_leave() -> bytes:
        pieces = body.__aiter__()
        piece = await pieces.__anext__()
        await body.aclose()
        return piece

    piece = asyncio.run(first_piece_then_leave())
    assert piece[4:8] == b"ftyp"
    assert body._thread is not None and not body._thread.is_alive()


def _unix(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(30)
    sock.connect(path)
    return sock
