"""Event clips from real H.264 video (the corpus clip encoded by PyAV's own libx264): the
demuxing reader on a file and on Debian's GStreamer RTSP server, packets into the clip
recorder, clips checked by ffprobe: H.264, the first frame a keyframe at or before the event's
start minus the pre-capture, the end past the object's end plus the post-capture, the
duration the store records. Overlapping events share a clip; a camera that stops mid-clip
leaves a valid file; a crash's `.part` and orphans are dropped at start; the budget deletes
the oldest."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from support.polling import wait_until
from support.video import (
    carphone_frames,
    carphone_h264,
    corrupt_ts,
    encode_h264,
    ffprobe,
    rtsp_server,
)

from edged.core.errors import RecordingUnavailable
from edged.recording.clips import ClipRecorder
from edged.recording.config import ClipsConfig
from edged.recording.store import ClipInfo, ClipStore, valid_id
from edged.sources.base import Backoff, Frame, FrameQueue
from edged.sources.demux import DemuxSource

PRE_S, POST_S = 2.0, 1.0
FRAME_S = 1 / 30


@pytest.fixture(scope="module")
def frames(real_models: Path) -> list[np.ndarray]:
    return carphone_frames(real_models)


@pytest.fixture(scope="module")
def h264(frames: list[np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return carphone_h264(frames, tmp_path_factory.mktemp("video"))


Script = Callable[[int, Frame, ClipRecorder], None]


def record(uri: str, store: ClipStore, script: Script, *, frames_wanted: int,
           cfg: ClipsConfig | None = None) -> ClipRecorder:
    """Read `uri` with the demuxing reader into a recorder, calling `script` on each frame
    (its number from 1), until `frames_wanted` frames came."""
    recorder = ClipRecorder("door", cfg or ClipsConfig(enabled=True, pre_capture_s=PRE_S,
                                                       post_capture_s=POST_S), store)
    source = DemuxSource("door", uri, FrameQueue(4, "block"), watchdog_s=5.0,
                         backoff=Backoff(0.2, 1.0), sink=recorder)
    source.start()
    try:
        for n in range(1, frames_wanted + 1):
            frame = source.queue.get(10.0)
            assert frame is not None, f"frame {n} did not come: {source.read_stats()}"
            script(n, frame, recorder)
    finally:
        assert source.stop(10.0)
        recorder.close()
    return recorder


def check_clip(store: ClipStore, clip: ClipInfo, start: float, end: float) -> dict:
    """ffprobe agrees: H.264, keyframe first, at or before start - pre, past end + post."""
    probe = ffprobe(store.path(clip))
    stream, shown = probe["streams"][0], probe["frames"]
    assert stream["codec_name"] == "h264" and (stream["width"], stream["height"]) == (176, 144)
    assert shown[0]["key_frame"] == 1 and float(shown[0]["pts_time"]) == 0.0
    assert clip.start_time <= start - PRE_S, "the whole pre-capture is in the clip"
    assert clip.end_time >= end + POST_S, "the whole post-capture is in the clip"
    assert clip.start_time > start - PRE_S - 0.5 - 3 * FRAME_S  # from the keyframe before
    duration = float(probe["format"]["duration"])
    assert abs(duration - clip.duration) <= 2 * FRAME_S
    assert len(shown) == clip.packets
    return probe


def test_clip_when_an_object_lives_in_a_file_covers_pre_and_post_capture_from_a_keyframe(
        h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    times: dict[str, float] = {}

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n == 100:
            times["start"] = frame.captured
            assert recorder.object_started("obj-1", frame.captured) is not None
        if n == 160:
            times["end"] = frame.captured
            ref = recorder.object_ended("obj-1", frame.captured)
            assert ref is not None and ref.end_time == pytest.approx(frame.captured + POST_S)

    recorder = record(f"file://{h264}", store, script, frames_wanted=220)
    [clip] = store.list()
    assert clip.events == ("obj-1",) and recorder.clips_written == 1
    check_clip(store, clip, times["start"], times["end"])
    record_file = json.loads((tmp_path / "rec" / "door" / f"{clip.id}.json").read_text())
    assert record_file["id"] == clip.id and valid_id(clip.id)


def test_clip_when_events_overlap_on_rtsp_shares_one_clip(h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    times: dict[str, float] = {}

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n == 90:
            times["start"] = frame.captured
            recorder.object_started("a", frame.captured)
        if n == 110:
            recorder.object_started("b", frame.captured)
        if n == 130:
            recorder.object_ended("a", frame.captured)
        if n == 170:
            times["end"] = frame.captured
            recorder.object_ended("b", frame.captured)

    with rtsp_server(h264) as url:
        record(url, store, script, frames_wanted=230)
    [clip] = store.list()
    assert clip.events == ("a", "b")
    check_clip(store, clip, times["start"], times["end"])


def test_clip_when_the_camera_stops_mid_clip_ends_with_a_valid_file(
        frames: list[np.ndarray], tmp_path: Path) -> None:
    short = encode_h264(tmp_path / "short.mp4", frames, repeat=1, gop=15)  # 4 s
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    started: list[float] = []
    with rtsp_server(short) as url:
        recorder = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=1.0,
                                                    post_capture_s=1.0), store)
        source = DemuxSource("door", url, FrameQueue(4, "drop_oldest"), watchdog_s=3.0,
                             backoff=Backoff(0.2, 1.0), sink=recorder)
        source.start()
        try:
            n = 0
            while n < 60:
                frame = source.queue.get(10.0)
                assert frame is not None
                n += 1
            started.append(frame.captured)
            recorder.object_started("stays", frame.captured)  # never ends: the file does
            wait_until(lambda: store.list(), timeout=20, what="the clip ended by the camera")
        finally:
            source.stop(10.0)
            recorder.close()
    [clip] = store.list()
    probe = ffprobe(store.path(clip))
    assert probe["frames"][0]["key_frame"] == 1 and len(probe["frames"]) == clip.packets
    assert clip.start_time <= started[0] - 1.0
    assert float(probe["format"]["duration"]) > 1.0


def test_store_when_opened_after_a_crash_drops_parts_and_orphans_and_keeps_the_rest(
        h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n == 70:
            recorder.object_started("x", frame.captured)
            recorder.object_ended("x", frame.captured)

    record(f"file://{h264}", store, script, frames_wanted=120)
    [kept] = store.list()
    folder = tmp_path / "rec" / "door"
    (folder / "1.000-door-c9.mp4.part").write_bytes(b"\x00" * 100)  # cut by a crash
    (folder / "2.000-door-c8.mp4").write_bytes(b"\x00" * 100)  # no record
    (folder / "3.000-door-c7.json").write_text("{}")  # no clip
    again = ClipStore(tmp_path / "rec", 10**9, 0)
    assert [c.id for c in again.list()] == [kept.id] and again.dropped == 3
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{kept.id}.mp4",
                                                               f"{kept.id}.json"])


def test_store_when_over_its_budget_deletes_the_oldest_clips(h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n in (70, 150, 230):
            recorder.object_started(f"o{n}", frame.captured)
            recorder.object_ended(f"o{n}", frame.captured)

    record(f"file://{h264}", store, script, frames_wanted=300)
    clips = store.list()
    assert len(clips) == 3
    newest_two = sum(c.size for c in clips[:2])
    small = ClipStore(tmp_path / "rec", newest_two, 0)
    assert [c.id for c in small.list()] == [c.id for c in clips[:2]] and small.deleted == 1
    assert not store.path(clips[2]).exists()


def test_store_when_the_folder_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(RecordingUnavailable, match="cannot be made"):
        ClipStore(blocker / "rec", 10**9, 0)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(RecordingUnavailable, match="not writable"):
            ClipStore(locked, 10**9, 0)


@pytest.mark.parametrize("clip_id", ["../etc/passwd", "1.000-door-c1/../../x", ".hidden",
                                     "1.000-door-c1.mp4", "1.000-..-c1", "", "1.000-door-1"])
def test_store_when_ids_carry_path_tricks_refuses_them(clip_id: str, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    assert not valid_id(clip_id) and store.get(clip_id) is None


def test_reader_when_packets_arrive_corrupt_skips_and_counts_them_and_clips_stay_valid(
        frames: list[np.ndarray], tmp_path: Path) -> None:
    clean = encode_h264(tmp_path / "clean.ts", frames, repeat=2, gop=15)
    touched = corrupt_ts(clean, tmp_path / "lossy.ts")
    assert touched > 0
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    source_stats = []

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n == 60:
            recorder.object_started("o", frame.captured)
        if n == 200:
            recorder.object_ended("o", frame.captured)

    recorder = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=1.0,
                                                post_capture_s=0.0), store)
    source = DemuxSource("door", f"file://{tmp_path / 'lossy.ts'}", FrameQueue(4, "block"),
                         watchdog_s=5.0, backoff=Backoff(0.2, 1.0), sink=recorder)
    source.start()
    try:
        n = 0
        while (frame := source.queue.get(5.0)) is not None:
            n += 1
            script(n, frame, recorder)
    finally:
        source.stop(10.0)
        recorder.close()
        source_stats.append(source.read_stats())
    stats = source_stats[0]
    assert 0 < stats.rejected <= 2 * touched  # (a lost TS packet may cut two access units)
    assert stats.frames_in >= 240 - 2 * stats.rejected - 15
    [clip] = store.list()
    probe = ffprobe(store.path(clip))  # (it reads the whole file without an error)
    assert probe["frames"][0]["key_frame"] == 1
    assert len(probe["frames"]) >= clip.packets - 3 * stats.rejected  # damaged ones aside


def test_reader_when_the_camera_changes_resolution_starts_a_new_clip(
        frames: list[np.ndarray], tmp_path: Path) -> None:
    import cv2

    small = [cv2.resize(f, (88, 72)) for f in frames]
    first = encode_h264(tmp_path / "a.ts", frames, gop=15)
    second = encode_h264(tmp_path / "b.ts", small, gop=15)
    joined = tmp_path / "joined.ts"  # MPEG-TS concatenates: the camera's new parameter sets
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    store = ClipStore(tmp_path / "rec", 10**9, 0)

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n == 60:
            recorder.object_started("o", frame.captured)  # lives across the change
        if n == 200:
            recorder.object_ended("o", frame.captured)

    record(f"file://{joined}", store, script, frames_wanted=230)
    before, after = sorted(store.list(), key=lambda c: c.start_time)
    assert (before.width, before.height, after.width, after.height) == (176, 144, 88, 72)
    for clip, size in ((before, (176, 144)), (after, (88, 72))):
        probe = ffprobe(store.path(clip))
        assert (probe["streams"][0]["width"], probe["streams"][0]["height"]) == size
        assert probe["frames"][0]["key_frame"] == 1 and len(probe["frames"]) == clip.packets
        assert clip.events == ("o",)


def test_clip_when_the_camera_sends_h265_over_rtsp_is_h265(frames: list[np.ndarray],
                                                           tmp_path: Path) -> None:
    video = encode_h264(tmp_path / "hevc.mp4", frames, repeat=2, gop=15, codec="h265")
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    times: dict[str, float] = {}

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n == 90:
            times["start"] = frame.captured
            recorder.object_started("h", frame.captured)
        if n == 130:
            times["end"] = frame.captured
            recorder.object_ended("h", frame.captured)

    with rtsp_server(video, codec="h265") as url:
        record(url, store, script, frames_wanted=180)
    [clip] = store.list()
    assert clip.codec == "hevc"
    probe = ffprobe(store.path(clip))
    assert probe["streams"][0]["codec_name"] == "hevc" and probe["frames"][0]["key_frame"] == 1
    assert clip.start_time <= times["start"] - PRE_S and clip.end_time >= times["end"] + POST_S


def test_clip_when_the_disk_is_below_its_floor_does_not_start_and_frames_go_on(
        h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, min_free_bytes=2**62)  # no disk is that free
    answers: list[str | None] = []

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n == 60:
            answers.append(recorder.object_started("o", frame.captured))

    recorder = record(f"file://{h264}", store, script, frames_wanted=90)
    assert answers == [None] and recorder.refused_no_room >= 1 and store.list() == []
    assert recorder.object_ended("o", 0.0) is None


def test_reader_when_a_file_loops_goes_on_and_a_clip_across_the_loop_ends_there(
        frames: list[np.ndarray], tmp_path: Path) -> None:
    short = encode_h264(tmp_path / "short.mp4", frames, gop=15)  # 120 frames, 4 s
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    recorder = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=1.0,
                                                post_capture_s=1.0), store)
    source = DemuxSource("door", f"file://{short}", FrameQueue(4, "block"), watchdog_s=5.0,
                         backoff=Backoff(0.2, 1.0), sink=recorder, loop=True)
    source.start()
    try:
        for n in range(1, 301):  # two and a half times round
            frame = source.queue.get(10.0)
            assert frame is not None, n
            if n == 90:
                recorder.object_started("o", frame.captured)
            if n == 150:
                recorder.object_ended("o", frame.captured)
    finally:
        assert source.stop(10.0)
        recorder.close()
    assert source.read_stats().reconnects == 0
    clips = sorted(store.list(), key=lambda c: c.start_time)
    assert len(clips) == 2  # cut where the file started again, then on to end + post
    for clip in clips:
        probe = ffprobe(store.path(clip))
        assert probe["frames"][0]["key_frame"] == 1 and len(probe["frames"]) == clip.packets


def test_store_when_clips_pass_their_age_deletes_them_at_start_and_on_a_sweep(
        h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)

    def script(n: int, frame: Frame, recorder: ClipRecorder) -> None:
        if n in (70, 150):
            recorder.object_started(f"o{n}", frame.captured)
            recorder.object_ended(f"o{n}", frame.captured)

    record(f"file://{h264}", store, script, frames_wanted=220)
    older, newer = sorted(store.list(), key=lambda c: c.end_time)
    now = [newer.end_time + 3600.0]
    between = now[0] - (older.end_time + newer.end_time) / 2  # an age between the two
    aged = ClipStore(tmp_path / "rec", 10**9, 0, max_age_s=between, clock=lambda: now[0])
    assert [c.id for c in aged.list()] == [newer.id] and not store.path(older).exists()
    now[0] += newer.end_time - older.end_time + 1.0  # later: the newer one's age passes too
    aged.enforce_budget()
    assert aged.list() == [] and not store.path(newer).exists()


def test_clip_when_an_object_starts_before_any_keyframe_starts_at_the_next_one(
        h264: Path, tmp_path: Path) -> None:
    from tools.bench.recording import read_packets

    packets = read_packets(h264)
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    recorder = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=PRE_S,
                                                post_capture_s=POST_S), store)
    assert recorder.object_started("early", packets[0].wall - 1.0) is None  # nothing yet
    for packet in packets[:60]:
        recorder.packet(packet)
    assert recorder.in_clip("early")
    ref = recorder.object_ended("early", packets[59].wall)
    assert ref is not None
    for packet in packets[60:]:
        recorder.packet(packet)
    recorder.close()
    [clip] = store.list()
    assert clip.id == ref.id and clip.events == ("early",)
    assert clip.start_time == packets[0].wall and clip.end_time >= packets[59].wall + POST_S
