"""The shadow-rollout part of `edged bench ota`: what a candidate proving itself on 10% of live
requests costs serving, and how long a push takes to promotion.

`edged run` serves PP-OCR cls as a subprocess with a private mosquitto; closed-loop clients
call it over the socket without pause. Serving latency is measured in one run, in windows:
without a shadow, with a shadow run at `sample: 0.1` (a candidate that never reaches its
min_samples), and without again after the operator's signed `reject`. Then a second candidate
is pushed with `min_samples` small enough to finish under load, and the bench times push ->
shadowing -> promoted (active) by the daemon's own status events, with the shadow's sample
and skip counts from its retained progress topic.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edged.api.protocol import HEADER_LENGTH, encode_request
from edged.ops.keys import freshness
from edged.ops.push import serve
from edged.ota.manifest import sign_document
from tools.bench.api import edged_config, run_edged
from tools.bench.assets import PPOCR_CLS, ppocr_model
from tools.bench.core import CLS_YAML
from tools.bench.load import Sample, Target, http_request, one, sampled_loop
from tools.bench.ota import CONCURRENCY, StatusWatch, phase, variant

SAMPLE = 0.1


def run_shadow(workdir: Path, port: int, key: Any, *, quick: bool) -> dict[str, Any]:
    window_s, min_samples = (2.0, 50) if quick else (8.0, 300)
    case = workdir / "shadow"
    (case / "models" / "cls" / "1").mkdir(parents=True)
    (case / "artifacts").mkdir()
    source = ppocr_model(PPOCR_CLS)
    shutil.copyfile(source, case / "models" / "cls" / "1" / "model.onnx")
    (case / "models" / "cls" / "model.yaml").write_text(CLS_YAML)
    x = np.random.default_rng(0).random((1, 3, 48, 192), dtype=np.float32)
    parts, json_length = encode_request({"x": x}, [], binary=True)
    request = http_request("/v2/models/cls/infer", b"".join(parts),
                           {"Content-Type": "application/octet-stream",
                            HEADER_LENGTH: str(json_length)})
    prefix = "bench/ota-shadow/cls"
    config = edged_config(case, preload=["cls"],
                          mqtt=f"host: 127.0.0.1, port: {port}, prefix: {prefix}")
    config += f"ota: {{trusted_keys: [{workdir / 'fleet.pub'}], keep_versions: 3}}\n"
    watch = StatusWatch(port, f"{prefix}/ota/cls/status")
    try:
        with run_edged(case, config) as (sock, _):
            target = Target(unix=str(sock))
            one(target, request)
            cost = _cost(case, source, target, request, watch, prefix, key, window_s)
            promotion = _promotion(case, source, target, request, watch, prefix, key,
                                   min_samples, port)
    finally:
        watch.close()
    return {"sample": SAMPLE, "window_s": window_s, "cost": cost, "promotion": promotion}


def _manifest(case: Path, source: Path, version: int, prefix: str, key: Any,
              rollout: dict[str, Any]) -> tuple[Path, Callable[[str], bytes]]:
    """The candidate's artifact (the same network: it agrees) and its signed manifest, given
    the URL it is served at."""
    artifact = case / "artifacts" / f"cls-{version}.onnx"
    data = variant(source, artifact, version)

    def doc(url: str) -> bytes:
        return json.dumps(sign_document(
            {"model": "cls", "version": version, "format": "onnx",
             "artifact": {"url": url, "size": len(data),
                          "sha256": hashlib.sha256(data).hexdigest()},
             "rollout": rollout, **freshness(prefix)}, key)).encode()
    return artifact, doc


def _cost(case: Path, source: Path, target: Target, request: bytes, watch: StatusWatch,
          prefix: str, key: Any, window_s: float) -> dict[str, Any]:
    """Serving latency without, with, and again without a shadow at SAMPLE."""
    artifact, doc = _manifest(case, source, 2, prefix, key,
                              {"mode": "shadow", "sample": SAMPLE, "min_samples": 10_000_000,
                               "max_duration_s": 3600})
    stop = threading.Event()
    samples: list[Sample] = []
    load = threading.Thread(target=lambda: samples.extend(
        sampled_loop(target, request, concurrency=CONCURRENCY, stop=stop.is_set)))
    marks: dict[str, float] = {}
    with serve(artifact, "127.0.0.1:0", None) as url:
        load.start()
        try:
            marks["start"] = time.time()
            time.sleep(window_s)
            marks["pushed"] = time.time()
            watch.publish(f"{prefix}/ota/cls", doc(url))
            marks["shadowing"] = watch.until("shadowing", 2, 120)[-1]["ts"]
            time.sleep(window_s)
            marks["rejecting"] = time.time()
            command = sign_document({"model": "cls", "action": "reject", "version": 2,
                                     **freshness(prefix)}, key)
            watch.client.publish(f"{prefix}/ota/cls", b"", qos=1, retain=True)
            watch.client.publish(f"{prefix}/ota/cls/command", json.dumps(command).encode(),
                                 qos=1).wait_for_publish(10)
            marks["rejected"] = watch.until("failed", 2, 60)[-1]["ts"]
            time.sleep(window_s)
            marks["end"] = time.time()
        finally:
            stop.set()
            load.join(60)
    phases = {"without": phase(samples, marks["start"], marks["pushed"]),
              "with_shadow": phase(samples, marks["shadowing"], marks["rejecting"]),
              "without_after": phase(samples, marks["rejected"], marks["end"])}
    with_p99 = phases["with_shadow"].get("p99_ms")
    phases["p99_ratio"] = {p: with_p99 / phases[p]["p99_ms"] for p in ("without", "without_after")
                           if with_p99 is not None and phases[p].get("p99_ms")}
    return phases


def _promotion(case: Path, source: Path, target: Target, request: bytes, watch: StatusWatch,
               prefix: str, key: Any, min_samples: int, port: int) -> dict[str, Any]:
    """A candidate pushed under load, timed from the push to its promotion."""
    artifact, doc = _manifest(case, source, 3, prefix, key,
                              {"mode": "shadow", "sample": SAMPLE, "min_samples": min_samples,
                               "max_duration_s": 600})
    stop = threading.Event()
    samples: list[Sample] = []
    load = threading.Thread(target=lambda: samples.extend(
        sampled_loop(target, request, concurrency=CONCURRENCY, stop=stop.is_set)))
    with serve(artifact, "127.0.0.1:0", None) as url:
        load.start()
        try:
            time.sleep(0.5)
            pushed = time.time()
            watch.publish(f"{prefix}/ota/cls", doc(url))
            events = watch.until("active", 3, 600)
        finally:
            stop.set()
            load.join(60)
    at = {e["state"]: e["ts"] for e in events}
    progress = StatusWatch(port, f"{prefix}/ota/cls/shadow")
    try:
        final = progress.events.get(timeout=10)  # retained: the promoted run's last word
    finally:
        progress.close()
    return {"min_samples": min_samples, "pushed_to_shadowing_s": at["shadowing"] - pushed,
            "shadowing_to_promoted_s": at["active"] - at["shadowing"],
            "pushed_to_promoted_s": at["active"] - pushed,
            "requests": len(samples), "failed": sum(1 for s in samples if s.body is None),
            "shadow": {k: final.get(k) for k in ("state", "offered", "sampled", "runs",
                                                 "samples", "skipped")},
            "top1_agreement": final.get("metrics", {}).get("top1_agreement")}


def format_shadow(r: dict[str, Any]) -> str:
    cost, promo = r["cost"], r["promotion"]
    lines = [f"shadow rollout of cls at sample {r['sample']:.0%} ({r['window_s']:g} s windows):",
             "", "| serving | requests | failed | p50 (ms) | p99 (ms) |", "|---|---|---|---|---|"]
    for name in ("without", "with_shadow", "without_after"):
        row = cost[name]
        lines.append(f"| {name.replace('_', ' ')} | {row['requests']} | {row['failed']} | "
                     f"{row.get('p50_ms', float('nan')):.2f} | "
                     f"{row.get('p99_ms', float('nan')):.2f} |")
    ratios = cost["p99_ratio"]
    if ratios:
        lines.append("\np99 with a shadow / without: " + ", ".join(
            f"{v:.3f} (vs {k.replace('_', ' ')})" for k, v in ratios.items())
            + " (goal: within 1.10)")
    shadow = promo["shadow"]
    lines += ["", "| push -> shadowing (s) | shadowing -> promoted (s) | push -> promoted (s) | "
              "min_samples | offered / sampled / skipped | requests (failed) |",
              "|---|---|---|---|---|---|",
              f"| {promo['pushed_to_shadowing_s']:.2f} | {promo['shadowing_to_promoted_s']:.2f} "
              f"| {promo['pushed_to_promoted_s']:.2f} | {promo['min_samples']} | "
              f"{shadow['offered']} / {shadow['sampled']} / {shadow['skipped']} | "
              f"{promo['requests']} ({promo['failed']}) |"]
    return "\n".join(lines)
