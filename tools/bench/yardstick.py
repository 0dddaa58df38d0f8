"""The first table of `edged bench api`: edged under Triton's perf_analyzer (HTTP over loopback
TCP) against direct `session.run` on one session with edged's ORT options (N threads for
concurrency N), in the same run; then the callers perf_analyzer cannot reach, with edged's lean
clients: the Unix socket with binary tensors (`tools.bench.load`, N connections) and system
shared memory (`EdgedClient`, one caller). Every edged row carries the server's CPU per request
(its process CPU over the requests it counted), the figure that caps a Jetson's throughput
however fast the engine is."""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import HEADER_LENGTH, RequestedOutput, ShmRef, encode_request
from edged.ops.client import EdgedClient, SharedRegion
from tools.bench import perfanalyzer
from tools.bench.load import Target, closed_loop, http_request

SHAPES = {"tiny_cls": (1, 3, 8, 8), "cls": (1, 3, 48, 192)}


def cached(model: str) -> str:
    """The same model served with `response_cache: true` (api.build_repository)."""
    return f"{model}_cached"


LABELS = {"tiny_cls": "tiny_cls 1x3x8x8", "cls": "PP-OCR cls 1x3x48x192"}
CONCURRENCY = (1, 8)


def _latency(seconds: list[float], count: int, elapsed: float) -> dict[str, float]:
    us = sorted(s * 1e6 for s in seconds) or [0.0]
    return {"infer_per_s": count / elapsed, "p50_us": statistics.median(us),
            "p99_us": us[min(len(us) - 1, int(len(us) * 0.99))]}


def direct_rate(session: Any, feed: dict[str, np.ndarray], concurrency: int,
                seconds: float) -> dict[str, float]:
    """`concurrency` threads calling `session.run` on the one session, back to back."""
    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    start = threading.Barrier(concurrency + 1)
    stop_at = [0.0]

    def caller(i: int) -> None:
        start.wait()
        mine = latencies[i]
        while (began := time.perf_counter()) < stop_at[0]:
            session.run(None, feed)
            mine.append(time.perf_counter() - began)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for _ in range(20):  # warm
        session.run(None, feed)
    stop_at[0] = time.perf_counter() + seconds
    began = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    flat = [s for part in latencies for s in part]
    return _latency(flat, len(flat), elapsed)


def binary_request(model: str, x: np.ndarray) -> bytes:
    """What perf_analyzer sends: the tensor as binary data, outputs asked for as binary."""
    parts, json_length = encode_request({"x": x}, [], binary=True)
    return http_request(f"/v2/models/{model}/infer", b"".join(parts),
                        {"Content-Type": "application/octet-stream",
                         HEADER_LENGTH: str(json_length)})


class Served:
    """A server perf_analyzer runs against: its pid (CPU) and TCP url (statistics)."""

    def __init__(self, pid: int, port: int) -> None:
        self.pid, self.url = pid, f"127.0.0.1:{port}"

    def meter(self, model: str) -> perfanalyzer.CpuMeter:
        return perfanalyzer.CpuMeter(self.pid, f"http://{self.url}", model)


class Edged(Served):
    """The daemon under test, with its Unix socket too."""

    def __init__(self, pid: int, port: int, sock: Path) -> None:
        super().__init__(pid, port)
        self.sock = sock


def measure(edged: Edged, sessions: dict[str, Any], workdir: Path, *,
            seconds: float, floor: Served | None = None) -> dict[str, Any]:
    """Every row; with `floor` (tools.bench.floor, serving the same models), perf_analyzer
    runs against it too, right after edged: what any Python server here pays."""
    pa = perfanalyzer.find()
    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(0)
    for model, shape in SHAPES.items():
        x = rng.random(shape, dtype=np.float32)
        session = sessions[model]
        feed = {session.get_inputs()[0].name: x}
        request = binary_request(model, x)
        for concurrency in CONCURRENCY:
            row: dict[str, Any] = {"model": model, "concurrency": concurrency}
            if isinstance(pa, str):
                row["edged_tcp"] = {"skipped": pa}
            else:
                row["edged_tcp"] = _perf_analyzer(pa, edged, model, concurrency, seconds,
                                                  workdir)
                if floor is not None:
                    row["floor_tcp"] = _perf_analyzer(pa, floor, model, concurrency, seconds,
                                                      workdir)
                # perf_analyzer sends one random input over and over: after the first, every
                # request is answered from the response cache.
                row["cached_tcp"] = {**_perf_analyzer(pa, edged, cached(model), concurrency,
                                                      seconds, workdir),
                                     **cache_counts(edged, cached(model))}
            row["direct"] = direct_rate(session, feed, concurrency, seconds)
            with edged.meter(model) as meter:
                client_cpu = time.process_time()  # the load generator runs in this process
                done = closed_loop(Target(unix=str(edged.sock)), request,
                                   concurrency=concurrency, seconds=seconds)
                client_cpu = time.process_time() - client_cpu
            row["unix_binary"] = {**_latency(done.latencies_s, done.requests, done.seconds),
                                  "cpu_us": meter.us_per_request,
                                  "client_cpu_us": client_cpu / max(meter.requests, 1) * 1e6}
            rows.append(row)
        rows.append({"model": model, "concurrency": 1,
                     "shm": shm_rate(edged, model, session, x, seconds)})
    return {"rows": rows, "perf_analyzer": None if isinstance(pa, str) else str(pa.binary)}


