"""The events part of `python -m tools.bench streams`: what tracking saves on the broker, and
what it costs per frame.

(a) MQTT messages per second from 4 detect streams (grid_det, 10 fps each, `edged run` as a
    subprocess, a real mosquitto, the bench process subscribed to everything under the
    device's prefix but its stats and status): per-frame results (`publish: {frames: true,
    events: false}`, what a detect stream published before events) against events (the
    default: events, counts, zone and line counts, snapshots). Two scenes: the demo's
    crossing squares (a new object every 1.6 s per stream, each crossing a line and a zone:
    a busy door) and one square parked in view (a car in a driveway). One message per frame
    whatever the scene for results, so that rate is measured on the first scene only.
(b) The events stage per frame (`EventsStage.frame`: the engine plus the publisher's JSON,
    snapshots off) at 5 and 50 objects wandering through 2 zones and over 2 lines
    (tools/bench/scenes.py), CPU time and messages per frame.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from edged.events.config import SnapshotsConfig
from edged.events.publish import EventPublisher
from edged.processing.detections import Detections
from edged.streams.config import StreamConfig
from edged.streams.events_stage import EventsStage
from tools.assets.demo import COLORS_BGR, DEMO_PASSES, write_crossing_video
from tools.bench.api import edged_config, run_edged
from tools.bench.assets import tiny_model_tools
from tools.bench.events import WARMUP, engine_settings
from tools.bench.scenes import walkers

STREAMS, FPS = 4, 10.0
SIDE = 256  # grid_det's 4x4 cells of 64 px
EVENTS_KEYS = ("zones: [{name: right, polygon: [[128, 0], [256, 0], [256, 256], [128, 256]]}], "
               "lines: [{name: middle, points: [[128, 256], [128, 0]]}]")
# The change gate off in both modes (it is on by default for the events mode's streams): this
# measures what events save on the broker, frame for frame as before; `tools.bench gate`
# measures what the gate saves.
MODES = {"results": "publish: {frames: true, events: false}",
         "events": f"{EVENTS_KEYS}, gate: {{enabled: false}}"}


class MessageCounter:
    """A real subscriber to everything under a prefix: messages and bytes by kind, and the
    daemon's latest stats message."""

    def __init__(self, port: int, prefix: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.prefix = prefix
        self.arrived: queue.Queue[tuple[str, int]] = queue.Queue()
        self.stats: dict[str, Any] = {}
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-ev-{os.getpid()}")
        subscribed: queue.Queue[bool] = queue.Queue()
        self.client.on_message = lambda c, u, m: self._message(m.topic, bytes(m.payload))
        self.client.on_subscribe = lambda *a: subscribed.put(True)
        self.client.on_connect = lambda c, *a: c.subscribe(f"{prefix}/#", 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        subscribed.get(timeout=10)

    def _message(self, topic: str, payload: bytes) -> None:
        suffix = topic[len(self.prefix) + 1:]
        if suffix == "stats":
            self.stats = json.loads(payload)
        elif suffix != "status" and not suffix.startswith("models/"):
            self.arrived.put((kind_of(suffix), len(payload)))

    def window(self, seconds: float) -> tuple[Counter[str], int]:
        """Drop what came before, then count messages by kind (and bytes) for `seconds`."""
        while not self.arrived.empty():
            self.arrived.get_nowait()
        kinds: Counter[str] = Counter()
        size, end = 0, time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                kind, n = self.arrived.get(timeout=left)
            except queue.Empty:
                break
            kinds[kind] += 1
            size += n
        return kinds, size

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def kind_of(suffix: str) -> str:
    if suffix == "events":
        return "events"
    parts = suffix.split("/")
    if parts[-1] in ("results", "snapshot"):
        return parts[-1]
    return {"zones": "zone counts", "lines": "line counts"}.get(parts[2], "counts") \
        if len(parts) > 2 else "counts"


def write_parked_video(path: Path, seconds: float = 10.0) -> Path:
    """A red square standing on one cell of grid_det's grid, all the time."""
    import cv2

    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), FPS, (SIDE, SIDE))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    frame = np.zeros((SIDE, SIDE, 3), np.uint8)
    frame[64:128, 64:128] = COLORS_BGR["red"]
    try:
        for _ in range(round(FPS * seconds)):
            writer.write(frame)
    finally:
        writer.release()
    return path


