"""The daemon end to end on the GPU: `edged run` (a subprocess, as systemd starts it) with the
provider chain TensorRT EP → CUDA EP → CPU EP and the default memory strategy, serving the
`grid_det` detector to

  stream events  a video of coloured squares crossing the frame (tools/assets/demo.py), whose
                 objects' lives, counts and line crossings reach a real mosquitto;
  shm requests   socket clients on four threads whose inputs and outputs stay in POSIX shared
                 memory (KServe v2 system shared memory), each answer against the CPU EP;
  ota swap       a signed update (a new version of the same network) pushed over MQTT while
                 socket clients keep sending: no request may fail, and after `active` the new
                 version answers, on the same provider;
  gpu metrics    the GPU's memory in `edged status` and on /metrics (NVML).

Where CUDA is not (the dry run here) the same runs on the CPU EP and each row says so;
`require_cuda` makes that a failure. Without mosquitto the MQTT rows are skipped, saying why."""

from __future__ import annotations

import hashlib
import json
import queue
import re
import shutil
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import HEADER_LENGTH, RequestedOutput, ShmRef, encode_request
from edged.ops.client import EdgedClient, SharedRegion
from tools.gpu_check.report import CUDA_EP, TOLERANCES, Report, close_enough

SECTION = "daemon"
MODEL = "grid_det"
FPS, GAP = 10.0, 8  # 0.8 s without the object: longer than max_age_s, so each one ends
ZONE = "{name: right, polygon: [[128, 0], [256, 0], [256, 256], [128, 256]]}"
LINE = "{name: middle, points: [[128, 256], [128, 0]]}"
SHM_THREADS, SHM_REQUESTS = 4, 16  # per thread
OTA_CLIENTS = 4
BOXES_AT, SCORES_AT = 1 << 18, (1 << 18) + 4096  # output offsets in a thread's region
NEW_VERSION = re.compile(rb'"model_version":\s*"2"')


