"""Source building blocks: the frame queue's back-pressure policies, backoff, the state
machine's allowed transitions, GStreamer pipeline strings (no GStreamer here: refused with the
fix named), and sensor payload decoding, good and bad."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from edged.sources import Backoff, Frame, FrameQueue, SourceError, SourceState
from edged.sources.camera import CameraSource, csi_pipeline, gst_pipeline, has_gstreamer
from edged.sources.sensor import SensorSource


def frame(seq: int) -> Frame:
    return Frame("s", seq, 0.0, 0.0, np.zeros((2, 2, 3), np.uint8))


@pytest.mark.parametrize(("policy", "kept"), [("drop_oldest", [3, 4]), ("drop_newest", [1, 2])])
def test_frame_queue_when_full_drops_by_policy_and_counts(policy: str, kept: list[int]) -> None:
    queue = FrameQueue(2, policy)  # type: ignore[arg-type]
    dropped = sum(queue.put(frame(i)) for i in range(1, 5))
    assert dropped == 2 and len(queue) == 2
    assert [queue.get(0).seq for _ in range(2)] == kept  # type: ignore[union-attr]
    assert queue.get(0) is None


def test_frame_queue_when_blocking_waits_for_room_and_close_releases_it() -> None:
    queue = FrameQueue(1, "block")
    queue.put(frame(1))
    results: list[int] = []
    putter = threading.Thread(target=lambda: results.append(queue.put(frame(2))))
    putter.start()
    putter.join(0.2)
    assert putter.is_alive()  # held: the queue is full
    assert queue.get(1).seq == 1  # type: ignore[union-attr]
    putter.join(5)
    assert results == [0] and queue.get(1).seq == 2  # type: ignore[union-attr]
    queue.put(frame(3))
    blocked = threading.Thread(target=lambda: results.append(queue.put(frame(4))))
    blocked.start()
    queue.close()
    blocked.join(5)
    assert results == [0, 1]  # given up, counted as dropped


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(0.5, 3.0)
    assert [backoff.next_delay() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    backoff.reset()
    assert backoff.next_delay() == 0.5


def test_source_when_a_transition_is_not_allowed_refuses_it() -> None:
    source = CameraSource("s", "file:///nonexistent.avi", FrameQueue(1, "drop_oldest"))
    source._enter(SourceState.STOPPED)
    with pytest.raises(RuntimeError, match="not allowed"):
        source._enter(SourceState.STREAMING)


def test_gstreamer_pipelines_are_built_for_argus_and_end_in_a_dropping_appsink() -> None:
    csi = csi_pipeline(1, 1920, 1080, 30)
    assert csi.startswith("nvarguscamerasrc sensor-id=1 ! video/x-raw(memory:NVMM)")
    assert "width=1920, height=1080, framerate=30/1" in csi
    assert csi.endswith("appsink drop=true max-buffers=1 sync=false")
    assert gst_pipeline("videotestsrc").endswith("format=BGR ! appsink drop=true "
                                                 "max-buffers=1 sync=false")
    own = "videotestsrc ! appsink name=mine"
    assert gst_pipeline(own) == own


@pytest.mark.skipif(has_gstreamer(), reason="this OpenCV has GStreamer")
@pytest.mark.parametrize("uri", ["csi://0", "gst://videotestsrc"])
def test_camera_when_opencv_has_no_gstreamer_stops_with_the_fix_named(uri: str) -> None:
    source = CameraSource("cam", uri, FrameQueue(1, "drop_oldest"),
                          backoff=Backoff(0.01, 0.01))
    source.start()
    assert source.wait_state(SourceState.STOPPED, 5)
    assert "JetPack's OpenCV" in (source.stats.last_error or "")
    assert source.stats.reconnects == 0  # retrying cannot help


def test_camera_when_the_file_is_missing_retries_with_backoff() -> None:
    source = CameraSource("cam", "file:///nonexistent/video.avi", FrameQueue(1, "drop_oldest"),
                          backoff=Backoff(0.01, 0.02))
    source.start()
    try:
        assert source.wait_state(SourceState.RECONNECTING, 5)
        assert "not a readable file" in (source.stats.last_error or "")
    finally:
        assert source.stop(5)
    assert source.state == SourceState.STOPPED


def sensor(payload: str = "json", shape: tuple[int, ...] = (2, 3)) -> SensorSource:
    return SensorSource("vib", "mqtt://plant/vib", FrameQueue(2, "drop_oldest"),
                        subscribe=None, shape=shape, dtype=np.dtype(np.float32),
                        payload=payload)  # type: ignore[arg-type]


def test_sensor_decode_when_payloads_are_good_gives_the_tensor() -> None:
    np.testing.assert_array_equal(sensor().decode(b"[[1, 2, 3], [4, 5, 6]]"),
                                  [[1, 2, 3], [4, 5, 6]])
    raw = np.arange(6, dtype="<f4").tobytes()
    np.testing.assert_array_equal(sensor("raw").decode(raw), np.arange(6).reshape(2, 3))
    assert sensor(shape=(-1, 3)).decode(b"[[1, 2, 3]]").shape == (1, 3)


@pytest.mark.parametrize(("payload", "message"), [
    (b"[[1, 2, 3]]", "shape"),
    (b"[1, 2, 3, 4, 5, 6]", "shape"),
    (b'{"v": 1}', "expected a JSON array"),
    (b"[[1, 2, 3], [4, 5, \"x\"]]", "not an array of float32"),
    (b"[[1, 2, 3], [4, 5]]", "not an array of float32"),
    (b"[[1, 2, 3], [4, 5, Infinity]]", "NaN or infinite"),
    (b"\xff\xfe", "not JSON"),
    (b"[" * 100000, "not JSON"),
])
def test_sensor_decode_when_json_is_bad_says_why(payload: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sensor().decode(payload)


def test_sensor_decode_when_raw_is_the_wrong_size_says_why() -> None:
    with pytest.raises(ValueError, match="23 bytes, expected 24"):
        sensor("raw").decode(b"\0" * 23)
    with pytest.raises(SourceError, match="fixed input shape"):
        sensor("raw", shape=(-1, 3))


def test_sensor_when_mqtt_is_disabled_cannot_open() -> None:
    with pytest.raises(SourceError, match="MQTT is disabled"):
        sensor().open()


@pytest.mark.parametrize("jitter", [0.0, -0.002, 0.002], ids=["exact", "early", "late"])
def test_source_fps_limit_when_the_source_is_faster_keeps_the_configured_rate(
        jitter: float) -> None:
    source = CameraSource("s", "file:///x.avi", FrameQueue(1000, "drop_oldest"), fps=10)
    times = [i / 30 + (jitter if i % 3 == 0 else 0.0) for i in range(1, 301)]  # 10 s at 30 fps
    for now in times:
        source._offer(np.zeros((2, 2, 3), np.uint8), now)
    snapshot = vars(source.read_stats())
    assert snapshot["frames_in"] in (99, 100, 101)  # 10 fps, not every fourth frame (7.5)
    assert snapshot["frames_in"] + snapshot["skipped"] == 300


def test_source_fps_limit_after_a_stall_starts_again_without_a_burst() -> None:
    source = CameraSource("s", "file:///x.avi", FrameQueue(1000, "drop_oldest"), fps=10)
    for now in [0.0, 5.0, 5.01, 5.02, 5.05, 5.1]:  # a 5 s gap, then frames 10-50 ms apart
        source._offer(np.zeros((2, 2, 3), np.uint8), now)
    assert vars(source.read_stats())["frames_in"] == 3  # at 0, 5.0 and 5.1: no catch-up burst
