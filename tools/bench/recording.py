"""`python -m tools.bench recording`: what keeping the evidence costs, and what it delivers, in
one run, on a 1080p H.264 stream encoded here by PyAV's own libx264 (~4 Mbit/s, a keyframe
every second, 30 fps; textured moving content so the bitrate is a camera's).

- **Recording CPU**: the stream's packets (demuxed once, beforehand) fed through the real
  `ClipRecorder` (the pre-capture ring, and a clip of ~10 s every minute of video written
  to disk by `ClipWriter`), as process CPU time per second of video: the share of one core
  a camera's recording costs, beside what decoding the same stream costs.
- **One decode**: the demuxing reader's real path (`DemuxSource.read`: demux, packets to a
  recorder, decode, BGR for the models) against `ffmpeg -i FILE -f null -` (Debian's CLI,
  decoding the same file with its default threads, and PyAV's decoder runs FFmpeg's own
  automatic thread count too) and against OpenCV's `VideoCapture.read` (today's reader),
  as CPU time per frame (getrusage: every thread of the process or of the child).
- **Cameras a core**: 1, 2, ... copies of the stream read at their own rate (30 fps, a file
  played like a live camera) by demuxing readers whose packets go to clip recorders, each
  frame through the stream's change gate, until frames drop (fewer than 95% delivered);
  the model's own time apart (no model runs). Tracking is not in it (it needs detections).
- **Pre-capture delivered**: events at random times on the same stream, each starting a clip
  through the recorder; how far before the event each clip starts, against the asked
  pre-capture, beside what starting at the next keyframe (DeepStream's Smart Record) and at
  a 10 s segment boundary (Frigate's pre-roll) would give on the same keyframes.

Ratios are the point: absolute times on a shared machine move with its load.
"""

from __future__ import annotations

import random
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from edged.recording.clips import ClipRecorder
from edged.recording.config import ClipsConfig
from edged.recording.store import ClipStore
from edged.sources.base import Backoff, FrameQueue
from edged.sources.demux import DemuxSource, stream_format
from edged.sources.packets import Packet, WallClock

