"""What the demo's crossing stream looks like over the API, end to end: the daemon in-process
with deploy/edged.yaml's streams on videos OpenCV wrote, asked over its loopback listener for
`latest.jpg` (the box around the moving square, the zone, the line, compared pixel by pixel
with the raw frame) and `live.mjpeg` (parts of new frames, a bounded number of viewers, each
place given back when its viewer goes); and the page, the recent objects and the status
report's new rows."""

from __future__ import annotations

import http.client
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.daemon import Served, ServeFactory
from support.demo import find_square, get, get_json, image, serve_demo
from support.polling import wait_until

from edged.processing.draw import LINE_COLOUR, ZONE_COLOUR, colour_of

CROSSING = "/v2/edged/streams/crossing/"


def near(pixels: np.ndarray, colour: tuple[int, int, int], tolerance: int = 70) -> np.ndarray:
    return np.all(np.abs(pixels.astype(int) - np.array(colour)) <= tolerance, axis=-1)


def same_frame_with_square(address: str) -> tuple[np.ndarray, np.ndarray, str,
                                                  tuple[int, int, int, int]]:
    """An annotated and a raw picture of one frame that shows a square clear of the frame's
    edges (where half its box would be cut off)."""
    def attempt() -> Any:
        status, head, drawn = get(address, CROSSING + "latest.jpg")
        status_raw, head_raw, raw = get(address, CROSSING + "latest.jpg?raw=1")
        if status != 200 or status_raw != 200 or head["x-frame-seq"] != head_raw["x-frame-seq"]:
            return None
        found = find_square(image(raw))
        if found is None or min(found[1]) < 8 or max(found[1]) > 248:
            return None
        return (image(drawn), image(raw), *found)
    return wait_until(attempt, timeout=60, interval=0.05, what="a frame with a square")


def test_latest_jpg_when_a_square_crosses_shows_its_box_the_zone_and_the_line(
        demo: Served) -> None:
    drawn, raw, label, (x1, y1, x2, y2) = same_frame_with_square(demo.http)
    assert drawn.shape == raw.shape == (256, 256, 3)
    box = near(drawn, colour_of(label)) & ~near(raw, colour_of(label))
    # The box's colour hugs the square on all four sides (a band of a few pixels).
    for name, band in {"left": box[y1:y2, x1 - 4:x1 + 2], "right": box[y1:y2, x2 - 2:x2 + 4],
                       "top": box[y1 - 4:y1 + 2, x1:x2], "bottom": box[y2 - 2:y2 + 4, x1:x2]
                       }.items():
        assert band.any(axis=1 if name in ("left", "right") else 0).mean() > 0.8, name
    assert not box[240:, :64].any(), "nothing box-coloured far from the square"
    # The zone (right half) is tinted; the left half's empty corner is not.
    tint = drawn[200:215, 215:245].astype(int).mean(axis=(0, 1))
    assert raw[200:215, 215:245].max() < 30 and tint[0] > 20 and tint[2] < 15, tint
    assert int(np.argmax(tint)) == int(np.argmax(ZONE_COLOUR))
    assert drawn[200:215, 20:60].max() < 30
    # The line runs down the middle (x = 128), in its colour, where the frame is black.
    assert near(drawn[200:250, 126:131], LINE_COLOUR, 60).any(axis=1).all()
    # The corner says which stream, and that it streams: white text on the dark panel.
    assert (drawn[4:40, 4:120] > 200).any()


def test_latest_jpg_when_asked_smaller_or_wrongly_answers_as_asked(demo: Served) -> None:
    wait_until(lambda: get(demo.http, CROSSING + "latest.jpg")[0] == 200, timeout=30,
               what="a first frame")
    status, head, body = get(demo.http, CROSSING + "latest.jpg?h=64")
    assert status == 200 and head["content-type"] == "image/jpeg"
    assert image(body).shape[:2] == (64, 64)
    assert head["cache-control"] == "no-store"
    assert head["cross-origin-resource-policy"] == "same-origin"
    for query in ("h=1", "h=99999", "h=abc", "raw=2", "fps=0"):
        path = CROSSING + ("live.mjpeg?" if query.startswith("fps") else "latest.jpg?") + query
        status, _, body = get(demo.http, path)
        assert status == 400 and b"invalid_input" in body, (query, body)
    status, _, body = get(demo.http, "/v2/edged/streams/nope/latest.jpg")
    assert status == 404 and b"stream_not_found" in body
    status, _, _ = get(demo.http, CROSSING + "latest.jpg", {"Host": "evil.example"})
    assert status == 403  # the listener's Host check applies to pictures too


class MjpegReader:
    """A live.mjpeg client: the parts as they come (headers, JPEG)."""

    def __init__(self, address: str, query: str = "") -> None:
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.conn.request("GET", CROSSING + "live.mjpeg" + query)
        self.answer = self.conn.getresponse()

    def part(self) -> tuple[dict[str, str], bytes]:
        stream = self.answer
        boundary = stream.readline()
        while boundary in (b"\r\n", b""):
            assert boundary, "the stream ended"
            boundary = stream.readline()
        assert boundary == b"--edgedframe\r\n", boundary
        headers = {}
        while (line := stream.readline()) != b"\r\n":
            name, value = line.decode().split(":", 1)
            headers[name.strip().lower()] = value.strip()
        return headers, stream.read(int(headers["content-length"]))

    def close(self) -> None:
        self.answer.close()  # (the answer owns the socket of a close-delimited answer)
        self.conn.close()


