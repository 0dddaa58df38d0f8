"""`python -m tools.bench soak --minutes N`: the daemon under mixed load for N minutes, with the
faults a device meets, and whether it holds.

`edged run` (a subprocess, as systemd runs it) serves PP-OCR cls on the socket and two demo
camera streams (a classifier, and a detector with tracked objects, zones and a line) that
publish to a private mosquitto. The load:

- socket clients at ~80% of the capacity measured first (closed loop, streams running): half
  of them send binary tensors, half name a shared memory region; open loop, paced, so a slow
  daemon shows as latency rather than as less load;
- each window (5 minutes; shorter runs scale it down): a burst of bad requests (malformed
  JSON, lies about dtype/shape/size, unknown models and regions, a gzip bomb, bodies cut off
  or over the limit, garbage request lines) at 20% into the window, and a signed OTA update
  of the served model (a new version, swapped in under the load) at 60%;
- once, half way through: the broker is stopped for 10 s and started again.

Every 10 s it records the daemon's RSS, open file descriptors and CPU time, and the answers
of that stretch (CPU per window and per answered request tells a daemon that got slower from
a machine that got busier). It reports failed requests outside the injected faults (any
non-200 answer or broken connection on the load; any 5xx or missing answer to a bad request
is counted separately), p50/p99 per window, RSS growth after the first window and the fd
count's slope, and checks them against issue 41's bounds (issue 20's, with RSS tightened from
2%): 0 failures, RSS growth <= 1.5% after the first window (the warm-up), fds flat, each
window's p99 within 1.5x of the first's."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
import os
import re
import shutil
import socket
import threading
import time
from array import array
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import HEADER_LENGTH, ShmTensor, encode_request
from edged.api.protocol import ShmRef as Ref
from edged.ops.client import EdgedClient, SharedRegion
from edged.ops.keys import freshness
from edged.ops.push import serve
from edged.ota.manifest import sign_document
from tools.bench.api import edged_config, run_edged
from tools.bench.assets import PPOCR_CLS, ppocr_model, tiny_model_tools
from tools.bench.broker import RestartableBroker
from tools.bench.core import CLS_YAML, Latency
from tools.bench.load import Target, closed_loop, exchange, http_request
from tools.bench.ota import StatusWatch, variant

CLIENTS = 4  # socket connections: half binary, half shared memory
LOAD_SHARE = 0.8
# The bounds a run must keep (issue 41): RSS growth after the first window, the worst
# window's p99 over the first's; and no failed request, descriptors flat.
RSS_GROWTH_PCT = 1.5
P99_OVER_FIRST = 1.5
BUCKET_S = 10.0
SHAPE = (1, 3, 48, 192)
_COUNTER = re.compile(r'^edged_stream_frames_(processed|failed)_total\{stream="([^"]+)"\} (\S+)',
                      re.MULTILINE)


class Recorder:
    """Answers of the load, bucketed by BUCKET_S, with the daemon's RSS and fds per bucket."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.latencies: dict[int, array[float]] = {}
        self.failed: dict[int, int] = {}
        self.errors: list[str] = []

    def bucket(self) -> int:
        return int((time.monotonic() - self.start) // BUCKET_S)

    def answer(self, latency_s: float | None, error: str = "") -> None:
        b = self.bucket()
        if latency_s is None:
            self.failed[b] = self.failed.get(b, 0) + 1
            if len(self.errors) < 20:
                self.errors.append(f"t={time.monotonic() - self.start:.0f}s {error[:200]}")
        else:
            self.latencies.setdefault(b, array("d")).append(latency_s)


def paced_clients(target: Target, requests: list[bytes], rate: float, recorder: Recorder,
                  stop: threading.Event) -> None:
    """One connection per request kind, each sending at rate/len(requests) per second on a
    fixed schedule (a late answer makes the next request go at once, not the load pile up)."""
    async def client(request: bytes, offset: float) -> None:
        period = len(requests) / rate
        reader, writer = await target.connect()
        due = time.monotonic() + offset
        try:
            while not stop.is_set():
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                due = max(due + period, time.monotonic() - period)
                started = time.perf_counter()
                try:
                    await exchange(reader, writer, request)
                    recorder.answer(time.perf_counter() - started)
                except Exception as exc:  # counted, then a fresh connection
                    recorder.answer(None, f"{type(exc).__name__}: {exc}")
                    writer.close()
                    reader, writer = await target.connect()
        finally:
            writer.close()

    async def run() -> None:
        period = len(requests) / rate
        await asyncio.gather(*(client(r, i * period / len(requests))
                               for i, r in enumerate(requests)))

    asyncio.run(run())


def bad_requests(model: str) -> list[tuple[str, bytes, set[int]]]:
    """(what, raw HTTP bytes, acceptable statuses; 0: the server may just close)."""
    path = f"/v2/models/{model}/infer"
    good = {"name": "x", "datatype": "FP32", "shape": list(SHAPE)}

    def post(body: bytes, headers: dict[str, str] | None = None) -> bytes:
        return http_request(path, body, headers)

    def inputs(**entry: Any) -> bytes:
        return json.dumps({"inputs": [{**good, **entry}]}).encode()

    bomb = gzip.compress(b"\0" * (64 << 20), 9)
    fields = "".join(f"X-Field-{i}: v\r\n" for i in range(200))
    nested = ('{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": '
              + "[" * 120 + "0" + "]" * 120 + "}]}").encode()
    chunks = b"1\r\n\0\r\n" * 65537 + b"0\r\n\r\n"  # one chunk past Triton's count
    return [
        ("malformed json", post(b'{"inputs": ['), {400}),
        ("not an object", post(b"[1, 2, 3]"), {400}),
        ("wrong dtype", post(inputs(datatype="INT8", data=[0] * 4)), {400}),
        ("count mismatch", post(inputs(data=[0.0] * 7)), {400}),
        ("huge shape", post(inputs(shape=[0, 2**40, 2**40, 2**40], data=[])), {400}),
        ("binary past body", post(inputs(parameters={"binary_data_size": 1 << 20}),
                                  {HEADER_LENGTH: "-1"}), {400}),
        ("unknown model", http_request("/v2/models/nope/infer", inputs(data=[])), {404}),
        ("unknown region", post(inputs(parameters={"shared_memory_region": "nope",
                                                   "shared_memory_byte_size": 16})), {400}),
        ("region out of bounds", post(inputs(parameters={
            "shared_memory_region": "soak-shm", "shared_memory_offset": 1 << 30,
            "shared_memory_byte_size": 16})), {400}),
        ("corrupt gzip", post(b"\x1f\x8b not gzip", {"Content-Encoding": "gzip"}), {400}),
        ("gzip bomb", post(bomb, {"Content-Encoding": "gzip"}), {413}),
        ("over max_request_mb", (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: "
                                 f"{1 << 30}\r\n\r\n").encode(), {413, 0}),
        ("cut-off body", (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n"
                          "{").encode(), {0, 400}),
        ("garbage request line", b"\x16\x03\x01 hello\r\n\r\n", {400, 0}),
        ("unload unknown", http_request("/v2/repository/models/nope/unload", b"{}"), {404}),
        ("200 header fields", f"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n{fields}\r\n"
                              .encode(), {431}),
        ("64 KB header line", b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Long: "
                              + b"a" * 60_000 + b"\r\n\r\n", {431}),
        ("nested 120 deep", post(nested), {400}),
        ("a byte a chunk, too many", (f"POST {path} HTTP/1.1\r\nHost: x\r\n"
                                      "Transfer-Encoding: chunked\r\n\r\n").encode() + chunks,
         {400}),
    ]


def send_raw(sock_path: Path, raw: bytes, *, half_close: bool = False,
             timeout_s: float = 10) -> int:
    """Send `raw` on a fresh connection (then half-close it, if asked: a body cut off), and
    return the answer's status (0: closed without one)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(timeout_s)
        s.connect(str(sock_path))
        try:
            s.sendall(raw)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            head = s.recv(64)
        except (BrokenPipeError, ConnectionResetError):
            return 0
    match = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return int(match.group(1)) if match else 0


def burst(sock_path: Path, model: str) -> dict[str, Any]:
    seen: dict[str, int] = {}
    unexpected = []
    for what, raw, ok in bad_requests(model):
        try:
            status = send_raw(sock_path, raw, half_close=what == "cut-off body")
        except OSError as exc:
            status = -1
            what = f"{what} ({exc})"
        seen[what] = status
        if status not in ok:
            unexpected.append(f"{what}: {status}")
    return {"sent": len(seen), "unexpected": unexpected}


class Daemon:
    """What the soak reads of the daemon process: RSS, fds, CPU time, stream counters."""

    def __init__(self, pid: int, sock: Path) -> None:
        self.pid, self.sock = pid, sock

    def rss_mb(self) -> float:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def cpu_s(self) -> float:
        """User plus system CPU seconds the daemon has used (all its threads)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()  # past the command, which may hold spaces
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def others(self) -> dict[str, float]:
        """What else shares the box: this process's CPU seconds (the load, the broker client,
        the OTA signer) and the machine's busy and stolen (hypervisor) CPU seconds."""
        own = os.times()
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        jiffies = [int(v) / os.sysconf("SC_CLK_TCK") for v in cpu]
        # user nice system idle iowait irq softirq steal: busy is all but idle and iowait
        return {"driver_cpu_s": own.user + own.system,
                "box_busy_s": sum(jiffies[:8]) - jiffies[3] - jiffies[4],
                "box_steal_s": jiffies[7]}

    def frames(self) -> dict[str, float]:
        with EdgedClient(self.sock, timeout_s=10) as client:
            text = client.metrics()
        return {f"{kind}:{stream}": float(v) for kind, stream, v in _COUNTER.findall(text)}


def run_bench(workdir: Path, *, quick: bool, minutes: float | None = None) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    minutes = minutes or (2.0 if quick else 60.0)
    # Windows of whole buckets: 5 minutes, or a quarter of a short run.
    window_s = BUCKET_S * max(1, round(min(300.0, minutes * 15) / BUCKET_S))
    key = Ed25519PrivateKey.generate()
    (workdir / "fleet.pub").write_bytes(key.public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    source = _layout(workdir)
    prefix = "soak/edge-01"
    with RestartableBroker(workdir / "broker") as broker:
        streams = (f"[{{name: colors, source: 'file://{workdir / 'colors.avi'}', model: colors, "
                   f"loop: true}}, {{name: crossing, source: 'file://{workdir / 'crossing.avi'}',"
                   " model: grid_det, loop: true, labels: [red, green, blue], zones: [{name: "
                   "right, polygon: [[128, 0], [256, 0], [256, 256], [128, 256]]}]}]")
        config = edged_config(workdir, preload=["cls", "colors", "grid_det"], streams=streams,
                              mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        config = config.replace("api: {", "api: {max_request_mb: 8, ")
        config += f"ota: {{trusted_keys: [{workdir / 'fleet.pub'}], keep_versions: 2}}\n"
        watch = StatusWatch(broker.port, f"{prefix}/ota/cls/status")
        watch.client.reconnect_delay_set(1, 2)  # back soon after the broker restart
        try:
            with run_edged(workdir, config) as (sock, proc), \
                    SharedRegion(f"edged-soak-{os.getpid()}", 1 << 20) as region:
                return _soak(workdir, sock, proc.pid, region, broker, watch, key, source,
                             prefix, minutes, window_s)
        finally:
            watch.close()


def _layout(workdir: Path) -> Path:
    """The demo's models and videos, and PP-OCR cls as `cls`; returns cls's ONNX file."""
    import sys

    tools = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(tools))
    try:
        from tools.assets import demo as demo_assets
    finally:
        sys.path.remove(str(tools))
    tiny_model_tools().write_repository(workdir / "models", names=["colors", "grid_det"])
    demo_assets.write_color_video(workdir / "colors.avi")
    demo_assets.write_crossing_video(workdir / "crossing.avi")
    source = ppocr_model(PPOCR_CLS)
    (workdir / "models" / "cls" / "1").mkdir(parents=True)
    shutil.copyfile(source, workdir / "models" / "cls" / "1" / "model.onnx")
    (workdir / "models" / "cls" / "model.yaml").write_text(CLS_YAML)
    (workdir / "artifacts").mkdir()
    return source


def _requests(client: EdgedClient, region: SharedRegion) -> tuple[bytes, bytes]:
    x = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
    headers = {"Content-Type": "application/octet-stream"}
    parts, json_length = encode_request({"x": x}, [], binary=True)
    binary = http_request("/v2/models/cls/infer", b"".join(parts),
                          {**headers, HEADER_LENGTH: str(json_length)})
    client.register_shm("soak-shm", region.key, region.byte_size)
    region.write(x)
    parts, _ = encode_request({"x": ShmTensor(Ref("soak-shm", 0, x.nbytes), "FP32", SHAPE)},
                              [], binary=True)
    return binary, http_request("/v2/models/cls/infer", b"".join(parts))


def _soak(workdir: Path, sock: Path, pid: int, region: SharedRegion, broker: RestartableBroker,
          watch: StatusWatch, key: Any, source: Path, prefix: str, minutes: float,
          window_s: float) -> dict[str, Any]:
    daemon = Daemon(pid, sock)
    target = Target(unix=str(sock))
    with EdgedClient(sock, timeout_s=30) as client:
        binary, shm = _requests(client, region)
    calibrate_s = min(15.0, minutes * 15)
    capacity = closed_loop(target, binary, concurrency=CLIENTS, seconds=calibrate_s,
                           warmup_s=2).rate
    rate = LOAD_SHARE * capacity
    recorder = Recorder()
    stop = threading.Event()
    load = threading.Thread(target=paced_clients, name="soak-load", daemon=True, args=(
        target, [binary, shm] * (CLIENTS // 2), rate, recorder, stop))
    load.start()
    samples: list[dict[str, Any]] = []
    faults: list[dict[str, Any]] = []
    total_s = minutes * 60
    windows = max(1, round(total_s / window_s))
    plan = sorted([(w * window_s + 0.2 * window_s, "burst") for w in range(windows)]
                  + [(w * window_s + 0.6 * window_s, "ota") for w in range(windows)]
                  + [(total_s / 2 + 0.25 * window_s, "broker")])
    version = 1
    try:
        next_sample = 0.0
        while (now := time.monotonic() - recorder.start) < total_s:
            if plan and now >= plan[0][0]:
                _, kind = plan.pop(0)
                began = time.monotonic()
                if kind == "burst":
                    result = burst(sock, "cls")
                elif kind == "ota":
                    version += 1
                    result = _update(workdir, watch, key, source, prefix, version)
                else:
                    broker.stop()
                    time.sleep(10)
                    broker.start()
                    result = {}
                faults.append({"at_s": round(now, 1), "kind": kind,
                               "took_s": round(time.monotonic() - began, 2), **result})
                continue
            if now >= next_sample:
                samples.append({"t": round(now, 1), "rss_mb": daemon.rss_mb(),
                                "fds": daemon.fds(), "cpu_s": daemon.cpu_s(),
                                **daemon.others(), **daemon.frames()})
                next_sample += BUCKET_S
            time.sleep(0.2)
    finally:
        stop.set()
        load.join(60)
    samples.append({"t": round(total_s, 1), "rss_mb": daemon.rss_mb(), "fds": daemon.fds(),
                    "cpu_s": daemon.cpu_s(), **daemon.others(), **daemon.frames()})
    return _report(recorder, samples, faults, capacity, rate, minutes, window_s)


def _update(workdir: Path, watch: StatusWatch, key: Any, source: Path, prefix: str,
            version: int) -> dict[str, Any]:
    artifact = workdir / "artifacts" / f"cls-{version}.onnx"
    data = variant(source, artifact, version)
    with serve(artifact, "127.0.0.1:0", None) as url:
        doc = sign_document({"model": "cls", "version": version, "format": "onnx",
                             "artifact": {"url": url, "size": len(data),
                                          "sha256": hashlib.sha256(data).hexdigest()},
                             **freshness(prefix)}, key)
        try:
            deadline = time.monotonic() + 60
            while not watch.client.is_connected() and time.monotonic() < deadline:
                time.sleep(0.2)  # the operator's side reconnecting after the broker restart
            watch.publish(f"{prefix}/ota/cls", json.dumps(doc).encode())
            watch.until("active", version, 120)
            outcome = "active"
        except Exception as exc:  # a failed or lost update is reported, the soak goes on
            outcome = f"failed: {exc}"
    artifact.unlink()
    return {"version": version, "outcome": outcome}


def _report(recorder: Recorder, samples: list[dict[str, Any]], faults: list[dict[str, Any]],
            capacity: float, rate: float, minutes: float, window_s: float) -> dict[str, Any]:
    per_window = round(window_s / BUCKET_S)
    # Whole windows only: the last few answers after the end would be a window of their own.
    buckets = int(minutes * 60 // BUCKET_S)
    windows = []
    for w in range(0, buckets - per_window // 2, per_window):
        lat = array("d")
        for b in range(w, w + per_window):
            lat.extend(recorder.latencies.get(b, array("d")))
        inside = [s for s in samples if w * BUCKET_S <= s["t"] < (w + per_window) * BUCKET_S]
        row: dict[str, Any] = {
            "from_min": round(w * BUCKET_S / 60, 1), "requests": len(lat),
            "failed": sum(recorder.failed.get(b, 0) for b in range(w, w + per_window))}
        if lat:
            row.update(Latency.of(list(lat)).__dict__)
        if inside:
            row.update(rss_mb=round(float(np.median([s["rss_mb"] for s in inside])), 1),
                       fds=max(s["fds"] for s in inside))
        # The daemon's CPU (streams included): from the window's first sample to the next's.
        ends = [s for s in samples if s["t"] >= (w + per_window) * BUCKET_S][:1] or samples[-1:]
        if inside and lat and ends[0]["t"] > inside[0]["t"]:
            cpu = ends[0]["cpu_s"] - inside[0]["cpu_s"]
            span = ends[0]["t"] - inside[0]["t"]
            row["cpu_percent"] = round(100 * cpu / span, 1)
            row["cpu_ms_per_request"] = round(1000 * cpu / len(lat) * per_window * BUCKET_S
                                              / span, 3)
            for key, name in (("driver_cpu_s", "driver_cpu_percent"),
                              ("box_busy_s", "box_busy_percent"),
                              ("box_steal_s", "steal_percent")):
                used = ends[0].get(key, 0.0) - inside[0].get(key, 0.0)
                row[name] = round(100 * used / span, 1)
        windows.append(row)
    settled = [s for s in samples if s["t"] >= window_s]
    first_rss = float(np.median([s["rss_mb"] for s in settled[:3]])) if settled else 0.0
    last_rss = float(np.median([s["rss_mb"] for s in settled[-3:]])) if settled else 0.0
    fds = [s["fds"] for s in settled]
    slope = float(np.polyfit([s["t"] / 3600 for s in settled], fds, 1)[0]) \
        if len(settled) > 2 else 0.0
    p99s = [w["p99_ms"] for w in windows if "p99_ms" in w]
    streams = {k: samples[-1].get(k, 0.0) - samples[0].get(k, 0.0)
               for k in samples[-1] if ":" in k}
    unexpected = [u for f in faults for u in f.get("unexpected", [])]
    failed_updates = [f for f in faults if f["kind"] == "ota" and f["outcome"] != "active"]
    summary = {
        "failed_requests": sum(recorder.failed.values()),
        "failed_frames": sum(v for k, v in streams.items() if k.startswith("failed:")),
        "failed_updates": len(failed_updates),
        "bad_requests_answered_wrong": len(unexpected),
        "rss_growth_pct": round(100 * (last_rss - first_rss) / first_rss, 2) if first_rss
        else None,
        "fd_min_max_after_first_window": [min(fds), max(fds)] if fds else None,
        "fd_slope_per_hour": round(slope, 2),
        "worst_p99_over_first": round(max(p99s) / p99s[0], 2) if p99s else None,
    }
    checks = {
        "0 failed requests outside the faults": summary["failed_requests"] == 0
        and summary["failed_frames"] == 0 and not failed_updates and not unexpected,
        f"RSS growth <= {RSS_GROWTH_PCT:g}% after the first window": summary["rss_growth_pct"]
        is not None and summary["rss_growth_pct"] <= RSS_GROWTH_PCT,
        # Flat: the trend over the run adds fewer than 2 descriptors, none beyond the first
        # window's highest count by more than 2 (a connection or two may be open at a sample).
        "fd count flat": bool(fds) and slope * (minutes - window_s / 60) / 60 < 2
        and max(fds) <= max(fds[:max(1, per_window)]) + 2,
        f"p99 within {P99_OVER_FIRST:g}x of the first window":
        summary["worst_p99_over_first"] is not None
        and summary["worst_p99_over_first"] <= P99_OVER_FIRST,
    }
    checks = {what: bool(ok) for what, ok in checks.items()}
    return {"minutes": minutes, "window_s": window_s, "capacity_rps": round(capacity, 1),
            "offered_rps": round(rate, 1), "clients": CLIENTS, "windows": windows,
            "streams": streams, "faults": faults, "summary": summary, "checks": checks,
            "errors": recorder.errors, "samples": samples}


def format_table(r: dict[str, Any]) -> str:
    lines = [f"soak: {r['minutes']:g} min; PP-OCR cls on the socket at {r['offered_rps']:.0f} "
             f"req/s ({LOAD_SHARE:.0%} of {r['capacity_rps']:.0f} measured), {r['clients']} "
             "clients (binary, shm), 2 streams, faults: a bad-request burst and an OTA swap "
             "per window, one broker restart", "",
             "| from (min) | requests | failed | p50 (ms) | p99 (ms) | RSS (MB) | fds "
             "| daemon CPU (%) | CPU/request (ms) | soak driver CPU (%) | box busy (%) "
             "| steal (%) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in r["windows"]:
        lines.append(f"| {w['from_min']:g} | {w['requests']} | {w['failed']} | "
                     f"{w.get('p50_ms', 0):.2f} | {w.get('p99_ms', 0):.2f} | "
                     f"{w.get('rss_mb', 0):.1f} | {w.get('fds', 0)} | "
                     f"{w.get('cpu_percent', 0):.0f} | {w.get('cpu_ms_per_request', 0):.3f} | "
                     f"{w.get('driver_cpu_percent', 0):.0f} | {w.get('box_busy_percent', 0):.0f} "
                     f"| {w.get('steal_percent', 0):.1f} |")
    s = r["summary"]
    lines += ["", f"streams: {', '.join(f'{k} {v:.0f}' for k, v in r['streams'].items())}",
              f"faults: {sum(f['kind'] == 'burst' for f in r['faults'])} bursts, "
              f"{sum(f['kind'] == 'ota' for f in r['faults'])} OTA swaps "
              f"({s['failed_updates']} failed), "
              f"{sum(f['kind'] == 'broker' for f in r['faults'])} broker restart(s); "
              f"bad requests answered wrongly: {s['bad_requests_answered_wrong']}",
              f"RSS growth after the first window: {s['rss_growth_pct']}%; fds "
              f"{s['fd_min_max_after_first_window']} (slope {s['fd_slope_per_hour']}/h); "
              f"worst window p99 / first: {s['worst_p99_over_first']}", ""]
    lines += [f"{'PASS' if ok else 'FAIL'}  {what}" for what, ok in r["checks"].items()]
    return "\n".join(lines)
