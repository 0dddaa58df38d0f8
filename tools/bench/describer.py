"""`python -m tools.bench describer`: what event descriptions cost the frame path, and what a
description costs the local model, in one run.

(a) The stream's side: `EventsStage.frame` per frame (tracking, zones, lines, snapshots on a
    textured 1920x1080 frame) with `describe` off and on, rounds alternating, at 5 and 50
    wandering objects; on, the stage records each object's path and hands each ended object
    to a real `Describer` whose endpoint is a closed port (every description fails fast and
    is counted). Timed: the stream thread's own CPU time (`time.thread_time`), which is what
    "off the frame path" promises; the describer's queue is drained between passes, untimed.
    Then `Describer.submit` alone: µs per ended object queued (the stream thread's whole
    share of a description).
(b) The describer's side: SmolLM2-135M (the corpus's GGUF) through edged's cache and
    generation queue, as `describer.model` asks it: seconds per description of distinct
    events (p50, max), how many answers fit the schema at the first try, then the same
    events again (cache hits: no model call).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import BackendOptions
from edged.describer.askers import EndpointAsker, LocalAsker
from edged.describer.config import DescriberConfig, EndpointConfig, StreamDescribeConfig
from edged.describer.prompt import Subject
from edged.describer.service import Describer
from edged.events.publish import EventPublisher
from edged.inference.cache import ModelCache
from edged.inference.generation import Generations
from edged.model.repository import ModelRepository
from edged.processing.detections import Detections
from edged.streams.config import StreamConfig
from edged.streams.events_stage import EventsStage
from tools.bench.events import engine_settings
from tools.bench.scenes import walkers
from tools.real_models import LANGUAGE_MODEL, ensure

ON = StreamDescribeConfig(enabled=True, per_minute=6000, burst=1000)
CLOSED = "http://127.0.0.1:9/v1"  # discard's port: nothing listens there on a dev box


def stage_config(width: int, height: int, describe: bool) -> StreamConfig:
    settings = engine_settings(width, height, snapshots=True)
    return StreamConfig(name="bench", source="file:///bench.avi", model="det",
                        zones=settings.zones, lines=settings.lines,
                        snapshots=settings.snapshots,
                        describe=ON if describe else StreamDescribeConfig())


def frame_ms(n: int, frames: int, describe: bool, describer: Describer) -> float:
    """The stream thread's CPU ms per frame of one pass of the scene through a fresh stage."""
    scene = walkers(np.random.default_rng(n), n, frames=frames)
    ys, xs = np.mgrid[0:scene.height, 0:scene.width]
    picture = np.dstack([(xs * 7 + ys * 3) % 256, (xs ^ ys) % 256, (ys * 5) % 256]
                        ).astype(np.uint8)
    detections = [Detections.from_rows(d for _i, d in frame) for frame in scene.frames]
    stage = EventsStage(stage_config(scene.width, scene.height, describe),
                        EventPublisher("bench", None, None), describe=describer.submit)
    start = time.thread_time()
    for f, dets in enumerate(detections):
        stage.frame(1_700_000_000 + f / scene.fps, dets, picture)
    stage.close()  # every object ends: each handed to the describer when on
    spent = time.thread_time() - start
    wait(lambda: describer.statistics()["queued"] == 0 and not describer.busy)
    return spent / frames * 1e3


def stream_rows(quick: bool) -> list[dict[str, Any]]:
    describer = Describer(EndpointAsker(EndpointConfig(url=CLOSED, model="none"),
                                        max_tokens=64, temperature=0.0),
                          DescriberConfig(queue=10_000), publish=lambda i, p: None,
                          keep=lambda i, r: None)
    rows = []
    try:
        for n in (5, 50):
            frames = 60 if quick else 300
            frame_ms(n, 20, True, describer)  # warm: imports, caches
            off, on = [], []
            for _round in range(2 if quick else 5):
                off.append(frame_ms(n, frames, False, describer))
                on.append(frame_ms(n, frames, True, describer))
            rows.append({"objects": n, "frames": frames, "off_ms": statistics.median(off),
                         "on_ms": statistics.median(on),
                         "ratio": statistics.median(on) / statistics.median(off)})
        submit = submit_us(describer, 2000 if quick else 20000)
    finally:
        describer.close(5.0)
    return [*rows, {"submit_us": submit, "endpoint_errors":
                    describer.statistics()["endpoint_errors"]}]


def submit_us(describer: Describer, count: int) -> float:
    subjects = [Subject(f"1.000-bench-{i}", "bench", {"label": "person", "start_time": 0.0,
                                                       "end_time": 5.0}, b"\xff\xd8",
                        tuple((t * 0.5, 10.0 * t, 20.0) for t in range(16)))
                for i in range(count)]
    start = time.perf_counter()
    for subject in subjects:
        describer.submit(subject, ON)
    return (time.perf_counter() - start) / count * 1e6


