"""The decoder each camera stream uses: nvv4l2decoder pipelines on a Jetson with GStreamer,
FFmpeg otherwise, with the reason logged once, and the fallback when a pipeline will not
open. The machine's answers come from a probe the tests fill in; files are real videos."""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import pytest

from edged.sources import Backoff, FrameQueue, SourceState
from edged.sources.camera import CameraSource
from edged.sources.hwdecode import (
    DecodeProbe,
    ffmpeg_codec,
    file_pipeline,
    plan,
    rtsp_pipeline,
)

TAIL = ("nvv4l2decoder ! nvvidconv ! video/x-raw, format=BGRx ! videoconvert ! "
        "video/x-raw, format=BGR ! appsink drop=true max-buffers=1 sync=false")


class Machine:
    """A probe's answers, counting how often each is asked."""

    def __init__(self, *, jetson: bool = True, gst: bool = True,
                 elements: tuple[str, ...] = ("nvv4l2decoder", "nvvidconv"),
                 codec: str | None = "h264") -> None:
        self.asked: list[str] = []
        self.probe = DecodeProbe(is_jetson=lambda: self._ask("jetson", jetson),
                                 opencv_gstreamer=lambda: self._ask("gst", gst),
                                 has_element=lambda e: self._ask(e, e in elements),
                                 codec_of=lambda path: codec)

    def _ask(self, what: str, answer: bool) -> bool:
        self.asked.append(what)
        return answer


def write_mjpg(path: Path, frames: int = 20) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (64, 48))
    assert writer.isOpened(), f"OpenCV cannot write {path}"
    try:
        for i in range(frames):
            writer.write(np.full((48, 64, 3), i * 10 % 255, np.uint8))
    finally:
        writer.release()
    return path


def test_rtsp_pipeline_uses_tcp_the_codec_depayloader_and_nvdec() -> None:
    assert rtsp_pipeline("rtsp://cam/stream") == (
        'rtspsrc location="rtsp://cam/stream" protocols=tcp latency=200 ! '
        "application/x-rtp, media=video ! rtph264depay ! h264parse ! " + TAIL)
    h265 = rtsp_pipeline('rtsp://u:p"w\\d@cam/1', "h265", latency_ms=50)
    assert 'location="rtsp://u:p\\"w\\\\d@cam/1"' in h265  # quotes in credentials escaped
    assert "latency=50" in h265 and "rtph265depay ! h265parse ! nvv4l2decoder" in h265


@pytest.mark.parametrize(("name", "codec", "head"), [
    ("a.mp4", "h264", 'filesrc location="/v/a.mp4" ! qtdemux ! queue ! h264parse ! '),
    ("b.MKV", "h265", 'filesrc location="/v/b.MKV" ! matroskademux ! queue ! h265parse ! '),
    ("c.ts", "h264", 'filesrc location="/v/c.ts" ! tsdemux ! queue ! h264parse ! '),
    ("d.h265", "h265", 'filesrc location="/v/d.h265" ! h265parse ! '),
])
def test_file_pipeline_demuxes_by_suffix_and_parses_the_codec(name: str, codec: str,
                                                              head: str) -> None:
    assert file_pipeline(Path("/v") / name, codec) == head + TAIL


def test_plan_on_a_jetson_with_the_plugins_decodes_in_hardware() -> None:
    machine = Machine(codec="h265")
    rtsp = plan("rtsp", "rtsp://cam/1", None, machine.probe)
    assert rtsp.decoder == "nvv4l2decoder" and rtsp.note is None
    assert rtsp.pipeline == rtsp_pipeline("rtsp://cam/1", "h264")  # RTSP: H.264 unless told
    told = plan("rtsp", "rtsp://cam/1", None, machine.probe, codec="h265")
    assert told.pipeline == rtsp_pipeline("rtsp://cam/1", "h265")
    video = plan("file", "file:///v/a.mkv", Path("/v/a.mkv"), machine.probe)
    assert video.pipeline == file_pipeline(Path("/v/a.mkv"), "h265")
    plan("rtsp", "rtsp://cam/2", None, machine.probe)
    assert sorted(machine.asked) == ["gst", "jetson", "nvv4l2decoder", "nvvidconv"]  # once


