"""`edged bench streams`: 1, 2 and 4 camera streams at 640x480 through PP-OCR det, end to end.

edged runs as a real subprocess (`edged run`) reading looping video files that OpenCV wrote
(moving text on a textured background, MJPG, 640x480), publishing QoS 1 results to a real
mosquitto; the bench process is the MQTT subscriber. For each stream count it reports

- achieved fps: results that reached the subscriber per second, all streams together;
- model-bound fps: back-to-back `session.run` on a 1x3x480x640 frame with the daemon's session
  options, in the same run, in rounds interleaved with the daemon's (which is paused by
  SIGSTOP meanwhile, so the two never share the CPU);
- capture -> subscriber latency p50/p99: the subscriber's clock minus the result's capture_ts.

The videos offer 2x the model-bound rate in total, so the model is the bottleneck and the
sources drop (drop_oldest) what it cannot take; achieved / model-bound says how much of the
model's time the rest of the pipeline (decode, pre/post, MQTT) costs on this machine.

Then, on the same broker, what events save: MQTT messages per second from 4 detect streams
publishing per-frame results against publishing events, and the events stage's CPU per frame
at 5 and 50 objects (tools/bench/streams_events.py); and a stream with 0, 1 and 3 live.mjpeg
viewers: the stream thread's CPU per frame unchanged, what the viewers cost elsewhere
(tools/bench/live.py, also `python -m tools.bench live` alone).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.model.config import PreprocessConfig
from edged.model.tensor import TensorSpec
from edged.processing.pre import preprocess
from tools.bench.api import THREADS, direct_session, edged_config, run_edged
from tools.bench.assets import PPOCR_DET, ppocr_model
from tools.bench.broker import loopback_broker
from tools.bench.core import Latency
from tools.bench.live import format_table as format_live
from tools.bench.live import run_live
from tools.bench.streams_events import format_events, run_events

WIDTH, HEIGHT = 640, 480
# (streams, in_flight per stream): the default of 2 keeps the model busy while a result is
# being published; with several streams 1 is enough, and it halves the queueing latency.
CASES = ((1, 2), (2, 2), (4, 2), (4, 1))
OFFERED = 2.0  # offered frames / model-bound fps
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]  # PP-OCR's normalisation
DET_YAML = f"""max_batch_size: 1
warmup: {{shapes: {{x: [3, {HEIGHT}, {WIDTH}]}}}}
preprocess: {{resize: [{WIDTH}, {HEIGHT}], color: bgr, mean: {MEAN}, std: {STD}}}
postprocess: {{kind: raw}}
"""


def write_text_video(path: Path, fps: float, seconds: float = 8.0) -> Path:
    """Moving lines of text over a noisy gradient: something for a text detector to find,
    and JPEG frames that cost what a real camera's do to decode."""
    import cv2

    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    background = np.stack([xx * 255 // WIDTH, yy * 255 // HEIGHT,
                           np.full_like(xx, 128)], axis=-1).astype(np.int16)
    background = np.clip(background + rng.integers(-20, 20, background.shape), 0, 255)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), fps, (WIDTH, HEIGHT))
    if not writer.isOpened():
        raise RuntimeError(f"OpenCV cannot write {path}")
    try:
        for i in range(max(1, round(fps * seconds))):
            frame = background.astype(np.uint8)
            for line in range(6):
                y = 60 + line * 70
                x = (i * 3 + line * 40) % 200
                cv2.putText(frame, f"LINE {line} FRAME {i:05d}", (x, y),
                            cv2.FONT_HERSHEY_SIMPLEX, 1.2, (20, 20, 20), 3)
            writer.write(frame)
    finally:
        writer.release()
    return path


def det_input(video: Path) -> np.ndarray:
    """The first frame as the daemon's pre-processing makes it (for the direct runs)."""
    import cv2

    capture = cv2.VideoCapture(str(video))
    ok, frame = capture.read()
    capture.release()
    if not ok:
        raise RuntimeError(f"cannot read {video}")
    cfg = PreprocessConfig(resize=[WIDTH, HEIGHT], color="bgr", mean=MEAN, std=STD)
    return preprocess(frame, cfg, TensorSpec("x", np.dtype(np.float32), (-1, 3, -1, -1)))[0]


def model_bound_fps(session: Any, x: np.ndarray, seconds: float) -> float:
    feed = {session.get_inputs()[0].name: x}
    session.run(None, feed)
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        session.run(None, feed)
        runs += 1
    return runs / elapsed


