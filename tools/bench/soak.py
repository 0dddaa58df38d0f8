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
is counted separately), p50/p99 per window, the RSS trend once settled and the fd count's
slope, and checks them against the bounds: 0 failures, the RSS trend after the warm-up (the
first third of the run) at most 2% an hour (issue 49: the same verdict on any machine, where
"growth after the first window" depended on when a VM's allocator took its last step), fds
flat, each window's p99 within 1.5x of the first's. `--plant-leak MB` runs the daemon with a
leak of MB an hour planted (tools/bench/plant), to show that the verdict fails it."""

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
from tools.bench.core import CLS_YAML
from tools.bench.load import Target, closed_loop, exchange, http_request
from tools.bench.ota import StatusWatch, variant
from tools.bench.soak_report import (
    BUCKET_S,
    CLIENTS,
    LOAD_SHARE,
    Recorder,
    format_table,
    report,
)

__all__ = ["format_table", "run_bench"]

SHAPE = (1, 3, 48, 192)
_COUNTER = re.compile(r'^edged_stream_frames_(processed|failed)_total\{stream="([^"]+)"\} (\S+)',
                      re.MULTILINE)


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


def run_bench(workdir: Path, *, quick: bool, minutes: float | None = None,
              plant_leak: float | None = None) -> dict[str, Any]:
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
            env = None if not plant_leak else {
                "PYTHONPATH": str(Path(__file__).parent / "plant"),
                "EDGED_PLANTED_LEAK_MB_PER_H": str(plant_leak)}
            with run_edged(workdir, config, env) as (sock, proc), \
                    SharedRegion(f"edged-soak-{os.getpid()}", 1 << 20) as region:
                result = _soak(workdir, sock, proc.pid, region, broker, watch, key, source,
                               prefix, minutes, window_s)
                result["planted_leak_mb_per_h"] = plant_leak or 0
                return result
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
    return report(recorder, samples, faults, capacity, rate, minutes, window_s)


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