def rate_case(workdir: Path, port: int, video: Path, mode: str, scene: str,
              seconds: float, warm_s: float) -> dict[str, Any]:
    prefix = f"bench{os.getpid()}/ev-{mode}-{scene}"
    streams = ", ".join(f"{{name: cam{i}, source: 'file://{video}', model: grid_det, "
                        f"loop: true, backpressure: drop_oldest, {MODES[mode]}}}"
                        for i in range(STREAMS))
    config = edged_config(workdir, preload=["grid_det"], streams=f"[{streams}]",
                          mqtt=f"host: 127.0.0.1, port: {port}, prefix: {prefix}, "
                               "stats_interval_s: 1, discovery: {enabled: false}")
    counter = MessageCounter(port, prefix)
    try:
        with run_edged(workdir, config):
            counter.window(warm_s)
            kinds, size = counter.window(seconds)
            stats = counter.stats
    finally:
        counter.close()
    processed = sum(row.get("fps_processed", 0.0) for row in stats.get("streams", {}).values())
    events_ms = [row["events_ms"]["p50"] for row in stats.get("streams", {}).values()
                 if "events_ms" in row]
    total = sum(kinds.values())
    return {"mode": mode, "scene": scene, "streams": STREAMS, "messages_per_s": total / seconds,
            "bytes_per_s": size / seconds, "by_kind_per_s": {k: v / seconds for k, v in
                                                             sorted(kinds.items())},
            "frames_per_s": processed,
            "events_ms_p50": max(events_ms) if events_ms else None}


def stage_row(n: int, frames: int) -> dict[str, Any]:
    """EventsStage.frame over n wandering objects: CPU per frame, messages per frame."""
    scene = walkers(np.random.default_rng(n), n, frames=frames)
    shape = engine_settings(scene.width, scene.height, snapshots=False)
    cfg = StreamConfig(name="bench", source="file:///bench.avi", model="det",
                       zones=shape.zones, lines=shape.lines,
                       snapshots=SnapshotsConfig(enabled=False))
    sent = [0]

    def publish(kind: str, suffix: str, payload: bytes, *, retain: bool = False) -> None:
        sent[0] += 1

    detections = [Detections.from_rows(d for _i, d in frame) for frame in scene.frames]
    warm = EventsStage(cfg, EventPublisher("bench", publish, None))
    for f, dets in enumerate(detections[:WARMUP]):
        warm.frame(1_700_000_000 + f / scene.fps, dets, None)
    stage = EventsStage(cfg, EventPublisher("bench", publish, None))
    sent[0] = 0
    cpu_start = time.process_time()
    for f, dets in enumerate(detections):
        stage.frame(1_700_000_000 + f / scene.fps, dets, None)
    cpu = time.process_time() - cpu_start
    times = stage.read_stats().events_ms
    return {"objects": n, "frames": frames, "cpu_ms_per_frame": cpu / frames * 1e3,
            "messages_per_frame": sent[0] / frames,
            "p50_ms": times.p50 if times is not None else None}


def run_events(workdir: Path, port: int, *, quick: bool) -> dict[str, Any]:
    tiny_model_tools().write_repository(workdir / "models", names=["grid_det"])
    crossing = write_crossing_video(workdir / "crossing.avi", DEMO_PASSES, fps=FPS,
                                    gap_frames=12)
    parked = write_parked_video(workdir / "parked.avi")
    seconds, warm_s = (2.0, 1.0) if quick else (20.0, 3.0)
    rates = [rate_case(workdir, port, crossing, "results", "crossing", seconds, warm_s),
             rate_case(workdir, port, crossing, "events", "crossing", seconds, warm_s),
             rate_case(workdir, port, parked, "events", "parked", seconds, warm_s)]
    frames = 150 if quick else 1200
    return {"rates": rates, "window_s": seconds,
            "stage": [stage_row(n, frames) for n in (5, 50)]}


def format_events(r: dict[str, Any]) -> str:
    lines = [f"\nevents: MQTT messages from {STREAMS} detect streams (grid_det, {FPS:g} fps "
             f"each) over {r['window_s']:g} s",
             "| published | scene | frames/s | messages/s | bytes/s | by kind (per s) |",
             "|---|---|---|---|---|---|"]
    for case in r["rates"]:
        kinds = ", ".join(f"{k} {v:.1f}" for k, v in case["by_kind_per_s"].items())
        lines.append(f"| {case['mode']} | {case['scene']} | {case['frames_per_s']:.1f} | "
                     f"{case['messages_per_s']:.1f} | {case['bytes_per_s']:.0f} | {kinds} |")
    lines += ["\nevents stage per frame (engine + JSON, 2 zones, 2 lines, snapshots off)",
              "| objects | CPU ms/frame | p50 ms | messages/frame |", "|---|---|---|---|"]
    for row in r["stage"]:
        lines.append(f"| {row['objects']} | {row['cpu_ms_per_frame']:.3f} | "
                     f"{row['p50_ms']:.3f} | {row['messages_per_frame']:.2f} |")
    return "\n".join(lines)