class Collector:
    """A real paho subscriber on the daemon's prefix, keeping every message in order."""

    def __init__(self, port: int, prefix: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.got: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        subscribed: queue.Queue[bool] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id=f"gpucheck-{port}")
        self.client.on_message = lambda c, u, m: self._keep(m.topic, bytes(m.payload))
        self.client.on_subscribe = lambda *a: subscribed.put(True)
        self.client.on_connect = lambda c, *a: c.subscribe(f"{prefix}/#", 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        subscribed.get(timeout=10)

    def _keep(self, topic: str, payload: bytes) -> None:
        with self._lock:
            self.got.append((topic, payload))

    def wait(self, done: Callable[[list[tuple[str, bytes]]], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if done(list(self.got)):
                    return True
            time.sleep(0.05)
        return False

    def messages(self) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self.got)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def config_text(work: Path, video: Path, port: int | None, prefix: str, key: Path,
                memory: str) -> str:
    mqtt = (f"host: 127.0.0.1, port: {port}, prefix: {prefix}, stats_interval_s: 1"
            if port else "enabled: false")
    stream = (f"{{name: crossing, source: 'file://{video}', model: {MODEL}, loop: true, "
              f"backpressure: block, labels: [red, green, blue], track: {{max_age_s: 0.5}}, "
              f"zones: [{ZONE}], lines: [{LINE}]}}")
    return f"""device_id: gpucheck
models_dir: {work / 'models'}
cache: {{dir: {work / 'cache'}, preload: [{MODEL}]}}
backends: {{onnxruntime: {{providers: [tensorrt, cuda, cpu]}}, memory: {memory}}}
api: {{socket: {work / 's.sock'}}}
mqtt: {{{mqtt}}}
streams: [{stream}]
ota: {{trusted_keys: [{key}], keep_versions: 2}}
logging: {{level: info}}
"""


def section_daemon(report: Report, work: Path, *, require_cuda: bool, memory: str = "auto",
                   log_copy: Path | None = None) -> None:
    """Every row of the end-to-end check (see the module's docstring)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from tools.assets import demo as demo_assets
    from tools.assets import models as test_models
    from tools.bench.api import run_edged
    from tools.bench.broker import loopback_broker

    work.mkdir(parents=True, exist_ok=True)
    test_models.write_repository(work / "models", names=[MODEL])
    video = demo_assets.write_crossing_video(work / "crossing.avi", fps=FPS, gap_frames=GAP)
    key = Ed25519PrivateKey.generate()
    (work / "ota.pub").write_bytes(key.public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    prefix = "gpucheck/e2e"
    with ExitStack() as stack:
        try:
            port: int | None = stack.enter_context(loopback_broker(work / "broker"))[0]
            no_broker = None
        except RuntimeError as exc:
            port, no_broker = None, str(exc)
        collector = Collector(port, prefix) if port else None
        if collector is not None:
            stack.callback(collector.close)
        if log_copy is not None:
            stack.callback(_copy_log, work / "edged.log", log_copy)
        try:
            sock, _ = stack.enter_context(run_edged(work, config_text(
                work, video, port, prefix, work / "ota.pub", memory)))
        except Exception as exc:  # the daemon did not start: say why, with its log's end
            report.add(SECTION, "edged run", False, f"{type(exc).__name__}: {exc}"[:300] +
                       " | log: " + _tail(work / "edged.log"))
            return
        ctx = E2E(report, work, sock, require_cuda)
        report.guard(SECTION, "edged run", ctx.started)
        if collector is None or port is None:
            for check in ("stream events", "ota swap"):
                report.skip(SECTION, check, f"no MQTT broker: {no_broker}")
        else:
            report.guard(SECTION, "stream events", lambda: ctx.events(collector, prefix))
        report.guard(SECTION, "shm requests", ctx.shm_requests)
        if collector is not None and port is not None:
            report.guard(SECTION, "ota swap", lambda: ctx.ota_swap(port, prefix, key))
        report.guard(SECTION, "gpu metrics", ctx.gpu_metrics)


def _copy_log(log: Path, to: Path) -> None:
    if log.exists():
        to.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log, to)


def _tail(path: Path, chars: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].replace("\n", " / ")
    except OSError:
        return "(no log)"


class E2E:
    def __init__(self, report: Report, work: Path, sock: Path, require_cuda: bool) -> None:
        self.report, self.work, self.sock, self.require_cuda = report, work, sock, require_cuda
        self.providers: list[str] = []

    def where(self) -> tuple[bool, str]:
        """Whether the model runs where this check needs it, and the words for the row."""
        on_cuda = bool(self.providers) and self.providers[0] == CUDA_EP
        if on_cuda:
            return True, f"on {CUDA_EP}"
        ran = self.providers[0] if self.providers else "nothing"
        return not self.require_cuda, f"on {ran} (the CPU fallback: no CUDA EP here)"

    def model_row(self, client: EdgedClient, version: int | None = None) -> dict[str, Any]:
        rows = [m for m in client.status()["models"] if m["name"] == MODEL
                and m["state"] == "READY" and (version is None or m["version"] == version)]
        if not rows:
            raise RuntimeError(f"{MODEL} (version {version}) is not READY: "
                               f"{client.status()['models']}")
        return rows[-1]

    def started(self) -> None:
        with EdgedClient(self.sock, timeout_s=30) as client:
            row = self.model_row(client)
        self.providers = list(row["providers"])
        where_ok, where = self.where()
        log = (self.work / "edged.log").read_text(errors="replace")
        trt = ("dropped at load (its libraries are missing)"
               if "TensorrtExecutionProvider failed" in log else "not in the chain here")
        self.report.add(SECTION, "edged run", where_ok,
                        f"{MODEL} v{row['version']} READY {where} ({row['precision']}, device "
                        f"{row['device']}); TensorRT EP {trt}", providers=self.providers)

    def events(self, collector: Collector, prefix: str) -> None:
        def ended(got: list[tuple[str, bytes]]) -> bool:
            return len([1 for t, p in got if t == f"{prefix}/events"
                        and json.loads(p)["type"] == "end"]) >= 3

        arrived = collector.wait(ended, 60)
        got = collector.messages()
        events = [json.loads(p) for t, p in got if t == f"{prefix}/events"]
        first: list[dict[str, Any]] = []
        for event in events:  # the video loops: the first three objects' lives
            first.append(event)
            if sum(e["type"] == "end" for e in first) == 3:
                break
        lives: dict[str, list[dict[str, Any]]] = {}
        for event in first:
            lives.setdefault(event["after"]["label"], []).append(event)
        problems = [] if arrived else ["fewer than three objects ended in 60 s"]
        if set(lives) != {"red", "green", "blue"}:
            problems.append(f"labels {sorted(lives)}")
        for label, life in lives.items():
            if len({e["after"]["id"] for e in life}) != 1:
                problems.append(f"{label}: several ids")
            if life[0]["type"] != "new" or life[-1]["type"] != "end":
                problems.append(f"{label}: {[e['type'] for e in life]}")
        lines = [json.loads(p) for t, p in got
                 if t == f"{prefix}/streams/crossing/lines/middle"]
        last = lines[-1] if lines else {}
        crossed = {k: last.get(k, {}) for k in ("red", "blue", "green")}
        if not (crossed["red"].get("in", 0) >= 1 and crossed["blue"].get("out", 0) >= 1
                and crossed["green"].get("in", 0) >= 1):
            problems.append(f"line counts {last}")
        where_ok, where = self.where()
        self.report.add(SECTION, "stream events", where_ok and not problems,
                        "; ".join(problems) or
                        f"3 objects (red, blue, green), one id each, new..end; line {last}; "
                        f"{len(events)} events on {prefix}/events, {where}",
                        events=len(events))

    def shm_requests(self) -> None:
        import onnxruntime as ort

        model_file = next((self.work / "models" / MODEL).glob("*/model.onnx"))
        cpu = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(7)
        frames = [rng.random((rows, 3, 64, 64), dtype=np.float32) for rows in (1, 2, 1, 4)]
        failures: list[str] = []
        done = [0]
        lock = threading.Lock()

        def client_thread(index: int) -> None:
            key = f"edged-gpucheck-{index}-{threading.get_native_id()}"
            size = 1 << 19  # inputs from 0 (at most 4 frames: 192 KiB), outputs from 256 KiB
            with SharedRegion(key, size) as region, \
                    EdgedClient(self.sock, timeout_s=30) as client:
                client.register_shm(f"in{index}", key, size)
                try:
                    for i in range(SHM_REQUESTS):
                        x = frames[(index + i) % len(frames)]
                        rows = x.shape[0]
                        tensor = region.tensor(f"in{index}", x, 0)
                        outs = [RequestedOutput("boxes", shm=ShmRef(
                                    f"in{index}", BOXES_AT, rows * 16 * 4 * 4)),
                                RequestedOutput("scores", shm=ShmRef(
                                    f"in{index}", SCORES_AT, rows * 16 * 3 * 4))]
                        client.infer(MODEL, {"image": tensor}, outputs=outs)
                        got = {"boxes": region.read("FP32", (rows, 16, 4), BOXES_AT),
                               "scores": region.read("FP32", (rows, 16, 3), SCORES_AT)}
                        want = dict(zip(["boxes", "scores"], cpu.run(["boxes", "scores"],
                                                                    {"image": x}), strict=True))
                        ok, detail, _ = close_enough(want, got, TOLERANCES["ort-cuda"])
                        with lock:
                            done[0] += 1
                            if not ok:
                                failures.append(f"thread {index} #{i}: {detail}")
                finally:
                    client.unregister_shm(f"in{index}")

        errors: list[str] = []

        def run(index: int) -> None:
            try:
                client_thread(index)
            except Exception as exc:  # reported in the row
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=run, args=(i,)) for i in range(SHM_THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        where_ok, where = self.where()
        wrong = errors + failures
        self.report.add(SECTION, "shm requests", where_ok and not wrong and
                        done[0] == SHM_THREADS * SHM_REQUESTS,
                        "; ".join(wrong[:3]) or
                        f"{done[0]} requests from {SHM_THREADS} threads, inputs and outputs in "
                        f"system shared memory, all equal to the CPU EP, {where}",
                        requests=done[0])

    def ota_swap(self, port: int, prefix: str, key: Any) -> None:
        from edged.ops.keys import freshness
        from edged.ops.push import serve
        from edged.ota.manifest import sign_document
        from tools.bench.load import Sample, Target, http_request, sampled_loop
        from tools.bench.ota import StatusWatch, variant

        source = next((self.work / "models" / MODEL).glob("*/model.onnx"))
        artifact = self.work / "grid_det-2.onnx"
        data = variant(source, artifact, 2)
        x = np.random.default_rng(3).random((1, 3, 64, 64), dtype=np.float32)
        parts, json_length = encode_request({"image": x}, [], binary=True)
        request = http_request(f"/v2/models/{MODEL}/infer", b"".join(parts),
                               {"Content-Type": "application/octet-stream",
                                HEADER_LENGTH: str(json_length)})
        watch = StatusWatch(port, f"{prefix}/ota/{MODEL}/status")
        stop = threading.Event()
        samples: list[Sample] = []
        load = threading.Thread(target=lambda: samples.extend(sampled_loop(
            Target(unix=str(self.sock)), request, concurrency=OTA_CLIENTS, stop=stop.is_set)))
        try:
            with serve(artifact, "127.0.0.1:0", None) as url:
                doc = sign_document({"model": MODEL, "version": 2, "format": "onnx",
                                     "artifact": {"url": url, "size": len(data),
                                                  "sha256": hashlib.sha256(data).hexdigest()},
                                     **freshness(prefix)}, key)
                load.start()
                time.sleep(0.5)  # the clients get going before the update comes
                watch.publish(f"{prefix}/ota/{MODEL}", json.dumps(doc).encode())
                events = watch.until("active", 2, 90)
                active = next(e["ts"] for e in events if e["state"] == "active")
                time.sleep(0.5)  # answers after `active` must all be the new version's
        finally:
            stop.set()
            load.join(60)
            watch.close()
        failed = sum(1 for s in samples if s.body is None)
        late = sum(1 for s in samples if s.body is not None and s.end > active + 0.05
                   and not NEW_VERSION.search(s.body))
        with EdgedClient(self.sock, timeout_s=30) as client:
            row = self.model_row(client, 2)
        self.providers = list(row["providers"])
        where_ok, where = self.where()
        self.report.add(SECTION, "ota swap", where_ok and failed == 0 and late == 0 and
                        len(samples) > 0,
                        f"{len(samples)} requests from {OTA_CLIENTS} clients across the swap, "
                        f"{failed} failed, {late} answered by version 1 after active; "
                        f"version 2 READY {where}",
                        requests=len(samples), failed=failed, old_after_active=late)

    def gpu_metrics(self) -> None:
        with EdgedClient(self.sock, timeout_s=30) as client:
            gpus = client.status()["gpus"]
            metrics = client.metrics()
        if not gpus and not self.require_cuda and self.providers[:1] != [CUDA_EP]:
            self.report.skip(SECTION, "gpu metrics", "no GPU metrics here (no NVML, or no GPU)")
            return
        line = next((m for m in metrics.splitlines()
                     if m.startswith("edged_gpu_memory_used_bytes{")), "")
        self.report.add(SECTION, "gpu metrics", bool(gpus) and bool(line),
                        f"status: {gpus[:1]}; /metrics: {line or 'no edged_gpu_* lines'}")

