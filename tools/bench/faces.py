"""`python -m tools.bench faces`: the face pipeline per face, stage by stage, each timed on its
own (median ms of wall time, and CPU ms: the process's CPU time over the repeats, ONNX
Runtime's threads included), and set beside the direct library call in the same run:

- align: `edged.tasks.align.align` (Umeyama's similarity fit + `cv2.warpAffine`) on a 1080p
  frame, against OpenCV's similarity estimate (`cv2.estimateAffinePartial2D`, LMEDS over the
  five points, then 10 Levenberg-Marquardt steps on the inliers: the least-squares fit) + the
  same warp; the matrices must agree within 1e-4 (InsightFace calls scikit-image's Umeyama,
  not installed here);
- embed: `FaceService.embed` (pre-processing of the 112 x 112 crop, the scheduler, unit
  rows) on the ArcFace-shaped stand-in (tools/assets/faces.py: [1, 3, 112, 112] → [1, 512]),
  against `session.run` on the very ONNX Runtime session edged holds, with the same tensor;
- match: `Gallery.match` at 10k enrolled entries (512-d, 100 of them negatives), against the
  bare numpy floor (`vectors @ q` through BLAS, argmax; and numpy's own single-thread loop,
  `einsum`, which edged uses), answers compared;
- detect: the YOLOv8-face stand-in on the 1080p frame through the scheduler, for scale;
- identify: `FaceService.identify` of one face (align, embed, match, and an unknown's
  grouping), the path a stream's `as: identity` cascade takes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.backends.base import BackendOptions
from edged.galleries.config import ARCFACE_TEMPLATE, FacesConfig
from edged.galleries.store import Gallery
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.processing.pre import image_preprocess, preprocess
from edged.streams.faces import FaceService
from edged.tasks.align import align, similarity_transform
from tools.assets.faces import paste_face, write_face_models
from tools.real_models import member

ENTRIES, NEGATIVES, DIM = 10_000, 100, 512


def timed(run: Callable[[], object], repeats: int) -> tuple[float, float]:
    """(median wall ms, CPU ms a call) over `repeats` calls after one warm-up. A pause
    first: OpenBLAS' and ONNX Runtime's threads spin for a while after the stage before
    (the floor's `unit @ q` before the match), which the process' CPU would count here."""
    time.sleep(0.5)
    run()
    times = []
    cpu = time.process_time()
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000)
    cpu_ms = (time.process_time() - cpu) * 1000 / repeats
    return round(float(np.median(times)), 4), round(cpu_ms, 4)


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    repeats = 30 if quick else 300
    models = write_face_models(workdir / "models")
    frame = np.zeros((1080, 1920, 3), np.uint8)
    astronaut = cv2.imread(str(member("astronaut.png")))
    assert astronaut is not None, "astronaut.png does not decode"
    face = astronaut[20:240, 100:300]
    paste_face(frame, face, 300, 300, 400)
    cache = ModelCache(ModelRepository(models), budget_bytes=1 << 30,
                       options=BackendOptions(providers=("cpu",), intra_op_threads=1,
                                              allow_spinning=False, cache_dir=workdir / "c"))
    scheduler = Scheduler(cache)
    gallery = Gallery(workdir / "g" / "faces.sqlite", max_entries=ENTRIES + 10,
                      max_unknowns=100)
    try:
        for name in ("face_yolo", "face_embedder"):
            cache.load(name)
        cfg = FacesConfig(enabled=True, detector="face_yolo", embedder="face_embedder")
        faces = FaceService(cfg, scheduler, gallery)
        key = faces.current()
        [points] = faces.find_faces(frame)
        results: dict[str, Any] = {"frame": "1920x1080, one face of 400 px",
                                   "repeats": repeats}

        # align: edged vs OpenCV's least-squares similarity + the same warp
        src = np.array(points)
        ours = similarity_transform(src, np.array(ARCFACE_TEMPLATE))
        theirs = cv2.estimateAffinePartial2D(src, np.array(ARCFACE_TEMPLATE),
                                             method=cv2.LMEDS, refineIters=10)[0]
        results["align_matrix_diff"] = float(np.abs(ours - theirs).max()) if theirs is not None \
            else None
        results["align"] = timed(lambda: align(frame, points, ARCFACE_TEMPLATE, (112, 112)),
                                 repeats)
        results["align_opencv"] = timed(lambda: cv2.warpAffine(
            frame, cv2.estimateAffinePartial2D(src, np.array(ARCFACE_TEMPLATE),
                                               method=cv2.LMEDS, refineIters=10)[0], (112, 112)),
                                        repeats)

        # embed: edged's path vs session.run on the same session
        crop = align(frame, points, ARCFACE_TEMPLATE, (112, 112))
        results["embed"] = timed(lambda: faces.embed([crop]), repeats)
        model = scheduler.model("face_embedder")
        spec = model.inputs[0]
        tensor = preprocess(crop, image_preprocess(model.config.preprocess, model.label, spec,
                                                   True), spec)[0]
        lease = cache.acquire("face_embedder")
        try:
            session = lease.session
            results["embed_direct"] = timed(lambda: session.infer({spec.name: tensor}), repeats)
        finally:
            lease.release()

        # match at 10k entries: edged vs the bare numpy floor
        rng = np.random.default_rng(0)
        vectors = rng.standard_normal((ENTRIES, DIM)).astype(np.float32)
        gallery.add_many([(f"p{i // 5}", vectors[i], i % (ENTRIES // NEGATIVES) == 1)
                          for i in range(ENTRIES)], key, source="bench")
        probe = vectors[1234] + 0.5 * rng.standard_normal(DIM).astype(np.float32)
        found = gallery.match(probe, cfg.match_threshold)
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        q = probe / np.linalg.norm(probe)
        floor_best = int(np.argmax(unit @ q))
        results["match_same_answer"] = found is not None and found.entry - 1 == floor_best
        results["match"] = timed(lambda: gallery.match(probe, cfg.match_threshold), repeats)
        results["match_numpy"] = timed(lambda: int(np.argmax(unit @ q)), repeats)
        results["match_einsum"] = timed(lambda: int(np.argmax(np.einsum("ij,j->i", unit, q))),
                                        repeats)
        results["entries"] = gallery.counts()["entries"]

        results["detect"] = timed(lambda: faces.find_faces(frame), max(10, repeats // 10))
        results["identify"] = timed(lambda: faces.identify(frame, [points]), repeats)
        results["stranger_similarity"] = None if found is None else found.similarity
    finally:
        gallery.close()
        scheduler.close(5)
        cache.close(timeout_s=5)
        shutil.rmtree(workdir / "g", ignore_errors=True)
    results["match_within_1ms"] = results["match"][1] <= 1.0
    results["align_matches_opencv"] = results["align_matrix_diff"] is not None and \
        results["align_matrix_diff"] <= 1e-4
    return results


def format_table(results: dict[str, Any]) -> str:
    r = results
    rows = [("align (edged: Umeyama + warpAffine)", "align", "align_opencv"),
            ("embed 112x112 → 512 (edged: pre + scheduler)", "embed", "embed_direct"),
            (f"match at {r['entries']} entries (edged Gallery.match)", "match", "match_numpy"),
            ("  numpy einsum + argmax (one thread, no BLAS)", "match_einsum", None),
            ("detect the 1080p frame (YOLOv8-face stand-in)", "detect", None),
            ("identify one face (align + embed + match + group)", "identify", None)]
    lines = [f"face pipeline per face, {r['frame']}; median wall ms, CPU ms a call "
             f"({r['repeats']} repeats)",
             f"{'stage':<50}{'wall':>8}{'cpu':>8}{'direct':>8}{'cpu':>8}{'ratio':>7}"]
    for title, key, direct in rows:
        wall, cpu = r[key]
        base, base_cpu = r[direct] if direct else ("", "")
        lines.append(f"{title:<50}{wall:>8}{cpu:>8}{base:>8}{base_cpu:>8}"
                     f"{(f'{wall / base:.2f}' if base else ''):>7}")
    lines.append("direct: OpenCV's similarity + warp; session.run on edged's own session; "
                 "numpy's matrix-vector product and argmax")
    lines.append(f"align matrices differ by {r['align_matrix_diff']:.2e}; match answers the "
                 f"floor's: {'yes' if r['match_same_answer'] else 'NO'}; match within 1 ms "
                 f"CPU: {'yes' if r['match_within_1ms'] else 'NO'}")
    return "\n".join(lines)
