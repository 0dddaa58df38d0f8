"""`python -m tools.bench shmviews`: what lending a trusted client's shared memory to a model as
a view saves, in the one case where edged still does (issue 41 #5): a request that is a batch
of its own, on a CPU session that reads its input in place, so the view saves the only copy.
Everywhere else the bytes are copied anyway and are read from the file (`pread`) into that
copy's buffer.

Two `edged run` subprocesses on the same repository and the same shm object: one lends views
(`api.shm_copy_inputs: never`), one copies every input in with pread as the request is read
(`always`); a direct `session.run` beside them. Calls interleaved round by round, c=1, for
tiny_cls (768 bytes in) and PP-OCR det at 1x3x640x640 (4.9 MB in)."""

from __future__ import annotations

import os
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.ops.client import EdgedClient, SharedRegion
from tools.bench.api import build_repository, direct_session, run_edged
from tools.bench.core import Latency, interleaved

THREADS = 2
MODES = ("never", "always")  # views, copies


def config(workdir: Path, models: Path, copy_inputs: str) -> str:
    return f"""device_id: bench
models_dir: {models}
cache: {{dir: {workdir / 'cache'}, preload: [tiny_cls, det]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: {THREADS}}}}}
api: {{socket: {workdir / 's.sock'}, shm_copy_inputs: {copy_inputs}}}
mqtt: {{enabled: false}}
logging: {{level: warning}}
"""


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    models = workdir / "models"
    build_repository(models)
    rng = np.random.default_rng(0)
    cases = {"tiny_cls": (rng.random((1, 3, 8, 8), dtype=np.float32), 50 if quick else 2000),
             "det": (rng.random((1, 3, 640, 640), dtype=np.float32), 4 if quick else 60)}
    results: dict[str, Any] = {}
    with ExitStack() as stack:
        clients = {}
        for mode in MODES:
            folder = workdir / mode
            folder.mkdir()
            sock, _proc = stack.enter_context(run_edged(folder, config(folder, models, mode)))
            clients[mode] = stack.enter_context(EdgedClient(sock))
        for model, (x, rounds) in cases.items():
            session = direct_session(models / model / "1" / "model.onnx", THREADS)
            name = session.get_inputs()[0].name
            key = f"edged-views-{os.getpid()}-{model}"
            with SharedRegion(key, x.nbytes) as region:
                tensor = region.tensor(model, x)
                for client in clients.values():
                    client.register_shm(model, key, x.nbytes)
                reference = session.run(None, {name: x})[0]
                calls: list[Callable[[], object]] = [partial(session.run, None, {name: x})]
                for mode in MODES:
                    got = clients[mode].infer(model, {name: tensor}).outputs
                    np.testing.assert_allclose(next(iter(got.values())), reference,
                                               rtol=1e-4, atol=1e-5)
                    calls.append(partial(clients[mode].infer, model, {name: tensor}))
                for call in calls:  # warm
                    call()
                pause = 0.01 if x.nbytes > 1 << 20 else 0.0
                direct, views, copies = (Latency.of(t) for t in interleaved(
                    calls, blocks=rounds, per_block=1, pause_s=pause))
                for client in clients.values():
                    client.unregister_shm(model)
            results[model] = {"input_bytes": x.nbytes, "direct": direct.__dict__,
                              "views": views.__dict__, "copies": copies.__dict__,
                              "copies_over_views_p50": copies.p50_ms / views.p50_ms,
                              "copy_ms_p50": copies.p50_ms - views.p50_ms}
    return results


def format_table(r: dict[str, Any]) -> str:
    lines = ["| c=1 p50 (ms) | input | direct ORT | shm, views (`never`) | shm, pread copies "
             "(`always`) | copies / views | the copy's cost |",
             "|---|---|---|---|---|---|---|"]
    for model, label in (("tiny_cls", "tiny_cls"), ("det", "PP-OCR det 1x3x640x640")):
        row = r[model]
        lines.append(f"| {label} | {row['input_bytes'] / 1e6:.3f} MB | "
                     f"{row['direct']['p50_ms']:.3f} | {row['views']['p50_ms']:.3f} | "
                     f"{row['copies']['p50_ms']:.3f} | {row['copies_over_views_p50']:.3f}x | "
                     f"{row['copy_ms_p50']:+.3f} ms |")
    return "\n".join(lines)
