"""Event clips from the real daemon: the crossing squares encoded as H.264 by PyAV's libx264,
served by Debian's GStreamer RTSP server on 127.0.0.1, read by the daemon's demuxing reader
(`reader: auto` picks it because the stream keeps clips), tracked by grid_det; each object's
`end` event names its clip, the clips topic announces it, ffprobe finds a keyframe first at or
before the object's start minus the pre-capture and the end past its end plus the
post-capture; the socket API and the TCP listener list the clips and serve them with HTTP
Range (206, 416), 404 for an unknown id and refusals for path tricks."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.broker import Broker, Received, Subscriber
from support.browser import Browser
from support.daemon import ServeFactory
from support.polling import wait_until
from support.video import crossing_h264, ffprobe, rtsp_server

from edged.cli import main
from edged.ops import clips as clips_cli
from edged.ops.client import EdgedClient
from edged.recording.segments import SegmentRecorder
from tools.assets import models as test_models

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "schemas" /
                     "events.schema.json").read_text())
FPS = 10
PRE_S, POST_S = 2.0, 1.0


@pytest.fixture
def crossing(repo_dir: Path, tmp_path: Path) -> Path:
    test_models.write_repository(repo_dir, names=["grid_det"])
    return crossing_h264(tmp_path, fps=FPS)


def ended_with_clips(prefix: str):  # type: ignore[no-untyped-def]
    def done(got: list[Received]) -> bool:
        ends = [e for e in _events(got, prefix) if e["type"] == "end"]
        clips = {c["id"] for c in _clips(got, prefix)}
        return len(ends) >= 2 and all(e["after"].get("clip", {}).get("id") in clips
                                      for e in ends[:2])
    return done


def _events(got: list[Received], prefix: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == f"{prefix}/events"]


def _clips(got: list[Received], prefix: str) -> list[dict[str, Any]]:
    return [json.loads(m.payload) for m in got if m.topic == f"{prefix}/clips"]


def test_daemon_when_objects_cross_an_rtsp_camera_keeps_each_event_clip_and_serves_it(
        broker: Broker, make_served: ServeFactory, crossing: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        browser: Browser) -> None:
    prefix = "t/clip1"
    sub = Subscriber(broker, f"{prefix}/#")
    with rtsp_server(crossing) as url:
        try:
            served = make_served(
                cache="preload: [grid_det]",
                mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                streams=f"[{{name: door, source: '{url}', model: grid_det, "
                        f"labels: [red, blue], clips: {{enabled: true, pre_capture_s: {PRE_S}, "
                        f"post_capture_s: {POST_S}}}, record: {{enabled: true, "
                        f"segment_s: 2}}}}]")
            got = sub.collect(until=ended_with_clips(prefix), timeout=90,
                              what="two objects' ends and their clips")
        finally:
            sub.close()
    events = _events(got, prefix)
    for event in events:
        jsonschema.validate(event, SCHEMA)
        assert event["after"]["has_clip"] is True
    ends = [e["after"] for e in events if e["type"] == "end"][:2]
    assert [e["label"] for e in ends] == ["red", "blue"]
    announced = {c["id"]: c for c in _clips(got, prefix)}
    store = served.daemon.clips
    assert store is not None
    for obj in ends:
        clip = announced[obj["clip"]["id"]]
        assert obj["id"] in clip["events"] and clip["url"] == obj["clip"]["url"]
        assert clip["start_time"] <= obj["start_time"] - PRE_S
        assert clip["end_time"] >= obj["end_time"] + POST_S
        info = store.get(clip["id"])
        assert info is not None
        probe = ffprobe(store.path(info))
        assert probe["streams"][0]["codec_name"] == "h264"
        assert probe["frames"][0]["key_frame"] == 1
        assert abs(float(probe["format"]["duration"]) - clip["duration"]) <= 2 / FPS

    red = announced[ends[0]["clip"]["id"]]
    whole = store.path(store.get(red["id"])).read_bytes()  # type: ignore[arg-type]
    for client in (served.client(), EdgedClient(http=served.http, timeout_s=30)):
        with client:
            status, _, body = client.request("GET", "/v2/edged/clips?stream=door")
            assert status == 200
            assert red["id"] in [c["id"] for c in json.loads(body)["clips"]]
            status, _, body = client.request("GET", f"/v2/edged/clips?event={ends[0]['id']}")
            assert [c["id"] for c in json.loads(body)["clips"]] == [red["id"]]
            status, headers, body = client.request("GET", red["url"])
            assert status == 200 and headers["Content-Type"] == "video/mp4" and body == whole
            assert headers["Accept-Ranges"] == "bytes"
            assert headers["Cross-Origin-Resource-Policy"] == "same-origin"
            status, headers, body = client.request("GET", red["url"],
                                                   headers={"Range": "bytes=100-199"})
            assert status == 206 and body == whole[100:200]
            assert headers["Content-Range"] == f"bytes 100-199/{len(whole)}"
            status, headers, body = client.request("GET", red["url"],
                                                   headers={"Range": "bytes=-50"})
            assert status == 206 and body == whole[-50:]
            status, headers, _ = client.request("GET", red["url"], headers={
                "Range": f"bytes={len(whole)}-"})
            assert status == 416 and headers["Content-Range"] == f"bytes */{len(whole)}"
            status, _, body = client.request("GET", "/v2/edged/clips/1.000-door-c99")
            assert status == 404 and json.loads(body)["code"] == "clip_not_found"
            for bad in ("..%2F..%2Fetc%2Fpasswd", "%2E%2E", ".hidden",
                        "..%2Fdoor%2F" + red["id"]):
                status, _, body = client.request("GET", f"/v2/edged/clips/{bad}")
                assert status in (400, 404) and b"ftyp" not in body[:16], bad
            status, _, body = client.request("GET", "/v2/edged/clips?since=abc")
            assert status == 400 and json.loads(body)["code"] == "invalid_input"

    # The CLI: list, and export in ranges (small ones here: the file takes several).
    monkeypatch.setattr(clips_cli, "CHUNK", 1000)
    target = ["--socket", str(served.socket)]
    assert main(["clips", "list", "--json", "--stream", "door", *target]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert red["id"] in [row["id"] for row in listed]
    assert main(["clips", "list", "--kind", "segment", "--json", *target]) == 0
    segments = sorted(json.loads(capsys.readouterr().out), key=lambda r: r["start_time"])
    assert len(segments) >= 3 and {r["kind"] for r in segments} == {"segment"}
    gaps = [after["start_time"] - before["end_time"]
            for before, after in itertools.pairwise(segments)]
    assert min(gaps) > -0.01, "segments never overlap"
    assert sum(abs(g) < 0.01 for g in gaps) >= 2, f"they join exactly (but at a reconnect): {gaps}"
    probe = ffprobe(store.path(store.get(segments[0]["id"])))  # type: ignore[arg-type]
    assert probe["frames"][0]["key_frame"] == 1
    span = tmp_path / "span.mp4"  # a span of segments, joined into one file by remux
    since, until = segments[0]["start_time"] + 0.5, segments[2]["start_time"] + 0.5
    assert main(["clips", "export", "--stream", "door", "--since", str(since), "--until",
                 str(until), "-o", str(span), *target]) == 0
    joined = ffprobe(span)
    assert joined["frames"][0]["key_frame"] == 1
    assert len(joined["frames"]) == sum(r["packets"] for r in segments[:3])
    lasted = sum(float(ffprobe(store.path(store.get(r["id"])))["format"]["duration"])  # type: ignore[arg-type]
                 for r in segments[:3])
    assert abs(float(joined["format"]["duration"]) - lasted) <= 2 / FPS
    query = f"stream=door&since={since}&until={until}"
    for client in (served.client(), EdgedClient(http=served.http, timeout_s=30)):
        with client:  # the route the CLI used, on both listeners: made as it is sent
            status, headers, body = client.request("GET", f"/v2/edged/span?{query}")
            assert status == 200 and headers["Transfer-Encoding"] == "chunked"
            assert headers["Content-Type"] == "video/mp4"
            assert headers["X-Edged-Segments"] == "3" and body == span.read_bytes()
    with served.client() as client:
        for bad, code in ((f"stream=door&since={until}&until={since}", 400),
                          (f"stream=door&since={since}&until={since + 90000}", 400),
                          ("stream=door&since=1&until=2", 404),
                          (f"stream=gate&since={since}&until={until}", 404)):
            status, _, body = client.request("GET", f"/v2/edged/span?{bad}")
            assert status == code and json.loads(body)["code"] in ("invalid_input",
                                                                   "clip_not_found"), bad
    assert main(["clips", "export", "--stream", "door", "--since", "1", "--until", "2", "-o",
                 str(tmp_path / "none.mp4"), *target]) == 1
    assert "404" in capsys.readouterr().err and not (tmp_path / "none.mp4").exists()
    assert main(["clips", "list", *target]) == 0
    assert red["id"] in capsys.readouterr().out
    out = tmp_path / "red.mp4"
    assert main(["clips", "export", "--event", ends[0]["id"], "-o", str(out), *target]) == 0
    assert out.read_bytes() == whole and len(whole) > 3 * 1000
    assert ffprobe(out)["streams"][0]["codec_name"] == "h264"
    assert main(["clips", "export", "1.000-door-c99", "-o", str(tmp_path / "x.mp4"),
                 *target]) == 1
    assert "404" in capsys.readouterr().err and not (tmp_path / "x.mp4").exists()

    # The status page plays the event's clip in Chromium, as long as the recording is.
    page = browser.page(f"http://{served.http}/")
    selector = f"video.clip[data-clip=\"{red['id']}\"]"
    page.wait_for(f"!!document.querySelector('{selector}')", timeout=30,
                  what="the red object's clip on the page")
    video = f"document.querySelector('{selector}')"
    page.evaluate("(() => { const v = " + video + ";"
                  " v.preload = 'auto'; v.muted = true; v.load(); })()")
    duration = page.wait_for("(() => { const v = " + video + ";"
                             " return v.readyState >= 1 && v.duration; })()", timeout=30,
                             what="the clip's metadata in Chromium")
    assert abs(duration - red["duration"]) <= 2 / FPS
    played = page.wait_for("(() => { const v = " + video + ";"
                           " v.play(); return v.currentTime > 0.2 && v.currentTime; })()",
                           timeout=30, what="the clip playing")
    assert played > 0.2 and page.console == [], page.console
    # Seeking: Chromium asks for the bytes it needs with Range, each answer read from the file
    # a chunk at a time.
    target_s = round(duration / 2, 2)
    page.evaluate("(() => { const v = " + video + f"; v.pause(); v.currentTime = {target_s}; }})()")
    landed = page.wait_for("(() => { const v = " + video + ";"
                           " return !v.seeking && v.readyState >= 2 && v.currentTime; })()",
                           timeout=30, what="the clip seeking to its middle")
    assert abs(landed - target_s) <= 2 / FPS and page.console == [], page.console


def test_daemon_when_recording_motion_keeps_only_segments_where_the_picture_changed(
        make_served: ServeFactory, crossing: Path) -> None:
    with rtsp_server(crossing) as url:
        served = make_served(
            cache="preload: [grid_det]",
            streams=f"[{{name: door, source: '{url}', model: grid_det, labels: [red, blue], "
                    "record: {enabled: true, segment_s: 2, mode: motion}}]")
        store = served.daemon.clips
        assert store is not None and served.daemon.pipelines
        motion = served.daemon.pipelines[0].motion
        recorder = getattr(motion, "__self__", None)  # the stream's SegmentRecorder
        assert isinstance(recorder, SegmentRecorder)
        # The squares cross 4.2 s and 9.6 s into the video; between, 4.2 s of a still
        # picture: a segment there has no motion and goes.

        def gaps() -> list[float]:
            kept = sorted(store.list(kind="segment"), key=lambda c: c.start_time)
            return [b.start_time - a.end_time for a, b in itertools.pairwise(kept)]

        wait_until(lambda: recorder.dropped_idle >= 1 and any(g > 1.5 for g in gaps()),
                   timeout=60, what="both crossings kept, a still segment between dropped",
                   details=lambda: f"gaps {gaps()}, dropped {recorder.dropped_idle}")
    kept = sorted(store.list(kind="segment"), key=lambda c: c.start_time)
    assert len(kept) >= 2 and all(g > -0.01 for g in gaps())
    for row in kept:
        assert ffprobe(store.path(row))["frames"][0]["key_frame"] == 1
