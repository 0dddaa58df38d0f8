"""The GPU suite's cases that run `edged run` as a subprocess (tools/bench/gpu.py): edged over
its socket against direct `session.run` on the same provider, and a camera stream's CPU per
frame with the model on the GPU and on the CPU."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import HEADER_LENGTH, encode_request
from edged.ops.client import EdgedClient
from tools.bench.api import run_edged
from tools.bench.broker import loopback_broker
from tools.bench.core import closed_loop as thread_loop
from tools.bench.core import rotating_rates
from tools.bench.load import Target, closed_loop, http_request
from tools.bench.perfanalyzer import process_cpu_s
from tools.bench.streams import write_text_video

CLIENTS = (1, 8)
STREAM_FPS = 30.0  # a typical camera; the model on the GPU keeps up with it easily


def config(workdir: Path, providers: tuple[str, ...], preload: list[str], *,
           mqtt: str = "enabled: false", streams: str = "[]") -> str:
    return f"""device_id: bench-gpu
models_dir: {workdir / 'models'}
cache: {{dir: {workdir / 'cache'}, budget_mb: 8192, preload: [{', '.join(preload)}]}}
backends: {{onnxruntime: {{providers: [{', '.join(providers)}]}}}}
api: {{socket: {workdir / 's.sock'}}}
mqtt: {{{mqtt}}}
streams: {streams}
logging: {{level: warning}}
"""


def edged_vs_direct(workdir: Path, providers: tuple[str, ...],
                    inputs: dict[str, tuple[str, tuple[int, ...]]], window: float,
                    rounds: int) -> list[dict[str, Any]]:
    import onnxruntime as ort

    from edged.backends import BackendOptions
    from edged.backends.onnxruntime import provider_chain, session_options
    from edged.inference.loadspec import load_spec
    from edged.model.repository import ModelRepository

    case = workdir / "served"
    case.mkdir()
    (case / "models").symlink_to(workdir / "models")
    rows: list[dict[str, Any]] = []
    with run_edged(case, config(case, providers, ["cls", "yolo"])) as (sock, _):
        repo = ModelRepository(workdir / "models")
        for name in ("cls", "yolo"):
            input_name, shape = inputs[name]
            x = np.random.default_rng(1).random((1, *shape), dtype=np.float32)
            parts, json_length = encode_request({input_name: x}, [], binary=True)
            request = http_request(f"/v2/models/{name}/infer", b"".join(parts),
                                   {"Content-Type": "application/octet-stream",
                                    HEADER_LENGTH: str(json_length)})
            # Direct: a plain ONNX Runtime session made as edged makes its own.
            options = BackendOptions(providers=providers, cache_dir=workdir / "cache")
            spec = load_spec(repo.resolve(name))
            session = ort.InferenceSession(
                str(spec.path), session_options(options),
                providers=provider_chain(spec, options, ort.get_available_providers()))
            feed = {input_name: x}
            for clients in CLIENTS:  # unmeasured: the daemon meets the batch sizes it will form
                _socket(Target(unix=str(sock)), request, clients, window, [])
            session.run(None, feed)
            for clients in CLIENTS:
                latencies: list[float] = []
                rates = rotating_rates({
                    "edged": partial(_socket, Target(unix=str(sock)), request, clients, window,
                                     latencies),
                    "direct": partial(thread_loop, partial(session.run, None, feed),
                                      clients=clients, seconds=window)}, rounds)
                rows.append({"model": name, "clients": clients, "edged_per_s": rates["edged"],
                             "direct_per_s": rates["direct"],
                             "ratio": rates["edged"] / rates["direct"],
                             "edged_p50_ms": float(np.median(latencies)) * 1e3
                             if latencies else None,
                             "runs_on": session.get_providers()[0]})
    return rows


def _socket(target: Target, request: bytes, clients: int, window: float,
            latencies: list[float]) -> tuple[int, float]:
    result = closed_loop(target, request, concurrency=clients, seconds=window, warmup_s=0.1)
    latencies.extend(result.latencies_s)
    return result.requests, result.seconds


def pipeline(workdir: Path, providers: tuple[str, ...], *, seconds: float) -> list[dict[str, Any]]:
    """One 640x480 stream at STREAM_FPS through the detector, with tracking and events to a
    private mosquitto: the daemon process's CPU per processed frame over `seconds`, with the
    model on `providers` and, for contrast, on the CPU EP."""
    video = write_text_video(workdir / "camera.avi", fps=STREAM_FPS, seconds=4)
    rows = []
    with loopback_broker(workdir / "broker") as (port, _):
        for where in dict.fromkeys((providers, ("cpu",))):
            case = workdir / f"pipeline-{where[0]}"
            case.mkdir()
            (case / "models").symlink_to(workdir / "models")
            stream = (f"[{{name: cam, source: 'file://{video}', model: yolo, loop: true, "
                      f"backpressure: drop_oldest}}]")
            text = config(case, where, ["yolo"], streams=stream,
                          mqtt=f"host: 127.0.0.1, port: {port}, prefix: bench/gpu/{where[0]}")
            with run_edged(case, text) as (sock, proc), \
                    EdgedClient(sock, timeout_s=30) as client:
                _processed(client)
                time.sleep(min(2.0, seconds))  # warm: the first frames pay the CUDA start
                frames0, cpu0, t0 = _processed(client), process_cpu_s(proc.pid), time.monotonic()
                time.sleep(seconds)
                frames = _processed(client) - frames0
                cpu = process_cpu_s(proc.pid) - cpu0
                wall = time.monotonic() - t0
                model = next(m for m in client.status()["models"] if m["name"] == "yolo")
            rows.append({"model_on": model["providers"][0] if model["providers"] else "?",
                         "frames": frames, "fps": frames / wall, "offered_fps": STREAM_FPS,
                         "cpu_ms_per_frame": cpu / max(frames, 1) * 1e3,
                         "cores_busy": cpu / wall})
    return rows


def _processed(client: EdgedClient) -> int:
    return int(client.status()["streams"]["cam"]["processed"])


def format_served(r: dict[str, Any]) -> str:
    lines = ["| model | clients | edged socket (req/s, p50 ms) | direct session.run (req/s) | "
             "edged/direct |", "|---|---|---|---|---|"]
    for x in r["edged_vs_direct"]:
        p50 = f", {x['edged_p50_ms']:.2f}" if x["edged_p50_ms"] is not None else ""
        lines.append(f"| {x['model']} ({x['runs_on']}) | {x['clients']} | "
                     f"{x['edged_per_s']:.0f}{p50} | {x['direct_per_s']:.0f} | "
                     f"{x['ratio']:.2f} |")
    lines += ["", f"| stream 640x480 @ {STREAM_FPS:.0f} fps, detector on | achieved fps | "
              "daemon CPU ms/frame | cores busy |", "|---|---|---|---|"]
    lines += [f"| {x['model_on']} | {x['fps']:.1f} | {x['cpu_ms_per_frame']:.2f} | "
              f"{x['cores_busy']:.2f} |" for x in r["pipeline"]]
    return "\n".join(lines)
