"""ONNX Runtime's GPU paths as the daemon takes them:

  chain        providers (tensorrt, cuda, cpu): a TensorRT EP that cannot start (no
               libnvinfer on a PyPI-only host) is dropped, and the model lands on the CUDA EP
  iobind       a batch written into a mapped / pinned / managed pool buffer run on the CUDA EP:
               mapped and pinned take the IOBinding path, managed ORT's own copy
  daemon-pool  the daemon's own path for each `backends.memory` strategy: the scheduler's
               batcher assembles batches in its worker's pool and the CUDA EP runs them; every
               answer against the CPU EP, and IOBinding seen to run where it should
  int8         `edged quantize` (CPU) makes a Q/DQ variant; it runs on the CUDA EP against the
               CPU EP, and `precision: auto` times FP32 against INT8 there and picks
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from edged.backends import BackendOptions, get_backend
from edged.backends.onnxruntime import OrtSession, device_inputs
from edged.hardware import gpu, memory
from edged.inference.cache import ModelCache
from edged.inference.loadspec import load_spec
from edged.inference.precision import choose_precision
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository, ModelVersion
from tools.assets.models import MODEL_YAML
from tools.gpu_check.basics import cuda_ep_missing
from tools.gpu_check.report import (
    CUDA_EP,
    NOT_ON_PYPI,
    TOLERANCES,
    Report,
    close_enough,
    sample,
)
from tools.gpu_check.trt import int8_file

CHAIN_MODELS = ("tiny_cls", "tiny_cnn", "tiny_two_input")
STRATEGIES = ("auto", "pinned", "mapped", "managed", "host")
REQUESTS = 48  # single-row requests per strategy: enough for several full batches
INT8_PROVIDERS = ("cuda", "cpu")
TRT_FAILED = "TensorrtExecutionProvider failed"


@contextmanager
def captured(logger_name: str) -> Iterator[list[str]]:
    """The messages `logger_name` logs (warnings and up) while the block runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    handler = Keep(logging.WARNING)
    log = logging.getLogger(logger_name)
    log.addHandler(handler)
    try:
        yield lines
    finally:
        log.removeHandler(handler)


@contextmanager
def counting_bound_runs() -> Iterator[list[int]]:
    """How many batches OrtSession ran through IOBinding while the block runs (a spy around
    the real method: the call itself is unchanged)."""
    real = OrtSession._run_bound
    counter = [0]
    lock = threading.Lock()

    def spy(self: OrtSession, session: Any, placed: Mapping[str, tuple[np.ndarray, int]]
            ) -> dict[str, np.ndarray]:
        with lock:
            counter[0] += 1
        return real(self, session, placed)

    OrtSession._run_bound = spy  # type: ignore[method-assign]
    try:
        yield counter
    finally:
        OrtSession._run_bound = real  # type: ignore[method-assign]


def section_chain(report: Report, models: dict[str, ModelVersion], device: gpu.Device | None,
                  work: Path) -> None:
    reason = cuda_ep_missing(device)
    for name in CHAIN_MODELS:
        if reason:
            report.skip("chain", name, reason)
            continue
        report.guard("chain", name, partial(_chain, report, models[name], work))


def _chain(report: Report, model: ModelVersion, work: Path) -> None:
    import onnxruntime as ort

    spec = load_spec(model)
    with captured("edged.backends.onnxruntime") as said:
        session = OrtSession(spec, BackendOptions(providers=("tensorrt", "cuda", "cpu"),
                                                  cache_dir=work / "cache"))
    inputs = sample(model, spec.opt_batch_size or None)
    want = OrtSession(spec, BackendOptions(providers=("cpu",), cache_dir=work)).infer(inputs)
    ok, detail, _ = close_enough(want, session.infer(inputs), TOLERANCES["ort-cuda"])
    listed = "TensorrtExecutionProvider" in ort.get_available_providers()
    line = next((line for line in said if TRT_FAILED in line), "")
    dropped = line[line.find(TRT_FAILED):][:240]  # edged's own words, from the reason on
    report.add("chain", model.name, ok and session.providers[0] == CUDA_EP,
               f"runs on {session.providers}; {detail}"
               + (f"; TensorRT EP dropped at load ({dropped})" if dropped else ""))
    if model.name == CHAIN_MODELS[0]:
        if session.providers[0] == "TensorrtExecutionProvider":
            report.add("chain", "tensorrt-ep", True, "the TensorRT EP runs here")
        else:
            report.skip("chain", "tensorrt-ep", f"{NOT_ON_PYPI} (the EP is "
                        f"{'listed' if listed else 'not in this build'}; "
                        f"{dropped or 'no reason logged'})")


def section_iobind(report: Report, models: dict[str, ModelVersion], device: gpu.Device | None,
                   work: Path) -> None:
    reason = cuda_ep_missing(device)
    for name in CHAIN_MODELS:
        for kind in ("mapped", "pinned", "managed"):
            if reason:
                report.skip("iobind", f"{name} {kind}", reason)
            else:
                report.guard("iobind", f"{name} {kind}",
                             partial(_iobind, report, models[name], kind, work))


def _iobind(report: Report, model: ModelVersion, kind: str, work: Path) -> None:
    spec = load_spec(model)
    session = OrtSession(spec, BackendOptions(providers=("cuda", "cpu"), cache_dir=work))
    inputs = sample(model, spec.opt_batch_size or None)
    want = OrtSession(spec, BackendOptions(providers=("cpu",), cache_dir=work)).infer(inputs)
    pool = memory.new_pool(max(model.max_batch_size, 1), kind)
    try:
        placed = {k: pool.concatenate(k, [v]) for k, v in inputs.items()}
        bound = device_inputs(placed) is not None
        ok, detail, _ = close_enough(want, session.infer(placed), TOLERANCES["ort-cuda"])
    finally:
        pool.close()
    expect = memory.resolve(kind) in ("mapped", "pinned")  # managed: ORT's own copy
    report.add("iobind", f"{model.name} {kind}", ok and bound == expect and
               session.providers[0] == CUDA_EP,
               f"{memory.resolve(kind)} pool on {session.providers[0]}, IOBinding "
               f"{'ran' if bound else 'not used'} (expected {'ran' if expect else 'not used'});"
               f" {detail}")