@pytest.mark.parametrize(("machine", "note"), [
    (Machine(elements=("nvvidconv",)), "GStreamer plugin(s) nvv4l2decoder not installed"),
    (Machine(elements=()), "plugin(s) nvv4l2decoder, nvvidconv not installed"),
    (Machine(gst=False), "this OpenCV has no GStreamer"),
    (Machine(codec="mjpg"), "a.mp4 is mjpg, not H.264/H.265: decoded by FFmpeg"),
    (Machine(codec=None), "a.mp4 is of unknown codec"),
])
def test_plan_when_hardware_cannot_take_it_stays_on_ffmpeg_and_says_why(
        machine: Machine, note: str) -> None:
    chosen = plan("file", "file:///v/a.mp4", Path("/v/a.mp4"), machine.probe)
    assert chosen.decoder == "ffmpeg" and chosen.pipeline is None
    assert note in (chosen.note or "")


def test_plan_off_a_jetson_is_ffmpeg_quietly_unless_hardware_was_asked_for() -> None:
    machine = Machine(jetson=False)
    assert plan("rtsp", "rtsp://cam/1", None, machine.probe) == plan(
        "rtsp", "rtsp://cam/1", None, machine.probe)
    assert plan("rtsp", "rtsp://cam/1", None, machine.probe).note is None
    asked = plan("rtsp", "rtsp://cam/1", None, machine.probe, decoder="nvv4l2decoder")
    assert asked.decoder == "ffmpeg" and asked.note == "no hardware decoding: not a Jetson"
    forced = Machine()
    assert plan("rtsp", "rtsp://c", None, forced.probe, decoder="ffmpeg").decoder == "ffmpeg"
    assert forced.asked == []  # the CPU path asks the machine nothing


def test_plan_when_a_probe_breaks_takes_ffmpeg() -> None:
    def broken() -> bool:
        raise OSError("gst-inspect crashed")

    probe = DecodeProbe(is_jetson=lambda: True, opencv_gstreamer=lambda: True,
                        has_element=lambda e: broken(), codec_of=lambda p: "h264")
    chosen = plan("rtsp", "rtsp://c", None, probe)
    assert chosen.decoder == "ffmpeg" and "not installed" in (chosen.note or "")


def test_ffmpeg_codec_reads_a_real_file(tmp_path: Path) -> None:
    assert ffmpeg_codec(write_mjpg(tmp_path / "v.avi")) == "mjpg"
    (tmp_path / "not.mp4").write_bytes(b"not a video")
    assert ffmpeg_codec(tmp_path / "not.mp4") is None


def test_camera_on_a_jetson_with_a_non_h264_file_streams_on_ffmpeg_and_logs_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    video = write_mjpg(tmp_path / "v.avi")
    machine = Machine()
    machine.probe.codec_of = ffmpeg_codec  # the real file's codec
    source = CameraSource("cam", video.as_uri(), FrameQueue(4, "drop_oldest"),
                          backoff=Backoff(0.01, 0.02), probe=machine.probe, loop=True)
    assert vars(source.read_stats())["decoder"] is None  # not decided before it opens
    with caplog.at_level(logging.INFO, logger="edged.sources.camera"):
        stream_one_frame(source)
    assert vars(source.read_stats())["decoder"] == "ffmpeg"
    notes = [r.getMessage() for r in caplog.records if "decod" in r.getMessage()]
    assert notes == ["stream cam: v.avi is mjpg, not H.264/H.265: decoded by FFmpeg"]


def stream_one_frame(source: CameraSource) -> None:
    """Start the source, see it stream a frame, stop it."""
    source.start()
    try:
        assert source.wait_state(SourceState.STREAMING, 10)
        assert source.queue.get(5) is not None
    finally:
        assert source.stop(5)


def test_camera_when_the_hardware_pipeline_will_not_open_falls_back_to_ffmpeg(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The probe claims NVDEC and an H.264 file; this machine has no nvv4l2decoder, so the
    pipeline cannot open: one warning, then FFmpeg decodes the same real file."""
    video = write_mjpg(tmp_path / "v.avi")
    source = CameraSource("cam", video.as_uri(), FrameQueue(4, "drop_oldest"),
                          backoff=Backoff(0.01, 0.02), probe=Machine(codec="h264").probe)
    with caplog.at_level(logging.WARNING, logger="edged.sources.camera"):
        stream_one_frame(source)
    assert vars(source.read_stats())["decoder"] == "ffmpeg"
    warnings = [r for r in caplog.records if getattr(r, "code", None) == "decoder_fallback"]
    assert len(warnings) == 1


@pytest.mark.parametrize(("uri", "shown"), [("http://cam/mjpg", "ffmpeg"), ("v4l2:///dev/video0",
                                             "v4l2"), ("csi://0", "nvarguscamerasrc")])
def test_camera_names_the_decoder_of_other_schemes(uri: str, shown: str) -> None:
    source = CameraSource("cam", uri, FrameQueue(1, "drop_oldest"))
    assert vars(source.read_stats())["decoder"] == shown
