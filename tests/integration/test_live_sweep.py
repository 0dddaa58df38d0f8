"""A height sweep against the real daemon (`edged run` as a subprocess, a 640x480 camera of
noise: JPEGs about as large as they get): 600 distinct `latest.jpg?h=N` asked from several
connections at once, as a probe would. The daemon keeps only a few sizes, so its RSS stays
where it was (each height kept a picture for good: +90 MiB here, +367 MiB at 1080p), and a
live MJPEG viewer of the stream goes on receiving new frames while the sweep runs (the sweep
held the stream's one drawing lock, and the viewer waited behind it)."""

from __future__ import annotations

import http.client
import itertools
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.demo import get, image
from support.polling import wait_until
from support.ports import free_port

from tools.assets import models as test_models
from tools.bench.broker import stop_process

WIDTH, HEIGHT = 640, 480
HEIGHTS = range(240, 840)  # 600: 240 below the frame's height, 360 at or above it
WARM = range(40, 240)  # asked first the same way: the drawings' working set, the kept sizes
SWEEPERS = 16  # connections asking at once
VIEWER_H = 120
# What a sweep may add once the drawings' working set is there: the allocator's slack (the
# kept pictures, 4 MiB at most, are full already). Each height kept its picture before: +90.
GROWTH_LIMIT = 16 * 2**20
LATEST = "/v2/edged/streams/cam/latest.jpg"


def write_noise_video(path: Path, frames: int = 8) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 5.0, (WIDTH, HEIGHT))
    assert writer.isOpened(), f"OpenCV cannot write {path}"
    rng = np.random.default_rng(3)
    try:
        for _ in range(frames):
            writer.write(rng.integers(0, 256, (HEIGHT, WIDTH, 3), np.uint8))
    finally:
        writer.release()
    return path


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def daemon(tmp_path: Path, short_dir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`edged run` on a looping noise camera through `colors`, with its TCP listener; its
    process and HOST:PORT."""
    models = test_models.write_repository(tmp_path / "models", names=["colors"])
    video = write_noise_video(tmp_path / "noise.avi")
    address = f"127.0.0.1:{free_port()}"
    config = tmp_path / "edged.yaml"
    config.write_text(f"""device_id: sweep
models_dir: {models}
cache: {{dir: {tmp_path / 'cache'}, preload: [colors]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {short_dir / 'e.sock'}, http: "{address}"}}
mqtt: {{enabled: false}}
logging: {{level: warning}}
streams: [{{name: cam, source: "file://{video}", model: colors, loop: true, fps: 5}}]
""")
    proc = subprocess.Popen([sys.executable, "-m", "edged.cli", "run", "--config", str(config)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _answers(address), timeout=60, alive=lambda: proc.poll() is None,
                   what="the daemon's first picture")
        yield proc, address
    finally:
        stop_process(proc, 20)


def _answers(address: str) -> bool:
    try:
        return get(address, LATEST)[0] == 200
    except OSError:
        return False


class Viewer:
    """A live.mjpeg viewer on a thread: when each part came (monotonic) and its frame."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)
        self.conn.request("GET", f"/v2/edged/streams/cam/live.mjpeg?h={VIEWER_H}")
        self.answer = self.conn.getresponse()
        assert self.answer.status == 200
        self.parts: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._read, name="viewer", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        fp = self.answer.fp
        seq = length = None
        while not self.stop.is_set():
            line = fp.readline()
            if not line:
                return
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "x-frame-seq":
                seq = int(value)
            elif line == b"\r\n" and length is not None and seq is not None:
                picture = image(fp.read(length))
                assert picture.shape[0] == VIEWER_H
                self.parts.append((time.monotonic(), seq))
                seq = length = None

    def close(self) -> None:
        self.stop.set()
        self.conn.close()  # the thread's read ends with the connection
        self.thread.join(10)


def ask(address: str, height: int) -> int:
    status, _, body = get(address, f"{LATEST}?h={height}&raw={height % 2}")
    assert status == 200, body[:200]
    assert image(body).shape[0] == min(height, HEIGHT)
    return len(body)


def test_latest_jpg_when_hundreds_of_heights_are_asked_keeps_rss_and_live_viewers_going(
        daemon: tuple[subprocess.Popen[bytes], str]) -> None:
    proc, address = daemon
    with ThreadPoolExecutor(SWEEPERS) as warm:
        assert all(warm.map(lambda h: ask(address, h), WARM))
    viewer = Viewer(address)
    try:
        wait_until(lambda: len(viewer.parts) >= 2, timeout=30, what="the viewer's first parts")
        before = rss(proc.pid)
        started = time.monotonic()
        with ThreadPoolExecutor(SWEEPERS) as sweep:
            sent = sum(sweep.map(lambda h: ask(address, h), HEIGHTS))
        ended = time.monotonic()
        # Freed pages go back to the system within the allocator's decay (jemalloc: 1 s).
        after = wait_until(lambda: (now := rss(proc.pid)) < before + GROWTH_LIMIT and now,
                           timeout=10, what=f"RSS back within {GROWTH_LIMIT >> 20} MiB of "
                           f"{before / 2**20:.0f} MiB after {len(HEIGHTS)} heights",
                           details=lambda: f"RSS {rss(proc.pid) / 2**20:.0f} MiB, "
                           f"{sent / 2**20:.0f} MiB of JPEG sent")
        wait_until(lambda: viewer.parts[-1][0] > ended, timeout=30,
                   what="a part after the sweep")
    finally:
        viewer.close()
    # The viewer went on receiving new frames through the sweep: no part was late by more
    # than a few of the stream's frame periods (0.2 s), whatever the sweep asked meanwhile.
    during = [t for t, _ in viewer.parts if started <= t <= ended]
    times = [started, *during, ended]
    longest = max(b - a for a, b in itertools.pairwise(times))
    seqs = {seq for t, seq in viewer.parts if started <= t <= ended}
    print(f"sweep {ended - started:.1f} s, RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB, "
          f"viewer: {len(during)} parts of {len(seqs)} frames, longest gap {longest:.2f} s")
    assert longest < 2.0, f"the viewer waited {longest:.1f} s for a part during the sweep"
    assert len(seqs) >= min(3, int((ended - started) / 0.2) // 2), seqs
