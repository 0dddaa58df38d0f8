"""`python -m tools.bench events`: what tracking costs and how well it keeps ids.

(a) The matcher: edged's (optimal, solved per cluster of conflicting pairs in plain Python),
    greedy (best pair first), scipy's `linear_sum_assignment` and `lap.lapjv` (each only if
    installed: neither is an edged dependency), on the same recorded similarity matrices of 5
    and 50 objects (µs per call), and inside the same tracker on crossing scenes of 2 to 12
    objects (id changes: a true object's detection given another announced track than the
    frame before; fewer is better).
(b) The engine: `StreamEvents.update` per frame at 5 and 50 objects wandering through two
    zones and over two lines (CPU time per frame, wall p50/p99), and with snapshots on.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edged.events.assign import cluster_assign, greedy_assign
from edged.events.config import LineConfig, SnapshotsConfig, TrackConfig, ZoneConfig
from edged.events.engine import StreamEvents
from edged.events.track import Assign, Tracker
from edged.processing.detections import Detections
from tools.bench.scenes import Scene, crossing, walkers

WARMUP = 30  # frames run before timing
CROSSING = (2, 4, 8, 12)  # objects meeting in one point, per crossing scene


def scipy_assign(similarity: np.ndarray, least: float) -> list[tuple[int, int]]:
    """Optimal assignment (maximum total IoU), pairs under `least` dropped afterwards (SORT)."""
    from scipy.optimize import linear_sum_assignment

    if similarity.size == 0:
        return []
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    return [(int(r), int(c)) for r, c in zip(rows, cols, strict=True)
            if similarity[r, c] >= least]


def lap_assign(similarity: np.ndarray, least: float) -> list[tuple[int, int]]:
    """Jonker-Volgenant with a cost limit, as ByteTrack calls it."""
    import lap

    if similarity.size == 0:
        return []
    _cost, x, _y = lap.lapjv(1.0 - similarity, extend_cost=True, cost_limit=1.0 - least)
    return [(int(r), int(c)) for r, c in enumerate(x)
            if c >= 0 and similarity[r, c] >= least]


def solvers() -> dict[str, Assign | str]:
    """name → matcher, or why it is missing."""
    out: dict[str, Assign | str] = {"clusters (edged)": cluster_assign,
                                    "greedy": greedy_assign}
    for name, module, fn in (("scipy lsa", "scipy.optimize", scipy_assign),
                             ("lap.lapjv", "lap", lap_assign)):
        try:
            __import__(module)
            out[name] = fn
        except ImportError:
            out[name] = f"not installed (pip install {module.split('.')[0]})"
    return out


@dataclass(frozen=True)
class Settings:
    """What StreamEvents reads from a stream's config."""

    track: TrackConfig = field(default_factory=TrackConfig)
    labels: list[str] = field(default_factory=list)
    min_score: float = 0.0
    zones: list[ZoneConfig] = field(default_factory=list)
    lines: list[LineConfig] = field(default_factory=list)
    snapshots: SnapshotsConfig = field(default_factory=lambda: SnapshotsConfig(enabled=False))


def arrays(frame: list[tuple[int, dict[str, Any]]]) -> tuple[np.ndarray, np.ndarray, list[str]]:
    boxes = np.array([d["box"] for _i, d in frame], float).reshape(-1, 4)
    return boxes, np.array([d["score"] for _i, d in frame], float), [d["label"] for _i, d in frame]


def id_changes(scene: Scene, assign: Assign) -> int:
    tracker = Tracker(TrackConfig(), assign=assign)
    last: dict[int, int] = {}
    changes = 0
    for f, frame in enumerate(scene.frames):
        step = tracker.update(f / scene.fps, *arrays(frame))
        for tr in step.seen:
            if not tr.confirmed:
                continue  # a tentative track's number is never published
            assert tr.detection is not None
            truth = frame[tr.detection][0]
            changes += truth in last and last[truth] != tr.key
            last[truth] = tr.key
    return changes


def recorded_matrices(scene: Scene) -> list[tuple[np.ndarray, float]]:
    """The similarity matrices a tracker hands its matcher over a scene."""
    seen: list[tuple[np.ndarray, float]] = []

    def record(similarity: np.ndarray, least: float) -> list[tuple[int, int]]:
        seen.append((similarity.copy(), least))
        return cluster_assign(similarity, least)

    tracker = Tracker(TrackConfig(), assign=record)
    for f, frame in enumerate(scene.frames):
        tracker.update(f / scene.fps, *arrays(frame))
    return seen


def time_solver(assign: Assign, matrices: list[tuple[np.ndarray, float]], rounds: int) -> float:
    """Median over rounds of the mean µs per call."""
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for similarity, least in matrices:
            assign(similarity, least)
        samples.append((time.perf_counter() - start) / len(matrices) * 1e6)
    return statistics.median(samples)


