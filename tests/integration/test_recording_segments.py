"""Continuous recording from real H.264 (the corpus clip encoded by PyAV's own libx264, with
B-frames): segments cut at keyframes that join exactly, beside the event clips in one store
(`PacketTee`), the budget deleting segments before clips and their own age, a span of them
joined into one file by remux, and mode active_objects keeping only segments with an object
in view; ffprobe checks every file."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from support.video import carphone_frames, carphone_h264, encode_h264, ffprobe

from edged.core.errors import InvalidInput
from edged.recording.clips import ClipRecorder
from edged.recording.concat import concatenate
from edged.recording.config import ClipsConfig, RecordConfig
from edged.recording.segments import PacketTee, SegmentRecorder
from edged.recording.store import ClipStore
from edged.sources.base import Backoff, FrameQueue
from edged.sources.demux import DemuxSource
from edged.sources.packets import PacketSink

FRAME_S = 1 / 30


@pytest.fixture(scope="module")
def frames(real_models: Path) -> list[np.ndarray]:
    return carphone_frames(real_models)


@pytest.fixture(scope="module")
def h264(frames: list[np.ndarray], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return carphone_h264(frames, tmp_path_factory.mktemp("video"))


def play(h264: Path, sink: PacketSink, *recorders: SegmentRecorder | ClipRecorder,
         clip: tuple[ClipRecorder, int] | None = None) -> int:
    """Read the file to its end through a demuxing reader whose packets go to `sink`; an
    object's event on the `clip` recorder at the given frame (from 1). Closes `recorders`;
    returns the frames read."""
    source = DemuxSource("door", f"file://{h264}", FrameQueue(4, "block"), watchdog_s=5.0,
                         backoff=Backoff(0.2, 1.0), sink=sink)
    source.start()
    try:
        n = 0
        while (frame := source.queue.get(5.0)) is not None:
            n += 1
            if clip is not None and n == clip[1]:
                clip[0].object_started("o", frame.captured)
                clip[0].object_ended("o", frame.captured)
    finally:
        source.stop(10.0)
        for recorder in recorders:
            recorder.close()
    return n


def test_segments_when_recording_continuously_follow_one_another_from_keyframes(
        h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    segments = SegmentRecorder("door", RecordConfig(enabled=True, segment_s=2.0), store)
    clips = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=1.0,
                                             post_capture_s=1.0), store)
    n = play(h264, PacketTee([segments, clips]), segments, clips, clip=(clips, 100))
    assert n == 360
    parts = sorted(store.list(kind="segment"), key=lambda c: c.start_time)
    [clip] = store.list(kind="clip")
    assert clip.events == ("o",)
    assert len(parts) == 6 and sum(p.packets for p in parts) == 360
    for before, after in itertools.pairwise(parts):
        assert abs(after.start_time - before.end_time) < 0.01  # no gap, no overlap
    for part in parts:
        assert part.kind == "segment" and part.id.endswith(tuple(f"-s{i}" for i in range(9)))
        assert 2.0 <= part.duration <= 2.0 + 0.5 + FRAME_S or part is parts[-1]
        probe = ffprobe(store.path(part))
        assert probe["frames"][0]["key_frame"] == 1 and len(probe["frames"]) == part.packets


def test_store_when_over_budget_deletes_segments_before_clips_and_ages_them_apart(
        h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    segments = SegmentRecorder("door", RecordConfig(enabled=True, segment_s=4.0), store)
    clips = ClipRecorder("door", ClipsConfig(enabled=True, pre_capture_s=1.0,
                                             post_capture_s=0.5), store)
    # a clip early on: older than most segments
    play(h264, PacketTee([segments, clips]), segments, clips, clip=(clips, 60))
    [clip] = store.list(kind="clip")
    parts = sorted(store.list(kind="segment"), key=lambda c: c.start_time)
    assert len(parts) == 3
    room = clip.size + parts[-1].size  # the clip and the newest segment fit
    small = ClipStore(tmp_path / "rec", room, 0)
    kept = {c.id for c in small.list()}
    assert kept == {clip.id, parts[-1].id}  # the older clip outlived two newer segments
    now = parts[-1].end_time + 100.0
    aged = ClipStore(tmp_path / "rec", 10**9, 0, max_age_s=3600.0, segment_age_s=50.0,
                     clock=lambda: now)
    assert [c.id for c in aged.list()] == [clip.id]  # segments age out sooner


def test_concatenate_when_given_a_span_of_segments_writes_one_file_of_them_all(
        h264: Path, tmp_path: Path) -> None:
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    segments = SegmentRecorder("door", RecordConfig(enabled=True, segment_s=2.0), store)
    play(h264, segments, segments)
    parts = sorted(store.list(kind="segment"), key=lambda c: c.start_time)
    out = tmp_path / "span.mp4"
    written = concatenate([store.path(p) for p in parts[1:4]], out)
    assert written == sum(p.packets for p in parts[1:4])
    probe = ffprobe(out)
    assert probe["frames"][0]["key_frame"] == 1 and len(probe["frames"]) == written
    times = [float(f["pts_time"]) for f in probe["frames"]]
    assert times == sorted(times)  # one timeline, no jump back at a joint
    expected = sum(p.duration for p in parts[1:4])
    assert abs(float(probe["format"]["duration"]) - expected) <= 2 * FRAME_S


def test_concatenate_when_the_format_changes_refuses_and_leaves_no_file(
        frames: list[np.ndarray], tmp_path: Path) -> None:
    import cv2

    big = encode_h264(tmp_path / "big.mp4", frames[:30], gop=15)
    small = encode_h264(tmp_path / "small.mp4", [cv2.resize(f, (88, 72)) for f in frames[:30]],
                        gop=15)
    with pytest.raises(InvalidInput, match=r"88x72.*export it in parts"):
        concatenate([big, small], tmp_path / "out.mp4")
    assert not list(tmp_path.glob("out.mp4*"))


def test_segments_when_mode_is_active_objects_keep_only_those_with_an_object_in_view(
        h264: Path, tmp_path: Path) -> None:
    from tools.bench.recording import read_packets

    packets = read_packets(h264)  # 12 s, a keyframe every 0.5 s: six 2 s segments
    store = ClipStore(tmp_path / "rec", 10**9, 0)
    segments = SegmentRecorder("door", RecordConfig(enabled=True, segment_s=2.0,
                                                    mode="active_objects"), store)
    seen = {150, 151, 152}  # an object in view for three frames, 5 s in
    for i, packet in enumerate(packets):
        segments.packet(packet)
        if i - 20 in seen:  # the events stage reports after the model: 20 frames late
            segments.activity(packets[i - 20].wall)
    segments.close()
    [kept] = store.list(kind="segment")
    assert kept.start_time <= packets[150].wall <= kept.end_time
    assert segments.dropped_idle == 5 and segments.segments_written == 1
    assert sorted(p.name for p in (tmp_path / "rec" / "door").iterdir()) == sorted(
        [f"{kept.id}.mp4", f"{kept.id}.json"])  # the idle ones are gone from the disk
    assert ffprobe(store.path(kept))["frames"][0]["key_frame"] == 1
