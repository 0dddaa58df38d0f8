"""`edged bench ota`: a model update under load.

`edged run` serves PP-OCR cls (model `cls`) as a subprocess, with a private mosquitto and a
trusted key of the bench's own. Closed-loop clients call it over the socket API without pause
while the bench pushes signed updates (each a new version of the same network, so outputs
stay comparable) from an HTTP artifact server on 127.0.0.1, the way `edged ota push --serve`
does. Every answer is kept with its time and model_version, so the table shows latency p50/p99
before, during (manifest received to active) and after each swap, failed requests, and how
long each step of the update took by the daemon's own status events. A shadow rollout's cost
to serving (p50/p99 with and without a shadow at 10% sampling) and its push-to-promotion time
follow (tools/bench/ota_shadow.py).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import HEADER_LENGTH, encode_request
from edged.ops.keys import freshness
from edged.ops.push import serve
from edged.ota.manifest import sign_document
from tools.bench.api import THREADS, edged_config, run_edged
from tools.bench.assets import PPOCR_CLS, PPOCR_DET, ppocr_model
from tools.bench.broker import loopback_broker
from tools.bench.core import CLS_YAML, DET_YAML, Latency
from tools.bench.load import Sample, Target, http_request, one, sampled_loop

CONCURRENCY = 4
# (model, file, model.yaml, request shape): a small and a larger model, as fleets have
CASES = (("cls", PPOCR_CLS, CLS_YAML, (1, 3, 48, 192)),
         ("det", PPOCR_DET, DET_YAML, (1, 3, 320, 320)))
_VERSION = re.compile(rb'"model_version":\s*"(\d+)"')
STEPS = ("received", "verifying", "installing", "warming", "active")


def variant(source: Path, dest: Path, version: int) -> bytes:
    """The same network with another doc_string: a new artifact (sha256) of equal cost."""
    import onnx

    model = onnx.load(str(source))
    model.doc_string = f"edged bench ota, version {version}"
    data = model.SerializeToString()
    dest.write_bytes(data)
    return data


class StatusWatch:
    """The daemon's OTA status events, as they arrive."""

    def __init__(self, port: int, topic: str) -> None:
        import paho.mqtt.client as paho
        from paho.mqtt.enums import CallbackAPIVersion

        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="bench-ota-watch")
        subscribed: queue.Queue[bool] = queue.Queue()
        self.client.on_message = lambda c, u, m: self.events.put(
            {**json.loads(m.payload), "seen": time.time()})
        self.client.on_subscribe = lambda *a: subscribed.put(True)
        self.client.on_connect = lambda c, *a: c.subscribe(topic, 1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        subscribed.get(timeout=10)

    def until(self, state: str, version: int, timeout_s: float) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while not got or got[-1]["state"] not in (state, "failed"):
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event.get("version") == version:
                got.append(event)
        if got[-1]["state"] != state:
            raise RuntimeError(f"the update to version {version} failed: {got[-1]}")
        return got

    def publish(self, topic: str, payload: bytes) -> None:
        """Retained, as a fleet operator would: it reaches the daemon even if its
        subscription is still being set up."""
        self.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(10)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def phase(samples: list[Sample], start: float, end: float) -> dict[str, Any]:
    inside = [s for s in samples if start <= s.end < end]
    ok = [s.latency_s for s in inside if s.body is not None]
    row: dict[str, Any] = {"requests": len(inside), "failed": len(inside) - len(ok),
                           "seconds": end - start}
    if ok:
        row.update(Latency.of(ok).__dict__)
    return row


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    key = Ed25519PrivateKey.generate()
    (workdir / "fleet.pub").write_bytes(key.public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    updates, window_s = (1, 1.5) if quick else (3, 5.0)
    cases = []
    with loopback_broker(workdir / "broker") as (port, broker):
        for name, filename, yaml, shape in CASES:
            case = workdir / name
            (case / "models" / name / "1").mkdir(parents=True)
            (case / "artifacts").mkdir()
            source = ppocr_model(filename)
            shutil.copyfile(source, case / "models" / name / "1" / "model.onnx")
            (case / "models" / name / "model.yaml").write_text(yaml)
            x = np.random.default_rng(0).random(shape, dtype=np.float32)
            parts, json_length = encode_request({"x": x}, [], binary=True)
            request = http_request(f"/v2/models/{name}/infer", b"".join(parts),
                                   {"Content-Type": "application/octet-stream",
                                    HEADER_LENGTH: str(json_length)})
            prefix = f"bench/ota/{name}"
            config = edged_config(case, preload=[name],
                                  mqtt=f"host: 127.0.0.1, port: {port}, prefix: {prefix}")
            config += f"ota: {{trusted_keys: [{workdir / 'fleet.pub'}], keep_versions: 2}}\n"
            watch = StatusWatch(port, f"{prefix}/ota/{name}/status")
            rounds = []
            try:
                with run_edged(case, config) as (sock, _):
                    target = Target(unix=str(sock))
                    one(target, request)
                    for version in range(2, 2 + updates):
                        rounds.append(update_round(case, name, source, target, request, watch,
                                                   prefix, version, key, window_s))
            finally:
                watch.close()
            cases.append({"model": name, "file": filename, "input": list(shape),
                          "artifact_bytes": source.stat().st_size, "rounds": rounds})
        from tools.bench.ota_shadow import run_shadow

        shadow = run_shadow(workdir, port, key, quick=quick)
    return {"setup": f"ORT CPU, {THREADS} intra-op threads, {CONCURRENCY} closed-loop clients "
                     "over the socket, binary tensors",
            "broker": broker, "cases": cases, "shadow": shadow}


def update_round(workdir: Path, name: str, source: Path, target: Target, request: bytes,
                 watch: StatusWatch, prefix: str, version: int, key: Any,
                 window_s: float) -> dict[str, Any]:
    artifact = workdir / "artifacts" / f"{name}-{version}.onnx"
    data = variant(source, artifact, version)
    stop = threading.Event()
    samples: list[Sample] = []
    load = threading.Thread(target=lambda: samples.extend(
        sampled_loop(target, request, concurrency=CONCURRENCY, stop=stop.is_set)))
    with serve(artifact, "127.0.0.1:0", None) as url:
        doc = sign_document({"model": name, "version": version, "format": "onnx",
                             "artifact": {"url": url, "size": len(data),
                                          "sha256": hashlib.sha256(data).hexdigest()},
                             **freshness(prefix)}, key)
        load.start()
        try:
            time.sleep(window_s)
            pushed = time.time()
            watch.publish(f"{prefix}/ota/{name}", json.dumps(doc).encode())
            events = watch.until("active", version, 120)
            time.sleep(window_s)
        finally:
            stop.set()
            load.join(60)
    at = {e["state"]: e["ts"] for e in events if e["state"] in STEPS}
    received, active = at["received"], at["active"]
    start = min(s.end for s in samples)
    end = max(s.end for s in samples)
    versions = [_version_of(s.body) for s in samples if s.body is not None]
    late_old = sum(1 for s in samples if s.body is not None and s.end > active + 0.05
                   and _version_of(s.body) != version)
    return {"version": version,
            "before": phase(samples, start, received),
            "during": phase(samples, received, active),
            "after": phase(samples, active, end + 1e-6),
            "received_to_active_s": active - received,
            "published_to_active_s": active - pushed,
            "steps_s": {f"{a}->{b}": at[b] - at[a] for a, b in itertools.pairwise(STEPS)
                        if a in at and b in at},
            "answers_by_version": {str(v): versions.count(v) for v in sorted(set(versions))},
            "old_version_after_active": late_old}


def _version_of(body: bytes | None) -> int:
    match = _VERSION.search(body or b"")
    return int(match.group(1)) if match else 0


def format_table(r: dict[str, Any]) -> str:
    lines = [r["setup"], "", "| model | update | phase | requests | failed | p50 (ms) | "
             "p99 (ms) |", "|---|---|---|---|---|---|---|"]
    for case in r["cases"]:
        for rnd in case["rounds"]:
            for name in ("before", "during", "after"):
                row = rnd[name]
                lines.append(f"| {case['model']} | v{rnd['version'] - 1}->v{rnd['version']} | "
                             f"{name} ({row['seconds']:.2f} s) | {row['requests']} | "
                             f"{row['failed']} | {row.get('p50_ms', float('nan')):.2f} | "
                             f"{row.get('p99_ms', float('nan')):.2f} |")
    lines += ["", "| model | update | received->active (s) | published->active (s) | "
              "download / verify / install / warm+swap (s) | answers by version |",
              "|---|---|---|---|---|---|"]
    for case in r["cases"]:
        for rnd in case["rounds"]:
            steps = " / ".join(f"{v:.3f}" for v in rnd["steps_s"].values())
            lines.append(f"| {case['model']} ({case['artifact_bytes'] / 1e6:.2f} MB) | "
                         f"v{rnd['version']} | {rnd['received_to_active_s']:.3f} | "
                         f"{rnd['published_to_active_s']:.3f} | {steps} | "
                         f"{rnd['answers_by_version']} |")
    if "shadow" in r:
        from tools.bench.ota_shadow import format_shadow

        lines += ["", format_shadow(r["shadow"])]
    return "\n".join(lines)