def local_rows(tmp: Path, quick: bool) -> dict[str, Any]:
    models = tmp / "models"
    (models / "smol" / "1").mkdir(parents=True)
    (models / "smol" / "1" / "model.gguf").symlink_to(ensure() / LANGUAGE_MODEL)
    (models / "smol" / "model.yaml").write_text("llm: {context: 1024, threads: 1}\n")
    cache = ModelCache(ModelRepository(models), budget_bytes=1 << 30,
                       options=BackendOptions(cache_dir=tmp / "cache"))
    generations = Generations(cache)
    done: list[dict[str, Any]] = []
    config = DescriberConfig(model="smol", timeout_s=300, queue=100)  # max_tokens 400
    describer = Describer(LocalAsker(generations, cache, "smol", max_tokens=config.max_tokens,
                                     temperature=config.temperature), config,
                          publish=lambda i, p: None,
                          keep=lambda i, r: done.append(r))
    labels = ["person", "car", "dog", "bicycle", "person", "car"]
    events = [Subject(f"1.000-door-{i}", "door", {
        "label": labels[i % len(labels)], "top_score": 0.8, "start_time": 1718000000.0 + i,
        "end_time": 1718000004.0 + 3 * i, "entered_zones": ["drive"] if i % 2 else [],
        "box": [100, 100, 200, 300]}, None, ((0.0, 150.0, 300.0), (2.0, 400.0 + i, 310.0)))
        for i in range(3 if quick else 8)]
    retried = _Retries()
    service_log = logging.getLogger("edged.describer.service")
    service_log.addHandler(retried)
    level, service_log.level = service_log.level, logging.INFO
    try:
        cache.acquire("smol").release()  # loaded and warm before timing
        for subject in events:
            describer.submit(subject, ON)
        wait(lambda: len(done) >= len(events))
        cold = [r for r in done]
        for subject in events:  # the same events again: from the cache
            describer.submit(dataclasses.replace(subject, object_id=subject.object_id + "b"),
                             ON)
        wait(lambda: len(done) >= 2 * len(events))
        hits = done[len(events):]
    finally:
        service_log.removeHandler(retried)
        service_log.setLevel(level)
        describer.close(10.0)
        generations.close()
        cache.close(timeout_s=10)
    seconds = [r["duration_s"] for r in cold if r["state"] == "described"]
    return {"events": len(events), "described": len(seconds),
            "first_try": sum(r.get("attempts") == 1 for r in cold),
            "why_retried": retried.why,
            "failed": [r.get("reason") for r in cold if r["state"] != "described"],
            "p50_s": statistics.median(seconds) if seconds else None,
            "max_s": max(seconds) if seconds else None,
            "cache_hits": sum(bool(r.get("cached")) for r in hits),
            "hit_max_ms": max((r["duration_s"] * 1e3 for r in hits if r.get("cached")),
                              default=None),
            "stats": describer.statistics()}


class _Retries(logging.Handler):
    """Why an answer was asked again (the describer says so at INFO)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.why: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "does not fit the schema" in record.msg:
            self.why.append(str(record.args[1]) if isinstance(record.args, tuple) else "")


def wait(predicate: Any, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("the describer did not finish in time")
        time.sleep(0.05)


def run_bench(tmp: Path, *, quick: bool) -> dict[str, Any]:
    return {"stream": stream_rows(quick), "local": local_rows(tmp, quick)}


def format_table(results: dict[str, Any]) -> str:
    rows, submit = results["stream"][:-1], results["stream"][-1]
    out = ["(a) EventsStage.frame, the stream thread's CPU ms per frame (snapshots on, 2 zones, "
           "2 lines), describe off vs on",
           f"{'objects':>8}{'frames':>8}{'off ms':>9}{'on ms':>9}{'on/off':>8}"]
    for row in rows:
        out.append(f"{row['objects']:>8}{row['frames']:>8}{row['off_ms']:>9.3f}"
                   f"{row['on_ms']:>9.3f}{row['ratio']:>8.3f}")
    out.append(f"Describer.submit: {submit['submit_us']:.2f} µs per ended object "
               f"({submit['endpoint_errors']} descriptions failed fast on the closed port)")
    local = results["local"]
    out += ["", "(b) SmolLM2-135M as describer.model (1 thread, grammar-held JSON)",
            f"distinct events {local['events']}: described {local['described']}, "
            f"fit at the first try {local['first_try']}, failed {local['failed']}",
            f"asked again because: {local['why_retried'] or 'none was'}",
            f"seconds per description: p50 {_num(local['p50_s'])}, max {_num(local['max_s'])}",
            f"the same events again: {local['cache_hits']} cache hits, slowest "
            f"{_num(local['hit_max_ms'])} ms (the payload's duration_s, to the ms)"]
    return "\n".join(out)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