# -- the daemon's own path --------------------------------------------------------------------
def section_daemon_pool(report: Report, root: Path, device: gpu.Device | None, work: Path,
                        *, require_cuda: bool) -> None:
    """Each memory strategy through ModelCache + Scheduler, as `edged run` wires them. Where
    the CUDA EP is not, the same runs on the CPU EP (every strategy is host memory there),
    unless `require_cuda`."""
    reason = cuda_ep_missing(device)
    providers = ("cuda", "cpu") if reason is None else ("cpu",)
    reason = reason if require_cuda else None
    for strategy in STRATEGIES:
        check = f"tiny_cls memory={strategy}"
        if reason:
            report.skip("daemon-pool", check, reason)
        else:
            report.guard("daemon-pool", check, partial(
                _daemon_pool, report, root, strategy, work / f"pool-{strategy}", providers))


def _daemon_pool(report: Report, root: Path, strategy: str, work: Path,
                 providers: tuple[str, ...]) -> None:
    name = "tiny_cls"
    # The check's own copy, waiting up to 20 ms for full batches: every strategy must see
    # batches of several requests, whatever the GPU's speed against this loop's.
    shutil.copytree(root / name / "1", work / "models" / name / "1")
    (work / "models" / name / "model.yaml").write_text(
        MODEL_YAML[name] + "batching: {preferred_batch_sizes: [16], max_queue_delay_us: 20000}\n")
    repository = ModelRepository(work / "models")
    model = repository.resolve(name)
    options = BackendOptions(providers=providers, memory=strategy, cache_dir=work)
    cache = ModelCache(repository, budget_bytes=1 << 30, options=options)
    scheduler = Scheduler(cache)
    try:
        cache.load(name)
        with cache.acquire(name) as lease:
            runs_on = list(lease.session.providers)
        cpu = OrtSession(load_spec(model), BackendOptions(providers=("cpu",), cache_dir=work))
        requests = [sample(model, 1, seed) for seed in range(REQUESTS)]
        with counting_bound_runs() as bound:
            futures = [scheduler.submit(name, x) for x in requests]
            answers = [f.result(timeout=60) for f in futures]
        rows, batches = _batch_stats(scheduler, name)
        worst = ""
        ok = True
        for x, got in zip(requests, answers, strict=True):
            same, detail, _ = close_enough(cpu.infer(x), got, TOLERANCES["ort-cuda"])
            ok, worst = ok and same, worst if same else detail
        on_gpu = runs_on[0] == CUDA_EP
        expect = on_gpu and memory.resolve(strategy) in ("mapped", "pinned")
        multi = batches < rows  # some batch held more than one request: the pool was used
        fallback = "" if on_gpu else " (the CPU fallback: no CUDA EP here)"
        report.add("daemon-pool", f"{name} memory={strategy}",
                   ok and (bound[0] > 0) == expect and multi
                   and (on_gpu or providers[0] == "cpu"),
                   f"{memory.resolve(strategy)} pool, {REQUESTS} requests in {batches} batches "
                   f"on {runs_on[0]}{fallback}; IOBinding ran for {bound[0]} "
                   f"(expected {'some' if expect else 'none'}); "
                   + ("all answers match the CPU EP" if ok else f"mismatch: {worst}"),
                   batches=batches, rows=rows, bound=bound[0])
    finally:
        scheduler.close(10)
        cache.close(timeout_s=10)


def _batch_stats(scheduler: Scheduler, name: str) -> tuple[int, int]:
    for b in scheduler.batchers():
        if b.name == name and b.version is None:
            return b.stats.inference_count, b.stats.exec_count
    return 0, 0


# -- INT8 -------------------------------------------------------------------------------------
def section_int8(report: Report, models: dict[str, ModelVersion], device: gpu.Device | None,
                 work: Path, samples: int) -> None:
    reason = cuda_ep_missing(device)
    for name in ("tiny_cnn", "tiny_cls"):
        if reason:
            report.skip("int8", name, reason)
        else:
            report.guard("int8", name, partial(_int8, report, models[name], work, samples))


def _int8(report: Report, model: ModelVersion, work: Path, samples: int) -> None:
    path, why = int8_file(model, True, samples)
    if path is None:
        report.add("int8", model.name, False, f"no INT8 variant: {why}")
        return
    opts = BackendOptions(providers=INT8_PROVIDERS, cache_dir=work / "int8")
    spec = load_spec(model, path, "int8")
    on_cuda = OrtSession(spec, opts)
    inputs = sample(model, spec.opt_batch_size or None)
    cpu = OrtSession(spec, BackendOptions(providers=("cpu",), cache_dir=work))
    ok, detail, _ = close_enough(cpu.infer(inputs), on_cuda.infer(inputs), TOLERANCES["int8"])
    choice = choose_precision(model, get_backend("onnxruntime"), opts)
    measured = "timing INT8 failed" not in choice.reason and "p50" in choice.reason
    report.add("int8", model.name, ok and measured and on_cuda.providers[0] == CUDA_EP,
               f"Q/DQ on {on_cuda.providers[0]}: {detail}; precision auto chose "
               f"{choice.precision}: {choice.reason}", precision=choice.precision)

