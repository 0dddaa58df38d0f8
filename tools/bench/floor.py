"""The floor: the least a Python HTTP server on edged's own stack (uvloop, httptools, the json
module, ONNX Runtime) does to answer a KServe v2 infer request, run beside edged under the same
perf_analyzer in `edged bench api`. What it costs per request is what any Python server on this
box pays before it checks anything; the rest of edged's figure is edged's own work.

What it does per request: parse the HTTP head, take the body, `json.loads` the KServe header,
view each binary input with `np.frombuffer` (or build it from JSON `data`), `session.run`, and
answer with the outputs as the request asked (binary or JSON). What it leaves out is everything
a server owes its users: no validation (a malformed request raises in the handler and the
connection drops), no body bounds or budgets, no timeouts, no keep-alive limits, no statistics
but a count, no batching, no scheduling, no shared memory. It is a yardstick, never a server.

Inference runs on the loop when the model's last run took under INLINE_S (no thread hop for a
model that takes microseconds) or when the request is alone (no other arrived in its turn of
the loop or is running); else on a pool of one thread per core, so that requests for a slower
model overlap, as edged's instances do. The metadata and config perf_analyzer asks for first
are edged's own answers, captured by the bench and replayed byte for byte."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import NUMPY_TO_TRITON, TRITON_TO_NUMPY

INLINE_S = 200e-6
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"


class Model:
    def __init__(self, name: str, path: str, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.name = name
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.last_s = 1.0  # not quick until a run says so
        self.count = 0

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        began = time.perf_counter()
        outputs: list[np.ndarray] = self.session.run(None, feed)
        self.last_s = time.perf_counter() - began
        return outputs


class Floor:
    def __init__(self, models: dict[str, Model], replies: dict[str, bytes]) -> None:
        self.models = models
        self.replies = replies  # GET path -> JSON body (edged's own answers)
        self.pool = ThreadPoolExecutor(max_workers=len(os.sched_getaffinity(0)))
        self.in_flight = 0  # requests on the pool
        self.waiting: list[tuple[Connection, Model, dict[str, Any], dict[str, np.ndarray]]] = []

    def dispatch(self) -> None:
        """The slow model's requests of one turn: alone, run on the loop (no hop); else on
        the pool, side by side."""
        jobs, self.waiting = self.waiting, []
        if len(jobs) == 1 and not self.in_flight:
            connection, model, request, feed = jobs[0]
            connection._answer(model, request, model.run(feed))
            return
        loop = asyncio.get_running_loop()
        for connection, model, request, feed in jobs:
            self.in_flight += 1
            future = loop.run_in_executor(self.pool, model.run, feed)
            future.add_done_callback(partial(connection.pooled, model, request))


class Connection(asyncio.Protocol):
    def __init__(self, floor: Floor) -> None:
        import httptools

        self.floor = floor
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        url, headers, body = self.url.decode(), self.headers, b"".join(self.body)
        self.url, self.headers, self.body = b"", {}, []
        if self.parser.get_method() == b"GET":
            self._get(url)
            return
        parts = url.split("/")  # /v2/models/<name>/infer
        model = self.floor.models[parts[3]]
        length = int(headers.get(b"inference-header-content-length", len(body)))
        request = json.loads(body[:length])
        feed, offset = {}, length
        for spec in request["inputs"]:
            dtype = np.dtype(TRITON_TO_NUMPY[spec["datatype"]])
            size = spec.get("parameters", {}).get("binary_data_size")
            if size is None:
                feed[spec["name"]] = np.array(spec["data"], dtype).reshape(spec["shape"])
            else:
                feed[spec["name"]] = np.frombuffer(body, dtype, size // dtype.itemsize,
                                                   offset).reshape(spec["shape"])
                offset += size
        if model.last_s < INLINE_S:
            self._answer(model, request, model.run(feed))
            return
        floor = self.floor
        floor.waiting.append((self, model, request, feed))
        if len(floor.waiting) == 1:  # after every read of this turn is parsed
            asyncio.get_running_loop().call_soon(floor.dispatch)

    def pooled(self, model: Model, request: dict[str, Any],
               done: asyncio.Future[list[np.ndarray]]) -> None:
        self.floor.in_flight -= 1
        self._answer(model, request, done.result())

    def _answer(self, model: Model, request: dict[str, Any], outputs: list[np.ndarray]) -> None:
        model.count += 1
        binary = request.get("parameters", {}).get("binary_data_output", False)
        asked = {o["name"]: o.get("parameters", {}).get("binary_data", binary)
                 for o in request.get("outputs", [])}
        entries, blobs = [], []
        for meta, array in zip(model.session.get_outputs(), outputs, strict=True):
            if asked and meta.name not in asked:
                continue
            entry = {"name": meta.name, "datatype": NUMPY_TO_TRITON[array.dtype.str],
                     "shape": list(array.shape)}
            if asked.get(meta.name, binary):
                blob = array.tobytes()
                entry["parameters"] = {"binary_data_size": len(blob)}
                blobs.append(blob)
            else:
                entry["data"] = array.reshape(-1).tolist()
            entries.append(entry)
        text = json.dumps({"model_name": model.name, "model_version": "1",
                           "outputs": entries}, separators=(",", ":")).encode()
        if blobs:
            extra = b"Inference-Header-Content-Length: %d\r\n" % len(text)
            payload = text + b"".join(blobs)
            kind = b"application/octet-stream"
        else:
            extra, payload, kind = b"", text, b"application/json"
        self.transport.write(_OK % (kind, len(payload), extra) + payload)

    def _get(self, url: str) -> None:
        reply = self.floor.replies.get(url)
        if reply is None:
            print("floor: no reply for GET", url, file=sys.stderr, flush=True)
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        body = reply
        if url.endswith("/stats"):  # edged's statistics, with the floor's own counts
            stats = json.loads(reply)
            for entry in stats["model_stats"]:
                model = self.floor.models.get(entry["name"])
                count = model.count if model is not None else 0
                entry["inference_count"] = entry["execution_count"] = count
                entry["last_inference"] = int(time.time() * 1000) if count else 0
                counted = entry["inference_stats"]
                for kind in ("success", "queue", "compute_input", "compute_infer",
                             "compute_output"):
                    counted[kind]["count"] = count
                counted["fail"]["count"] = 0
            body = json.dumps(stats).encode()
        self.transport.write(_OK % (b"application/json", len(body), b"") + body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", action="append", default=[], help="name=path.onnx")
    parser.add_argument("--threads", action="append", default=[],
                        help="name=N: the model's intra-op threads (default 1)")
    parser.add_argument("--replies", type=Path, required=True, help="JSON: GET path -> body")
    args = parser.parse_args()
    threads = {name: int(n) for name, n in (t.split("=", 1) for t in args.threads)}
    models = {name: Model(name, path, threads.get(name, 1))
              for name, path in (m.split("=", 1) for m in args.model)}
    replies = {k: v.encode() for k, v in json.loads(args.replies.read_text()).items()}
    floor = Floor(models, replies)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Connection(floor), "127.0.0.1", args.port)
        await server.serve_forever()

    import uvloop

    uvloop.run(serve())


def capture_replies(edged_url: str, models: list[str]) -> dict[str, str]:
    """edged's answers to what perf_analyzer asks before it sends load (server and model
    metadata, model config)."""
    paths = ["/v2", "/v2/models/stats"]
    paths += [p for m in models for p in (f"/v2/models/{m}", f"/v2/models/{m}/config",
                                         f"/v2/models/{m}/stats")]
    replies = {}
    for path in paths:
        with urllib.request.urlopen(f"http://{edged_url}{path}", timeout=10) as resp:
            replies[path] = resp.read().decode()
    return replies


@contextmanager
def run_floor(workdir: Path, port: int, models: dict[str, Path], replies: dict[str, str],
              threads: dict[str, int], *, prefix: list[str] | None = None,
              ready_s: float = 60) -> Iterator[subprocess.Popen[bytes]]:
    """The floor server as a subprocess on 127.0.0.1:`port`, once it answers (within
    `ready_s`); each model's session with the intra-op threads edged chose for it. `prefix`
    runs it under another program (the instructions bench's valgrind)."""
    from tools.bench.broker import stop_process

    (workdir / "floor-replies.json").write_text(json.dumps(replies))
    cmd = [*(prefix or []), sys.executable, "-m", "tools.bench.floor", "--port", str(port),
           "--replies", str(workdir / "floor-replies.json")]
    cmd += [arg for name, path in models.items() for arg in ("--model", f"{name}={path}")]
    cmd += [arg for name, n in threads.items() for arg in ("--threads", f"{name}={n}")]
    log = (workdir / "floor.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + ready_s
        first = next(iter(models))
        while True:
            if proc.poll() is not None:
                log_text = (workdir / "floor.log").read_text()
                raise RuntimeError(f"the floor server exited: {log_text}")
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/v2/models/{first}/stats", timeout=10) as resp:
                    resp.read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the floor server did not answer in {ready_s:g} s"
                                       ) from None
                time.sleep(0.1)
        yield proc
    finally:
        stop_process(proc, 10)
        log.close()


if __name__ == "__main__":
    main()