def _perf_analyzer(pa: perfanalyzer.PerfAnalyzer, server: Served, model: str, concurrency: int,
                   seconds: float, workdir: Path) -> dict[str, float]:
    with server.meter(model) as meter:
        got = perfanalyzer.run(pa, model, server.url, concurrency,
                               window_ms=int(seconds * 1000), workdir=workdir)
    return {**got.__dict__, "cpu_us": meter.us_per_request,
            "client_cpu_us": got.client_cpu_s / max(meter.requests, 1) * 1e6}


def cache_counts(server: Served, model: str) -> dict[str, int]:
    """The response cache's hits and misses of `model` so far (Triton's statistics)."""
    with urllib.request.urlopen(f"http://{server.url}/v2/models/{model}/stats",
                                timeout=10) as resp:
        stats = json.load(resp)["model_stats"]
    return {kind: sum(s["inference_stats"][f"cache_{kind}"]["count"] for s in stats)
            for kind in ("hit", "miss")}


def shm_rate(edged: Edged, model: str, session: Any, x: np.ndarray,
             seconds: float) -> dict[str, float]:
    """One `EdgedClient` caller with its input and outputs in a registered region."""
    outputs = session.run(None, {session.get_inputs()[0].name: x})
    names = [o.name for o in session.get_outputs()]
    size = x.nbytes + sum(o.nbytes for o in outputs)
    key = f"edged-yardstick-{model}"
    with EdgedClient(edged.sock) as client, SharedRegion(key, size) as region:
        client.register_shm(key, key, size)
        shm_in = region.tensor(key, x)
        wanted, offset = [], x.nbytes
        for name, out in zip(names, outputs, strict=True):
            wanted.append(RequestedOutput(name, shm=ShmRef(key, offset, out.nbytes)))
            offset += out.nbytes

        def call() -> object:
            return client.infer(model, {session.get_inputs()[0].name: shm_in}, outputs=wanted)

        latencies = _timed(call, 0.3)
        with edged.meter(model) as meter:
            latencies = _timed(call, seconds)
        client.unregister_shm(key)
    return {**_latency(latencies, len(latencies), sum(latencies)),
            "cpu_us": meter.us_per_request}


def _timed(call: Callable[[], object], seconds: float) -> list[float]:
    times: list[float] = []
    stop = time.perf_counter() + seconds
    while (began := time.perf_counter()) < stop:
        call()
        times.append(time.perf_counter() - began)
    return times


def format_rows(r: dict[str, Any]) -> list[str]:
    lines = ["| model | conc | caller | infer/s | direct ORT infer/s | ratio | p50 µs "
             "(direct) | p99 µs (direct) | server CPU µs/request | client CPU µs/request |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        label, c = LABELS[row["model"]], row["concurrency"]
        direct = row.get("direct")
        for key, caller in (("edged_tcp", "perf_analyzer, TCP"),
                            ("floor_tcp", "perf_analyzer, TCP: the floor, a bare Python server"),
                            ("cached_tcp", "perf_analyzer, TCP: response cache on, one input "
                                           "repeated"),
                            ("unix_binary", "Unix socket, binary"), ("shm", "shared memory")):
            got = row.get(key)
            if got is None:
                continue
            if "skipped" in got:
                lines.append(f"| {label} | {c} | {caller} | skipped: {got['skipped']} |"
                             " | | | | | |")
                continue
            client = f"{got['client_cpu_us']:.0f}" if "client_cpu_us" in got else ""
            if "hit" in got:
                caller += f" ({got['hit']} hits, {got['miss']} misses)"
            if direct is None:
                lines.append(f"| {label} | {c} | {caller} | {got['infer_per_s']:.0f} | | | "
                             f"{got['p50_us']:.0f} | {got['p99_us']:.0f} | "
                             f"{got['cpu_us']:.0f} | |")
                continue
            lines.append(f"| {label} | {c} | {caller} | {got['infer_per_s']:.0f} | "
                         f"{direct['infer_per_s']:.0f} | "
                         f"{got['infer_per_s'] / direct['infer_per_s']:.2f} | "
                         f"{got['p50_us']:.0f} ({direct['p50_us']:.0f}) | "
                         f"{got['p99_us']:.0f} ({direct['p99_us']:.0f}) | "
                         f"{got['cpu_us']:.0f} | {client} |")
    return lines