class ResultCollector:
    """A real MQTT subscriber on the results of every stream: receive time and capture_ts."""

    def __init__(self, port: int, prefix: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.received: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"bench-{os.getpid()}")
        subscribed: queue.Queue[bool] = queue.Queue()
        self.client.on_message = lambda c, u, m: self.received.put(
            (time.time(), json.loads(m.payload)))
        self.client.on_subscribe = lambda *a: subscribed.put(True)
        self.client.on_connect = lambda c, *a: c.subscribe(f"{prefix}/streams/+/results", 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        subscribed.get(timeout=10)

    def window(self, seconds: float) -> list[tuple[float, dict[str, Any]]]:
        """Drop what came before, then collect for `seconds`."""
        while not self.received.empty():
            self.received.get_nowait()
        got, end = [], time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                got.append(self.received.get(timeout=left))
            except queue.Empty:
                break
        return got

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@dataclass(frozen=True)
class Timing:
    rounds: int  # per case: (daemon paused: direct runs, then daemon running: results) x rounds
    bound_s: float  # direct session.run per round
    settle_s: float  # after resuming the daemon, before its results count
    window_s: float  # results counted per round
    warm_s: float  # once per case, before the first round


def stream_case(workdir: Path, port: int, video: Path, count: int, in_flight: int,
                bound: Callable[[], float], timing: Timing) -> dict[str, Any]:
    """One daemon with `count` streams. The direct runs that give the model-bound rate are
    interleaved with the daemon's windows (the daemon is SIGSTOPped meanwhile, so the two
    never share the CPU): this VM's speed drifts by 10-20% within minutes."""
    prefix = f"bench{os.getpid()}/n{count}f{in_flight}"
    streams = ", ".join(f"{{name: cam{i}, source: 'file://{video}', model: det, loop: true, "
                        f"backpressure: drop_oldest, in_flight: {in_flight}}}"
                        for i in range(count))
    config = edged_config(workdir, preload=["det"], streams=f"[{streams}]",
                          mqtt=f"host: 127.0.0.1, port: {port}, prefix: {prefix}, "
                               "qos_results: 1, stats_interval_s: 1")
    collector = ResultCollector(port, prefix)
    got: list[tuple[float, dict[str, Any]]] = []
    bounds: list[float] = []
    try:
        with run_edged(workdir, config) as (_, proc):
            collector.window(timing.warm_s)
            for _ in range(timing.rounds):
                proc.send_signal(signal.SIGSTOP)
                try:
                    bounds.append(bound())
                finally:
                    proc.send_signal(signal.SIGCONT)
                collector.window(timing.settle_s)  # frames caught by the pause: not counted
                got += collector.window(timing.window_s)
    finally:
        collector.close()
    if not got:
        raise RuntimeError(f"no results; see {workdir / 'edged.log'}")
    seconds = timing.rounds * timing.window_s
    per_stream: dict[str, int] = {}
    for _, message in got:
        per_stream[message["stream"]] = per_stream.get(message["stream"], 0) + 1
    latency = Latency.of([received - message["capture_ts"] for received, message in got])
    model_bound = statistics.fmean(bounds)
    return {"streams": count, "in_flight": in_flight, "achieved_fps": len(got) / seconds,
            "model_bound_fps": model_bound, "model_bound_rounds": bounds,
            "achieved_vs_bound": len(got) / seconds / model_bound,
            "per_stream_fps": {k: v / seconds for k, v in sorted(per_stream.items())},
            "latency": latency.__dict__}


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    models = workdir / "models"
    (models / "det" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_DET), models / "det" / "1" / "model.onnx")
    (models / "det" / "model.yaml").write_text(DET_YAML)
    # quick: a smoke run (every case measured once, `make test`), not a figure to quote
    timing = Timing(1, 0.5, 0.5, 2.0, 1.0) if quick else Timing(5, 3.0, 1.0, 6.0, 4.0)
    probe = write_text_video(workdir / "probe.avi", fps=10, seconds=0.2)
    session = direct_session(models / "det" / "1" / "model.onnx")
    bound = partial(model_bound_fps, session, det_input(probe), timing.bound_s)
    first = max(bound() for _ in range(3))  # the offered rate must not be set on a slow moment
    cases = []
    with loopback_broker(workdir / "broker") as (port, broker):
        for count, in_flight in CASES:
            fps = round(OFFERED * first / count, 1)
            video = workdir / f"text{count}.avi"
            if not video.exists():
                write_text_video(video, fps=fps)
            case = stream_case(workdir, port, video, count, in_flight, bound, timing)
            case["offered_fps"] = fps * count
            case["model_bound"] = case["offered_fps"] >= 1.2 * case["model_bound_fps"]
            cases.append(case)
        events = run_events(workdir / "events", port, quick=quick)
    live = run_live(workdir / "live", quick=quick)
    return {"model": "PP-OCR det (ch_PP-OCRv4_det) 1x3x480x640, ORT CPU, "
                     f"{THREADS} intra-op threads",
            "broker": broker, "timing": timing.__dict__, "cases": cases, "events": events,
            "live": live}


def format_table(r: dict[str, Any]) -> str:
    lines = ["| streams | in flight per stream | offered fps | achieved fps | model-bound fps | "
             "achieved / model-bound | capture->subscriber p50 (ms) | p99 (ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for case in r["cases"]:
        lines.append(f"| {case['streams']} | {case['in_flight']} | {case['offered_fps']:.1f} | "
                     f"{case['achieved_fps']:.2f} | {case['model_bound_fps']:.2f} | "
                     f"{case['achieved_vs_bound']:.3f} | {case['latency']['p50_ms']:.0f} | "
                     f"{case['latency']['p99_ms']:.0f} |")
    for case in r["cases"]:
        if not case["model_bound"]:
            lines.append(f"\nwarning: the {case['streams']}-stream case offered less than 1.2x "
                         "the model-bound rate (the machine sped up): it was not model-bound")
    return "\n".join(lines) + "\n" + format_events(r["events"]) + "\n" + format_live(r["live"])
