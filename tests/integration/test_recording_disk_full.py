"""A disk that fills during a clip, for real: the recording folder is a small tmpfs mounted
for the test (the kernel answers ENOSPC; the tests need root and are skipped without the right
to mount). The clip being written ends with a valid file of what fitted (ffprobe reads it: a
keyframe first, a duration above 0, every picture the record counts), recording stops with a
warning, and the camera's frames (the daemon's inference) go on."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.daemon import ServeFactory
from support.polling import wait_until
from support.video import carphone_frames, crossing_h264, encode_h264, ffprobe

from edged.recording.clips import ClipRecorder
from edged.recording.config import ClipsConfig, RecordConfig
from edged.recording.fragments import whole_part
from edged.recording.segments import PacketTee, SegmentRecorder
from edged.recording.store import ClipInfo, ClipStore
from edged.sources.base import Backoff, FrameQueue
from edged.sources.demux import DemuxSource
from tools.assets import models as test_models

FRAME_S = 1 / 30


def mounted_tmpfs(folder: Path, size_kib: int) -> Iterator[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs",
                           str(folder)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"a small filesystem cannot be mounted here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 160 KiB filesystem: about 15 s of the carphone clip."""
    yield from mounted_tmpfs(tmp_path / "disk", 160)


@pytest.fixture(scope="module")
def long_h264(real_models: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 s of carphone (a keyframe every half second): more than the small disk holds."""
    frames: list[np.ndarray] = carphone_frames(real_models)
    return encode_h264(tmp_path_factory.mktemp("video") / "long.mp4", frames, repeat=10,
                       gop=15, bframes=2)


def check_valid(store: ClipStore, info: ClipInfo) -> dict:
    """ffprobe reads the file that is left: H.264, a keyframe first at 0, as long as the
    record says, every picture the record counts; nothing after its last whole fragment."""
    path = store.path(info)
    probe = ffprobe(path)
    frames = probe["frames"]
    assert probe["streams"][0]["codec_name"] == "h264"
    assert frames[0]["key_frame"] == 1 and float(frames[0]["pts_time"]) == 0.0
    duration = float(probe["format"]["duration"])
    assert duration > 0 and abs(duration - info.duration) <= 2 * FRAME_S
    assert len(frames) == info.packets
    assert whole_part(path).size == path.stat().st_size
    return probe


def test_clip_when_the_disk_fills_during_it_ends_with_a_valid_file_and_frames_go_on(
        long_h264: Path, small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = ClipStore(small_disk / "rec", 10**9, 0)
    recorder = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=1.0,
                                                post_capture_s=1.0), store)
    source = DemuxSource("door", f"file://{long_h264}", FrameQueue(4, "block"),
                         watchdog_s=5.0, backoff=Backoff(0.2, 1.0), sink=recorder)
    wanted = 900  # 30 s: the disk is full long before
    caplog.set_level(logging.WARNING)
    source.start()
    try:
        for n in range(1, wanted + 1):
            frame = source.queue.get(10.0)
            assert frame is not None, f"frame {n} did not come: {source.read_stats()}"
            if n == 60:
                assert recorder.object_started("obj-1", frame.captured) is not None
    finally:
        assert source.stop(10.0)
        recorder.close()
    assert store.write_failures >= 1 and recorder.clips_written >= 1
    assert "recording_disk_full" in [getattr(r, "code", None) for r in caplog.records]
    [first, *_later] = sorted(store.list(), key=lambda c: c.start_time)
    assert first.events == ("obj-1",) and first.duration > 3.0
    check_valid(store, first)
    record = json.loads((small_disk / "rec" / "door" / f"{first.id}.json").read_text())
    assert record["packets"] == first.packets  # (written into the room taken at its start)
    assert not list((small_disk / "rec" / "door").glob("*.part"))
    reopened = ClipStore(small_disk / "rec", 10**9, 0)  # a restart keeps it as it is
    assert reopened.get(first.id) == store.get(first.id)


def test_segments_and_clips_when_the_disk_fills_keep_whole_files_and_resume_after_room(
        long_h264: Path, small_disk: Path) -> None:
    store = ClipStore(small_disk / "rec", 10**9, 0)
    segments = SegmentRecorder("door", RecordConfig(enabled=True, segment_s=4.0), store)
    clips = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=1.0,
                                             post_capture_s=1.0), store)
    source = DemuxSource("door", f"file://{long_h264}", FrameQueue(4, "block"),
                         watchdog_s=5.0, backoff=Backoff(0.2, 1.0),
                         sink=PacketTee([segments, clips]))
    source.start()
    try:
        for n in range(1, 600 + 1):
            frame = source.queue.get(10.0)
            assert frame is not None, f"frame {n} did not come: {source.read_stats()}"
            if n == 30:
                clips.object_started("obj-1", frame.captured)
    finally:
        assert source.stop(10.0)
        segments.close()
        clips.close()
    assert store.write_failures >= 1
    kept = store.list()
    assert {c.kind for c in kept} == {"clip", "segment"}
    for info in kept:
        check_valid(store, info)


@pytest.fixture
def crossing(repo_dir: Path, tmp_path: Path) -> Path:
    test_models.write_repository(repo_dir, names=["grid_det"])
    return crossing_h264(tmp_path, fps=10)


@pytest.fixture
def daemon_disk(tmp_path: Path) -> Iterator[Path]:
    """The first daemon's recording folder (make_served's `recordings-0`) on a 96 KiB disk;
    asked for before make_served, so it is unmounted after the daemon stopped."""
    yield from mounted_tmpfs(tmp_path / "recordings-0", 96)


def test_daemon_when_its_recording_disk_fills_keeps_inferring_and_serves_valid_files(
        daemon_disk: Path, make_served: ServeFactory, crossing: Path) -> None:
    served = make_served(
        cache="preload: [grid_det]", recording="min_free_mb: 0",
        streams=f"[{{name: door, source: 'file://{crossing}', model: grid_det, "
                "labels: [red, blue], loop: true, record: {enabled: true, segment_s: 2}}]")
    store = served.daemon.clips
    assert store is not None and store.root == daemon_disk
    wait_until(lambda: store.write_failures >= 1, timeout=90,
               what="the small disk to fill", details=lambda: repr(store.list()))
    [pipeline] = served.daemon.pipelines
    processed = pipeline.read_stats().processed
    wait_until(lambda: pipeline.read_stats().processed >= processed + 20, timeout=30,
               what="inference going on after the disk filled")
    kept = store.list()
    assert kept, "the files written before the disk filled are kept"
    for info in kept:
        probe = ffprobe(store.path(info))
        assert probe["frames"][0]["key_frame"] == 1
        assert float(probe["format"]["duration"]) > 0
        assert len(probe["frames"]) == info.packets
    with served.client() as client:
        status, _, body = client.request("GET", "/v2/edged/clips?kind=segment")
        assert status == 200 and len(json.loads(body)["clips"]) == len(kept)
