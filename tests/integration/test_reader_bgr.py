"""The demuxing reader's frames are the models' input: its BGR conversion (one swscale
context kept for the reader) must give what `frame.to_ndarray(format="bgr24")` gave (a new
context per frame), bit for bit, on every frame of real video: H.264 with B-frames, H.265,
full-range (yuvj420p) H.264, and a change of resolution within a stream (a new context)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.video import carphone_frames, encode_h264

from edged.sources.base import Backoff, FrameQueue
from edged.sources.demux import DemuxSource


@pytest.fixture(scope="module")
def frames(real_models: Path) -> list[np.ndarray]:
    return carphone_frames(real_models)


def reference(path: Path) -> list[np.ndarray]:
    """Every frame as the reader converted it before (a reformatter per frame)."""
    import av

    with av.open(str(path)) as container:
        return [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]


class Both:
    """The reader's reformatter, which also converts each frame the old way (a reformatter
    per frame) and counts where the two differ."""

    def __init__(self) -> None:
        from av.video.reformatter import VideoReformatter

        self.kept = VideoReformatter()
        self.frames = 0
        self.differ: list[int] = []
        self.sizes: set[tuple[int, ...]] = set()

    def reformat(self, frame: object, **kwargs: object) -> object:
        out = self.kept.reformat(frame, **kwargs)
        new, old = out.to_ndarray(), frame.to_ndarray(format="bgr24")  # type: ignore[attr-defined]
        if new.dtype != old.dtype or new.shape != old.shape or not np.array_equal(new, old):
            self.differ.append(self.frames)
        self.frames += 1
        self.sizes.add(new.shape)
        return out


def read_all(path: Path) -> tuple[list[np.ndarray], Both]:
    source = DemuxSource("bgr", f"file://{path}", FrameQueue(2, "block"),
                         backoff=Backoff(1, 1))
    source.open()
    both = source._to_bgr = Both()
    source._frame_interval_s = 0.0  # as fast as it decodes: no playing at the file's rate
    try:
        got = []
        while (data := source.read()) is not None:
            got.append(data)
        return got, both
    finally:
        source.close()


def full_range(path: Path, frames: list[np.ndarray]) -> Path:
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=30)
        stream.width, stream.height, stream.pix_fmt = 176, 144, "yuvj420p"
        stream.options = {"preset": "veryfast", "bf": "2"}
        for image in frames:
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def two_sizes(path: Path, frames: list[np.ndarray]) -> Path:
    """An MPEG-TS stream whose pictures change size halfway (as a camera reconfigured)."""
    import cv2

    half = [cv2.resize(f, (88, 72)) for f in frames[:30]]
    first = encode_h264(path.with_name("a.ts"), frames[:30], gop=10, bframes=2)
    second = encode_h264(path.with_name("b.ts"), half, gop=10, bframes=2)
    path.write_bytes(first.read_bytes() + second.read_bytes())
    return path


@pytest.mark.parametrize("kind", ["h264", "h265", "full_range", "two_sizes"])
def test_reader_when_converting_to_bgr_gives_the_frames_bit_for_bit(
        kind: str, frames: list[np.ndarray], tmp_path: Path) -> None:
    if kind == "h264":
        path = encode_h264(tmp_path / "v.mp4", frames, gop=15, bframes=2)
    elif kind == "h265":
        path = encode_h264(tmp_path / "v.mp4", frames, gop=15, bframes=2, codec="h265")
    elif kind == "full_range":
        path = full_range(tmp_path / "v.mp4", frames)
    else:
        path = two_sizes(tmp_path / "v.ts", frames)
    got, both = read_all(path)
    assert both.frames == len(got) >= 30 and both.differ == []
    if kind == "two_sizes":  # (the decoder restarts where the format changes: compared
        assert both.sizes == {(144, 176, 3), (72, 88, 3)}  # above, frame by frame)
        return
    expected = reference(path)  # and end to end, against a plain decode
    assert len(got) == len(expected)
    for n, (a, b) in enumerate(zip(got, expected, strict=True)):
        assert a.dtype == b.dtype and a.shape == b.shape, n
        assert np.array_equal(a, b), f"frame {n} differs"
