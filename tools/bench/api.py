"""`edged bench api`: what a call through the socket API costs, against direct `session.run`
measured in the same run, and against MLServer (a mainstream Python KServe v2 server).

edged runs as a real subprocess (`edged run`) on a Unix socket plus a loopback port; the bench
process is the client. (a) c=1 latency, interleaved round by round: direct ORT (a session with
the daemon's options) vs `EdgedClient` with binary tensors vs the same with tensors in system
shared memory, on tiny_cls and on PP-OCR det at 1x3x640x640. (b) closed-loop request rates at
concurrency 1 and 8 on tiny_cls with one lean load generator (`tools.bench.load`) for every
server: edged over the socket (binary), edged over TCP with JSON, and MLServer over TCP with
the byte-identical JSON request (it has neither Unix sockets nor the binary extension).
The first table (`tools.bench.yardstick`) runs Triton's perf_analyzer against edged, against
direct `session.run`, and against the floor (`tools.bench.floor`: the least a Python server on
edged's stack does per request), in one run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import HEADER_LENGTH, RequestedOutput, ShmRef, encode_request
from edged.backends import BackendOptions
from edged.backends.onnxruntime import session_options
from edged.inference.threads import remembered_threads
from edged.model.repository import ModelRepository
from edged.ops.client import EdgedClient, InferResponse, SharedRegion
from tools.bench import floor, pipeline_cpu, yardstick
from tools.bench.assets import PPOCR_CLS, PPOCR_DET, ppocr_model, tiny_model_tools
from tools.bench.broker import free_port, stop_process
from tools.bench.core import CLS_YAML, Latency, interleaved
from tools.bench.load import Target, closed_loop, http_request, one

THREADS = 2  # intra-op threads, for edged and for the direct sessions alike
DET_YAML = "max_batch_size: 1\nwarmup: {shapes: {x: [3, 640, 640]}}\n"


def build_repository(root: Path) -> None:
    """det, cls and tiny_cls; and cls and tiny_cls again with the response cache on
    (yardstick.CACHED: `<model>_cached`)."""
    (root / "det" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_DET), root / "det" / "1" / "model.onnx")
    (root / "det" / "model.yaml").write_text(DET_YAML)
    (root / "cls" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_CLS), root / "cls" / "1" / "model.onnx")
    (root / "cls" / "model.yaml").write_text(CLS_YAML)
    tiny_model_tools().write_repository(root, names=["tiny_cls"])
    for model in yardstick.SHAPES:
        cached = root / yardstick.cached(model)
        shutil.copytree(root / model, cached)
        yaml = cached / "model.yaml"
        yaml.write_text(yaml.read_text() + "\nresponse_cache: true\n")


def edged_config(workdir: Path, *, preload: list[str], http: str | None = None,
                 mqtt: str = "enabled: false", streams: str = "[]",
                 threads: int = THREADS) -> str:
    """A daemon config over workdir/models with the bench's thread setting (`threads`; 0 lets
    edged choose per model, as its default does)."""
    listen = f', http: "{http}"' if http else ""
    return f"""device_id: bench