FPS = 30
PRE_S = 5.0


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def make_stream(path: Path, seconds: int, size: tuple[int, int] = (1920, 1080)) -> Path:
    """A camera-like H.264 file: moving textured content, ~4 Mbit/s, a keyframe a second."""
    import av

    width, height = size
    rng = np.random.default_rng(7)
    texture = rng.integers(0, 255, (height, width * 2, 3), np.uint8)
    texture = (texture // 32 * 32).astype(np.uint8)  # blocks, not noise: compressible
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        stream.bit_rate = 4_000_000
        stream.codec_context.gop_size = FPS
        stream.options = {"preset": "ultrafast", "x264-params":
                          f"keyint={FPS}:min-keyint={FPS}:scenecut=0"}
        for i in range(seconds * FPS):
            x = (i * 8) % width
            frame = np.ascontiguousarray(texture[:, x:x + width])
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="bgr24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def read_packets(path: Path) -> list[Packet]:
    """The file's packets with the times a live camera would give them (30 fps from t=0)."""
    import av

    with av.open(str(path)) as container:
        video = container.streams.video[0]
        fmt = stream_format(video)
        clock = WallClock(0, 1_000_000.0, float(video.time_base))
        return [Packet(bytes(p), p.pts, p.dts, int(p.duration or 0), bool(p.is_keyframe),
                       clock, fmt) for p in container.demux(video) if p.size and
                p.pts is not None]


def played_on(packets: list[Packet], repeats: int) -> list[Packet]:
    """The same packets played `repeats` times one after the other: a longer stream."""
    span = packets[-1].wall - packets[0].wall + 1 / FPS
    out = []
    for r in range(repeats):
        clock = WallClock(0, packets[0].clock.wall0 + r * span, packets[0].clock.tb)
        out += [Packet(p.data, p.pts, p.dts, p.duration, p.keyframe, clock, p.fmt)
                for p in packets]
    return out


def recording_cpu(packets: list[Packet], workdir: Path, repeats: int) -> dict[str, Any]:
    """The recorder's CPU per second of video: the ring always, a clip of ~10 s a minute."""
    store = ClipStore(workdir / "rec", 10**12, 0)
    recorder = ClipRecorder("cam", ClipsConfig(enabled=True, pre_capture_s=PRE_S,
                                               post_capture_s=5.0), store)
    span = packets[-1].wall - packets[0].wall + 1 / FPS
    video_s = span * repeats
    shifted = played_on(packets, repeats)
    event_every = 60.0
    next_event = shifted[0].wall + PRE_S + 2.0
    start = _cpu_self()
    for i, packet in enumerate(shifted):
        recorder.packet(packet)
        if packet.wall >= next_event:
            recorder.object_started(f"o{i}", packet.wall)
            recorder.object_ended(f"o{i}", packet.wall)  # a 10 s clip: pre + post
            next_event += event_every
    recorder.close()
    cpu = _cpu_self() - start
    clips = store.list()
    return {"video_s": round(video_s, 1), "cpu_s": round(cpu, 4),
            "core_share_pct": round(100 * cpu / video_s, 3), "clips": len(clips),
            "clip_bytes": sum(c.size for c in clips),
            "bitrate_mbps": round(sum(p.size for p in packets) * 8 / span / 1e6, 2)}


def reader_cpu(path: Path, frames: int, rounds: int = 3) -> dict[str, Any]:
    """CPU per frame: the demuxing reader's real path, the decoder alone, ffmpeg -f null,
    OpenCV; `rounds` rounds one after another, each measure's median (the machine is shared:
    interleaving keeps the ratios within a round's noise)."""
    runs: dict[str, list[float]] = {"pyav_reader": [], "pyav_decode_only": [],
                                    "ffmpeg_null": [], "opencv": []}
    walls: dict[str, list[float]] = {k: [] for k in runs}
    counts: dict[str, int] = {}
    for _ in range(rounds):
        for name, measure in (("pyav_reader", _reader), ("pyav_decode_only", _decode_only),
                              ("ffmpeg_null", _ffmpeg_null), ("opencv", _opencv)):
            cpu, wall, count = measure(path, frames)
            runs[name].append(cpu / max(count, 1))
            walls[name].append(wall)
            counts[name] = count
    per = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
    return {"frames": counts["pyav_reader"], "packets_recorded": _PACKETS.get("packets", 0),
            "opencv_frames": counts["opencv"], "rounds": rounds,
            "cpu_ms_per_frame": {k: round(v * 1000, 3) for k, v in per.items()},
            "cpu_ms_per_frame_rounds": {k: [round(x * 1000, 3) for x in v]
                                        for k, v in runs.items()},
            "wall_s": {k: round(sorted(v)[len(v) // 2], 2) for k, v in walls.items()},
            "pyav_vs_ffmpeg": round(per["pyav_reader"] / per["ffmpeg_null"], 3),
            "pyav_vs_opencv": round(per["pyav_reader"] / per["opencv"], 3)}


class _CountingSink:
    def __init__(self) -> None:
        self.packets = 0

    def packet(self, packet: Packet) -> None:
        self.packets += 1

    def discontinuity(self, reason: str) -> None:
        pass


_PACKETS: dict[str, int] = {}


def _reader(path: Path, frames: int) -> tuple[float, float, int]:
    sink = _CountingSink()
    source = DemuxSource("bench", f"file://{path}", FrameQueue(2, "drop_oldest"),
                         backoff=Backoff(1, 1), sink=sink)
    source.open()
    source._frame_interval_s = 0.0  # as fast as it decodes: no playing at the file's rate
    start, wall = _cpu_self(), time.perf_counter()
    got = 0
    while source.read() is not None:
        got += 1
    cpu, wall = _cpu_self() - start, time.perf_counter() - wall
    source.close()
    _PACKETS["packets"] = sink.packets
    return cpu, wall, got


def _decode_only(path: Path, frames: int) -> tuple[float, float, int]:
    import av

    with av.open(str(path)) as container:  # the decoder alone: no packets kept, no BGR
        container.streams.video[0].thread_type = "AUTO"
        start, wall = _cpu_self(), time.perf_counter()
        decoded = sum(1 for _ in container.decode(video=0))
        return _cpu_self() - start, time.perf_counter() - wall, decoded


def _ffmpeg_null(path: Path, frames: int) -> tuple[float, float, int]:
    start, wall = _cpu_children(), time.perf_counter()
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-i", str(path), "-f", "null", "-"],
                   check=True, timeout=600)
    return _cpu_children() - start, time.perf_counter() - wall, frames


def _opencv(path: Path, frames: int) -> tuple[float, float, int]:
    import cv2

    capture = cv2.VideoCapture(str(path), cv2.CAP_FFMPEG)
    start, wall = _cpu_self(), time.perf_counter()
    got = 0
    while capture.read()[0]:
        got += 1
    cpu, wall = _cpu_self() - start, time.perf_counter() - wall
    capture.release()
    return cpu, wall, got


def pre_capture(packets: list[Packet], workdir: Path, events: int) -> dict[str, Any]:
    """Events at random times: how far before each the recorder's clip starts, beside the
    next keyframe (Smart Record) and the 10 s segment boundary (Frigate)."""
    rng = random.Random(51)
    packets = played_on(packets, max(1, int(40 / len(packets) * FPS) + 1))  # >= 40 s
    keyframes = [p.wall for p in packets if p.keyframe]
    first, last = packets[0].wall, packets[-1].wall
    got, next_key, segment = [], [], []
    for n in range(events):
        store = ClipStore(workdir / f"pre{n}", 10**12, 0)
        recorder = ClipRecorder("cam", ClipsConfig(enabled=True, pre_capture_s=PRE_S,
                                                   post_capture_s=0.0), store)
        event = rng.uniform(first + PRE_S + 1.5, last - 1.0)
        for packet in packets:
            recorder.packet(packet)
            if packet.wall >= event:
                recorder.object_started("o", event)
                recorder.object_ended("o", event)
                break
        recorder.close()
        [clip] = store.list()
        got.append(event - clip.start_time)
        asked = event - PRE_S
        next_key.append(event - min(k for k in keyframes if k >= asked))
        segment.append(event - (first + (asked - first) // 10.0 * 10.0))
    def spread(values: list[float]) -> dict[str, float]:
        return {"min": round(min(values), 3), "p50": round(statistics.median(values), 3),
                "max": round(max(values), 3),
                "short": sum(v < PRE_S - 1e-6 for v in values)}
    return {"asked_s": PRE_S, "events": events, "edged": spread(got),
            "next_keyframe": spread(next_key), "segment_10s": spread(segment)}


OBJECTS = 5  # the synthetic detections each camera's tracker follows


def detections(n: int) -> tuple[Any, Any, list[str]]:
    """Frame n's detections: OBJECTS boxes crossing a 1080p picture at different speeds and
    heights (what a detector would give on a busy street; synthetic, so that no model's
    cost is in what measures the reader)."""
    import numpy as np

    boxes = np.empty((OBJECTS, 4), np.float32)
    for k in range(OBJECTS):
        x = (n * (4 + 3 * k) + 300 * k) % 1800
        y = 100 + 180 * k
        boxes[k] = (x, y, x + 120, y + 160)
    return boxes, np.full(OBJECTS, 0.9, np.float32), ["person", "car"] * 2 + ["person"]


def _consume(source: DemuxSource, gate: Any, tracker: Any, delivered: list[int],
             index: int, stop: Any) -> None:
    """One stream's loop without the model: each frame through its change gate, and the
    tracker given that frame's (synthetic) detections."""
    n = 0
    while not stop.is_set():
        frame = source.queue.get(0.2)
        if frame is not None:
            gate.admit(frame.data, frame.captured_mono)
            boxes, scores, labels = detections(n)
            tracker.update(frame.captured, boxes, scores, labels)
            n += 1
            delivered[index] += 1


def cameras(path: Path, workdir: Path, *, seconds: float, most: int) -> list[dict[str, Any]]:
    """n cameras at once, n = 1, 2, ...: the share of frames each delivered, until < 95%."""
    import threading

    from edged.events.config import TrackConfig
    from edged.events.track import Tracker
    from edged.streams.config import GateConfig
    from edged.streams.gate import ChangeGate

    rows = []
    for n in range(1, most + 1):
        sources, threads = [], []
        delivered = [0] * n
        stop = threading.Event()
        for i in range(n):
            store = ClipStore(workdir / f"cams{n}-{i}", 10**12, 0)
            recorder = ClipRecorder(f"c{i}", ClipsConfig(enabled=True), store)
            source = DemuxSource(f"c{i}", f"file://{path}", FrameQueue(2, "drop_oldest"),
                                 backoff=Backoff(1, 1), sink=recorder, loop=True)
            sources.append(source)
            threads.append(threading.Thread(
                target=_consume, args=(source, ChangeGate(GateConfig(enabled=True)),
                                       Tracker(TrackConfig(), stream=f"c{i}"),
                                       delivered, i, stop), daemon=True))
        for source in sources:
            source.start()
        for thread in threads:
            thread.start()
        # (a warm-up second: the readers open and reach their pace)
        stop.wait(1.0)
        first = list(delivered)
        cpu, wall = _cpu_self(), time.perf_counter()
        stop.wait(seconds)
        got = [d - f for d, f in zip(delivered, first, strict=True)]
        cpu, wall = _cpu_self() - cpu, time.perf_counter() - wall
        stop.set()
        for source in sources:
            source.stop(10.0)
        for thread in threads:
            thread.join(5.0)
        share = sum(got) / (n * FPS * wall)
        rows.append({"cameras": n, "delivered_pct": round(100 * share, 1),
                     "fps_each": round(sum(got) / n / wall, 1),
                     "cpu_cores": round(cpu / wall, 2)})
        if share < 0.95:
            break
    return rows


def run_bench(workdir: Path, *, quick: bool = False) -> dict[str, Any]:
    seconds = 4 if quick else 12
    video = make_stream(workdir / "cam.mp4", seconds)
    packets = read_packets(video)
    return {"stream": {"size": "1920x1080", "fps": FPS, "seconds": seconds,
                       "keyframe_every_s": 1.0},
            "recording": recording_cpu(packets, workdir, repeats=5 if quick else 10),
            "reader": reader_cpu(video, seconds * FPS, rounds=1 if quick else 3),
            "pre_capture": pre_capture(packets, workdir, 10 if quick else 40),
            "cameras": cameras(video, workdir, seconds=2.0 if quick else 6.0,
                               most=2 if quick else 16)}


def format_table(results: dict[str, Any]) -> str:
    rec, reader, pre = results["recording"], results["reader"], results["pre_capture"]
    cpu = reader["cpu_ms_per_frame"]
    decode_share = cpu["pyav_reader"] * FPS / 10  # ms per frame x 30 / 1000 x 100
    lines = [
        f"recording, 1080p30 H.264 at {rec['bitrate_mbps']} Mbit/s (ring + a 10 s clip a "
        f"minute, {rec['video_s']} s of video, {rec['clips']} clips)",
        f"  CPU: {rec['core_share_pct']}% of a core   (decoding the same stream: "
        f"{decode_share:.1f}% of a core)",
        "one decode, CPU ms per 1080p frame (getrusage, all threads)",
        f"  {'pyav reader (packets + BGR frames)':<38}{cpu['pyav_reader']:>9}",
        f"  {'pyav decode alone (no BGR, no packets)':<38}{cpu['pyav_decode_only']:>9}",
        f"  {'ffmpeg -i FILE -f null -':<38}{cpu['ffmpeg_null']:>9}   "
        f"reader / ffmpeg = {reader['pyav_vs_ffmpeg']}x",
        f"  {'opencv VideoCapture.read':<38}{cpu['opencv']:>9}   "
        f"reader / opencv = {reader['pyav_vs_opencv']}x",
        f"pre-capture delivered (asked {pre['asked_s']} s, {pre['events']} events at random "
        "times, keyframe every 1 s): seconds before the event",
        f"  {'':<30}{'min':>8}{'p50':>8}{'max':>8}{'short':>7}",
    ]
    for key, name in (("edged", "edged (ring from a keyframe)"),
                      ("next_keyframe", "next keyframe (Smart Record)"),
                      ("segment_10s", "10 s segments (Frigate)")):
        row = pre[key]
        lines.append(f"  {name:<30}{row['min']:>8}{row['p50']:>8}{row['max']:>8}"
                     f"{row['short']:>7}")
    lines.append("cameras at once (1080p30 each: read, packets to a recorder, decode, BGR, "
                 f"change gate, tracker on {OBJECTS} synthetic moving objects; no model), "
                 "until frames drop")
    lines.append(f"  {'cameras':>8}{'delivered':>11}{'fps each':>10}{'CPU cores':>11}")
    for row in results["cameras"]:
        lines.append(f"  {row['cameras']:>8}{str(row['delivered_pct']) + '%':>11}"
                     f"{row['fps_each']:>10}{row['cpu_cores']:>11}")
    return "\n".join(lines)