def solver_rows(quick: bool) -> list[dict[str, Any]]:
    rng = np.random.default_rng(7)
    matrices = {n: recorded_matrices(walkers(rng, n, frames=60 if quick else 200))
                for n in (5, 50)}
    scenes = {n: [crossing(np.random.default_rng(seed), n) for seed in range(10 if quick else 60)]
              for n in CROSSING}
    rows: list[dict[str, Any]] = []
    for name, assign in solvers().items():
        if isinstance(assign, str):
            rows.append({"solver": name, "missing": assign})
            continue
        rows.append({"solver": name,
                     "us_per_call_5": time_solver(assign, matrices[5], 5),
                     "us_per_call_50": time_solver(assign, matrices[50], 5),
                     "id_changes": {n: sum(id_changes(s, assign) for s in scenes[n])
                                    for n in CROSSING},
                     "scenes": len(scenes[CROSSING[0]])})
    return rows


def engine_settings(width: int, height: int, snapshots: bool) -> Settings:
    w, h = float(width), float(height)
    zones = [ZoneConfig("left", [[0, h / 2], [w / 2, h / 2], [w / 2, h], [0, h]]),
             ZoneConfig("door", [[w * 0.6, h * 0.2], [w * 0.9, h * 0.3], [w * 0.8, h * 0.8],
                                 [w * 0.55, h * 0.7]], anchor="center")]
    lines = [LineConfig("middle", [[w / 2, 0], [w / 2, h]]),
             LineConfig("road", [[0, h * 0.6], [w, h * 0.6]])]
    return Settings(zones=zones, lines=lines,
                    snapshots=SnapshotsConfig(enabled=snapshots))


def engine_row(n: int, frames: int, snapshots: bool) -> dict[str, Any]:
    scene = walkers(np.random.default_rng(n), n, frames=frames)
    events = StreamEvents("bench", engine_settings(scene.width, scene.height, snapshots))
    picture = None
    if snapshots:  # a textured frame: JPEG time depends on content
        ys, xs = np.mgrid[0:scene.height, 0:scene.width]
        picture = np.dstack([(xs * 7 + ys * 3) % 256, (xs ^ ys) % 256, (ys * 5) % 256]
                            ).astype(np.uint8)
    detections = [Detections.from_rows(d for _i, d in frame) for frame in scene.frames]
    warm = StreamEvents("warm", engine_settings(scene.width, scene.height, snapshots))
    for f, dets in enumerate(detections[:WARMUP]):  # first calls pay for imports and caches
        warm.update(f / scene.fps, dets, picture)
    wall: list[float] = []
    produced = 0
    cpu_start = time.process_time()
    for f, dets in enumerate(detections):
        start = time.perf_counter()
        changes = events.update(1_700_000_000 + f / scene.fps, dets, picture)
        wall.append(time.perf_counter() - start)
        produced += len(changes.events)
    cpu = time.process_time() - cpu_start
    ms = sorted(s * 1e3 for s in wall)
    return {"objects": n, "snapshots": snapshots, "frames": frames, "events": produced,
            "cpu_ms_per_frame": cpu / frames * 1e3, "p50_ms": statistics.median(ms),
            "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))]}


def run_bench(_tmp: Path, *, quick: bool) -> dict[str, Any]:
    frames = 150 if quick else 1200
    engine = [engine_row(n, frames, snapshots) for n, snapshots in
              ((5, False), (50, False), (5, True), (50, True))]
    return {"solvers": solver_rows(quick), "engine": engine}


def format_table(results: dict[str, Any]) -> str:
    scenes = next((r["scenes"] for r in results["solvers"] if "scenes" in r), 0)
    out = ["(a) matcher: µs per call on recorded IoU matrices; id changes over "
           f"{scenes} crossing scenes of n objects",
           f"{'solver':<18}{'5 obj µs':>10}{'50 obj µs':>11}"
           + "".join(f"{f'n={n}':>7}" for n in CROSSING)]
    for row in results["solvers"]:
        if "missing" in row:
            out.append(f"{row['solver']:<18}{row['missing']}")
            continue
        out.append(f"{row['solver']:<18}{row['us_per_call_5']:>10.1f}"
                   f"{row['us_per_call_50']:>11.1f}"
                   + "".join(f"{row['id_changes'][n]:>7}" for n in CROSSING))
    out += ["", "(b) StreamEvents.update per frame (2 zones, 2 lines)",
            f"{'objects':>8}{'snapshots':>11}{'cpu ms':>9}{'p50 ms':>9}{'p99 ms':>9}"
            f"{'events':>8}"]
    for row in results["engine"]:
        out.append(f"{row['objects']:>8}{'on' if row['snapshots'] else 'off':>11}"
                   f"{row['cpu_ms_per_frame']:>9.3f}{row['p50_ms']:>9.3f}{row['p99_ms']:>9.3f}"
                   f"{row['events']:>8}")
    return "\n".join(out)