models_dir: {workdir / 'models'}
cache: {{dir: {workdir / 'cache'}, preload: [{', '.join(preload)}]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: {threads}}}}}
api: {{socket: {workdir / 's.sock'}{listen}}}
mqtt: {{{mqtt}}}
streams: {streams}
logging: {{level: warning}}
"""


@contextmanager
def run_edged(workdir: Path, config_text: str, env: dict[str, str] | None = None
              ) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """`edged run` as a subprocess on `config_text` (from edged_config), with `env` added to
    its environment; yields its socket path and process once the daemon is ready."""
    sock = workdir / "s.sock"
    config = workdir / "edged.yaml"
    config.write_text(config_text)
    log = (workdir / "edged.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "edged.cli", "run", "--config", str(config)],
                            stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, **env} if env else None)
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"edged exited: {(workdir / 'edged.log').read_text()}")
            if sock.exists():
                with EdgedClient(sock, timeout_s=5) as client:
                    try:
                        if client.ready():
                            break
                    except OSError:
                        pass
            if time.monotonic() > deadline:
                raise RuntimeError("edged did not become ready in 120 s")
            time.sleep(0.2)
        yield sock, proc
    finally:
        stop_process(proc, 20)
        log.close()


def direct_session(path: Path, threads: int = THREADS) -> Any:
    """A plain ORT session built with exactly the options edged gives its own sessions."""
    import onnxruntime as ort

    options = BackendOptions(providers=("cpu",), intra_op_threads=threads)
    return ort.InferenceSession(str(path), session_options(options),
                                providers=["CPUExecutionProvider"])


def latency_case(client: EdgedClient, session: Any, model: str, x: np.ndarray,
                 rounds: int) -> dict[str, Any]:
    """direct vs socket-binary vs shared memory, one call of each per round."""
    feed = {session.get_inputs()[0].name: x}
    reference = session.run(None, feed)
    names = [o.name for o in session.get_outputs()]
    out_bytes = sum(r.nbytes for r in reference)
    key = f"edged-bench-{os.getpid()}-{model}"
    with SharedRegion(key, x.nbytes + out_bytes) as region:
        client.register_shm(model, key, x.nbytes + out_bytes)
        shm_in = region.tensor(model, x)
        outputs, offset = [], x.nbytes
        for name, ref in zip(names, reference, strict=True):
            outputs.append(RequestedOutput(name, shm=ShmRef(model, offset, ref.nbytes)))
            offset += ref.nbytes

        def via_socket() -> InferResponse:
            return client.infer(model, feed)

        def via_shm() -> InferResponse:
            return client.infer(model, {next(iter(feed)): shm_in}, outputs=outputs)

        got = via_socket().outputs
        for name, ref in zip(names, reference, strict=True):
            np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5)
        result = via_shm()
        datatype, shape = result.in_shm[names[0]]
        np.testing.assert_allclose(region.read(datatype, shape, x.nbytes), reference[0],
                                   rtol=1e-4, atol=1e-5)
        calls: list[Callable[[], object]] = [partial(session.run, None, feed), via_socket,
                                             via_shm]
        for call in calls:  # warm
            call()
        pause = 0.01 if x.nbytes > 1 << 20 else 0.0  # see interleaved()
        d, s, m = (Latency.of(t) for t in interleaved(calls, blocks=rounds, per_block=1,
                                                       pause_s=pause))
        client.unregister_shm(model)
    return {"direct": d.__dict__, "socket": s.__dict__, "shm": m.__dict__,
            "socket_ratio_p50": s.p50_ms / d.p50_ms, "shm_ratio_p50": m.p50_ms / d.p50_ms}


def rate_case(target: Target, request: bytes, seconds: float) -> dict[str, Any]:
    row = {}
    for concurrency in (1, 8):
        result = closed_loop(target, request, concurrency=concurrency, seconds=seconds)
        row[f"c{concurrency}"] = {"requests_per_s": result.rate,
                                  "p50_ms": Latency.of(result.latencies_s).p50_ms}
    return row


def tiny_requests(x: np.ndarray) -> tuple[bytes, bytes]:
    binary_parts, json_length = encode_request({"x": x}, [], binary=True)
    json_parts, _ = encode_request({"x": x}, [], binary=False)
    binary, as_json = b"".join(binary_parts), b"".join(json_parts)
    path = "/v2/models/tiny_cls/infer"
    return (http_request(path, binary, {"Content-Type": "application/octet-stream",
                                        HEADER_LENGTH: str(json_length)}),
            http_request(path, as_json))


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    build_repository(workdir / "models")
    rng = np.random.default_rng(0)
    tiny_x = rng.random((1, 3, 8, 8), dtype=np.float32)
    det_x = rng.random((1, 3, 640, 640), dtype=np.float32)
    rounds_tiny, rounds_det, seconds = (50, 4, 1.0) if quick else (1000, 30, 4.0)
    results: dict[str, Any] = {"latency": {}, "rates": {}}
    port = free_port()
    binary_req, json_req = tiny_requests(tiny_x)
    # edged on its default thread choice (each model timed at its first load); every direct
    # session is built with the count edged chose for that model.
    config = edged_config(workdir, preload=["tiny_cls", "cls", "det",
                                            *map(yardstick.cached, yardstick.SHAPES)],
                          http=f"127.0.0.1:{port}", threads=0)
    with run_edged(workdir, config) as (sock, proc), EdgedClient(sock) as client:
        repo = ModelRepository(workdir / "models")
        chosen = {model: remembered_threads(workdir / "cache", repo.resolve(model)) or THREADS
                  for model in ("tiny_cls", "cls", "det")}
        results["threads"] = chosen
        sessions = {model: direct_session(workdir / "models" / model / "1" / "model.onnx",
                                          chosen[model])
                    for model in yardstick.SHAPES}
        served = {model: workdir / "models" / model / "1" / "model.onnx"
                  for model in yardstick.SHAPES}
        floor_port = free_port()
        replies = floor.capture_replies(f"127.0.0.1:{port}", list(served))
        with floor.run_floor(workdir, floor_port, served, replies, chosen) as floor_proc:
            results["yardstick"] = yardstick.measure(
                yardstick.Edged(proc.pid, port, sock), sessions, workdir, seconds=seconds,
                floor=yardstick.Served(floor_proc.pid, floor_port))
        del sessions
        for model, x, rounds in (("tiny_cls", tiny_x, rounds_tiny), ("det", det_x, rounds_det)):
            session = direct_session(workdir / "models" / model / "1" / "model.onnx",
                                     chosen[model])
            results["latency"][model] = latency_case(client, session, model, x, rounds)
            del session
        one(Target(unix=str(sock)), json_req)  # answers at all before it is timed
        results["rates"]["edged_socket_binary"] = rate_case(Target(unix=str(sock)), binary_req,
                                                            seconds)
        results["rates"]["edged_tcp_json"] = rate_case(Target(port=port), json_req, seconds)
    results["rates"]["mlserver_tcp_json"] = mlserver_rates(workdir, json_req, seconds)
    try:
        results["pipeline"] = pipeline_cpu.measure(workdir, frames=100 if quick else 1000)
    except RuntimeError as exc:  # no MQTT broker to publish to
        results["pipeline"] = {"skipped": str(exc)}
    return results


def mlserver_rates(workdir: Path, request: bytes, seconds: float) -> dict[str, Any]:
    from tools.bench.mlserver_peer import mlserver_available, run_mlserver

    reason = mlserver_available()
    if reason is not None:
        return {"skipped": reason + " (pip install 'edged[bench]')"}
    model = workdir / "models" / "tiny_cls" / "1" / "model.onnx"
    with run_mlserver(model, "tiny_cls", intra_op_threads=THREADS,
                      workdir=workdir / "mlserver") as url:
        target = Target(port=int(url.rsplit(":", 1)[1]))
        one(target, request)
        return rate_case(target, request, seconds)


def format_table(r: dict[str, Any]) -> str:
    pipe = r["pipeline"]
    threads = ", ".join(f"{m} {n}" for m, n in r.get("threads", {}).items())
    lines = [f"intra-op threads, as edged chose them (the direct sessions use the same): "
             f"{threads}", "", *yardstick.format_rows(r["yardstick"]),
             "| stream pipeline, 640x480, YOLOv8 head, ~20 boxes | | pre + post + JSON + MQTT "
             "publish, outside decode and model | "
             + (f"skipped: {pipe['skipped']}" if "skipped" in pipe else
                f"{1000 / pipe['wall_ms_per_frame']:.0f} frames/s | | | | | "
                f"{pipe['cpu_ms_per_frame'] * 1000:.0f} µs CPU/frame |"), "",
             "| c=1 p50 (ms) | direct ORT | socket, binary | shared memory |",
             "|---|---|---|---|"]
    for model, label in (("tiny_cls", "tiny_cls"), ("det", "PP-OCR det 1x3x640x640")):
        row = r["latency"][model]
        lines.append(f"| {label} | {row['direct']['p50_ms']:.3f} | {row['socket']['p50_ms']:.3f}"
                     f" ({row['socket_ratio_p50']:.3f}x) | {row['shm']['p50_ms']:.3f} "
                     f"({row['shm_ratio_p50']:.3f}x) |")
    lines += ["", "| tiny_cls requests/s | c=1 | c=8 |", "|---|---|---|"]
    rates = r["rates"]
    labels = {"edged_socket_binary": "edged, Unix socket, binary",
              "edged_tcp_json": "edged, TCP, JSON", "mlserver_tcp_json": "MLServer, TCP, JSON"}
    for key, label in labels.items():
        row = rates[key]
        if "skipped" in row:
            lines.append(f"| {label} | skipped: {row['skipped']} | |")
            continue
        lines.append(f"| {label} | {row['c1']['requests_per_s']:.0f} | "
                     f"{row['c8']['requests_per_s']:.0f} |")
    peer = rates["mlserver_tcp_json"]
    if "skipped" not in peer:
        base = peer["c8"]["requests_per_s"]
        lines.append(f"| edged / MLServer at c=8 | | TCP JSON "
                     f"{rates['edged_tcp_json']['c8']['requests_per_s'] / base:.2f}x, socket "
                     f"binary {rates['edged_socket_binary']['c8']['requests_per_s'] / base:.2f}x |")
    return "\n".join(lines)