def test_live_mjpeg_when_watched_sends_new_annotated_frames_as_parts(demo: Served) -> None:
    reader = MjpegReader(demo.http, "?h=128&fps=4")
    try:
        assert reader.answer.status == 200
        assert reader.answer.getheader("Content-Type") == \
            "multipart/x-mixed-replace; boundary=edgedframe"
        assert reader.answer.getheader("Content-Length") is None
        seqs = []
        for _ in range(4):
            headers, jpeg = reader.part()
            assert headers["content-type"] == "image/jpeg"
            assert image(jpeg).shape[:2] == (128, 128)
            seqs.append(int(headers["x-frame-seq"]))
        assert seqs == sorted(set(seqs)), f"each part a newer frame: {seqs}"
    finally:
        reader.close()


def test_live_mjpeg_when_every_place_is_taken_answers_503_until_a_viewer_goes(
        make_served: ServeFactory, tmp_path: Path) -> None:
    served = serve_demo(make_served, tmp_path, api="live_viewers: 2")
    view = served.daemon.streams.live("crossing")
    assert view is not None
    readers = [MjpegReader(served.http) for _ in range(2)]
    try:
        for reader in readers:
            assert reader.answer.status == 200
        assert view.viewers == 2
        status, _, body = get(served.http, CROSSING + "live.mjpeg")
        assert status == 503 and b"too_many_viewers" in body
        assert get(served.http, CROSSING + "latest.jpg")[0] in (200, 503)  # still answers
        readers.pop().close()
        wait_until(lambda: view.viewers == 1, timeout=30, what="the gone viewer's place back")
        readers.append(MjpegReader(served.http))
        assert readers[-1].answer.status == 200
    finally:
        for reader in readers:
            reader.close()
    wait_until(lambda: view.viewers == 0, timeout=30, what="every place back")


def test_live_mjpeg_when_its_stream_restarts_ends_so_the_viewer_connects_to_the_new_one(
        demo: Served) -> None:
    reader = MjpegReader(demo.http)
    try:
        reader.part()
        old = demo.daemon.streams.live("crossing")
        [pipeline] = [p for p in demo.daemon.pipelines if p.cfg.name == "crossing"]
        demo.daemon.streams.restart(["crossing"], [pipeline.cfg])  # what a reload does
        with pytest.raises(AssertionError, match="the stream ended"):
            for _ in range(100):  # (a part or two may still be on its way)
                reader.part()
    finally:
        reader.close()
    assert old is not None and old.viewers == 0
    again = MjpegReader(demo.http)
    try:
        assert again.answer.status == 200 and again.part()[1]
        new = demo.daemon.streams.live("crossing")
        assert new is not old and new is not None and new.viewers == 1
    finally:
        again.close()


def test_page_when_asked_is_served_same_origin_only_and_names_no_other_site(
        demo: Served) -> None:
    status, head, body = get(demo.http, "/")
    assert status == 200 and head["content-type"].startswith("text/html")
    csp = head["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert head["x-frame-options"] == "DENY"
    texts = [body]
    for asset in ("app.js", "zones.js", "gallery.js", "style.css"):
        status, _, text = get(demo.http, f"/ui/{asset}")
        assert status == 200, asset
        texts.append(text)
    for text in texts:
        assert not re.search(rb"(https?:)?//[a-z0-9]", text.replace(b"://", b"")), \
            "no URL of another site"
        assert b"http://" not in text and b"https://" not in text
    assert get(demo.http, "/ui/../../etc/passwd")[0] == 404
    assert get(demo.http, "/ui/app.py")[0] == 404
    assert get(demo.http, "/", method="POST")[0] == 405  # read-only
    assert get(demo.http, "/", {"Host": "rebound.example:8000"})[0] == 403
    # On the Unix socket too.
    with demo.client() as client:
        assert b"<title>edged</title>" in client.request("GET", "/")[2]


def test_status_and_events_when_squares_crossed_show_objects_fps_and_recent_objects(
        demo: Served) -> None:
    def ended() -> Any:
        rows = get_json(demo.http, "/v2/edged/events?limit=5")["events"]
        return [r for r in rows if r["type"] == "end" and r["object"]["has_snapshot"]]
    row = wait_until(ended, timeout=60, what="an object that came and went")[0]
    assert row["object"]["stream"] == "crossing"
    status, _, jpeg = get(demo.http, f"/v2/edged/snapshots/{row['object']['id']}")
    assert status == 200 and image(jpeg).size
    report = get_json(demo.http, "/v2/edged/status")
    crossing = report["streams"]["crossing"]
    assert crossing["picture"] is True and crossing["fps"] > 0
    assert set(crossing["objects"]) == {"red", "green", "blue"}
    assert crossing["last_event"]["type"] in ("new", "end")
    assert crossing["zones"][0]["name"] == "right"
    assert crossing["lines"][0]["points"] == [[128, 256], [128, 0]]
    assert report["streams"]["demo"]["last_result"].split()[0] in ("red", "green", "blue")
    latency = report["inference"]["grid_det:1"]
    assert latency["success"] > 0 and 0 < latency["p50_ms"] <= latency["p99_ms"]
    assert report["queues"]["grid_det"]["instances"] >= 1
    assert get(demo.http, "/v2/edged/events?limit=0")[0] == 400
