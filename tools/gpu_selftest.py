#!/usr/bin/env python3
"""edged's GPU self-test: what its GPU code paths really do on this machine.

Sections, each skipped with the reason when its library or device is missing (the rest runs):

  env          cuda-python, the CUDA device and versions, NVML, TensorRT, ONNX Runtime
  memory       mapped, managed and pinned pool buffers written by the CPU, read on the device
  ort-cuda     ONNX Runtime's CUDA EP against its CPU EP, plain and through IOBinding
  chain        the provider chain: a TensorRT EP that cannot start is dropped for the CUDA EP
  iobind       batches in mapped / pinned / managed pool buffers on the CUDA EP
  daemon-pool  each `backends.memory` strategy on the daemon's own path (cache, scheduler,
               batcher, its worker's pool) with the CUDA EP, answers against the CPU EP
  int8         a Q/DQ variant (`edged quantize`) on the CUDA EP; `precision: auto` there
  tensorrt     FP16 and INT8 engines (built by edged's TensorRT backend, served from its engine
               cache) against ONNX Runtime on the CPU
  pool         pool buffers read in place by a two-instance TensorRT session from two threads
  daemon       `edged run` end to end: a detector stream's events to a real mosquitto, socket
               requests in system shared memory, an OTA swap under load, GPU metrics
  timing       p50 of TensorRT, ORT-CUDA and ORT-CPU at batch 1 and at the tuned batch size

TensorRT's rows say "not runnable here: TensorRT libraries are not on PyPI" on hosts that
install from PyPI alone. Models: the tiny test models (tools/test_models.py) and PP-OCR
cls/det (the rapidocr-onnxruntime wheel, or $EDGED_PPOCR_DIR). Prints a table, writes JSON
(--out; by default bench-results/gpu-selftest.json in the repository, which git ignores),
exits 1 on any failure (0 when everything ran or was skipped; --require-gpu makes a missing
GPU, and a daemon that ran on the CPU, a failure).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]  # run as a script: `python tools/gpu_selftest.py`

from edged.model.repository import ModelRepository, ModelVersion  # noqa: E402
from tools.assets import models as test_models  # noqa: E402
from tools.gpu_check import basics, daemon_e2e, ort_paths  # noqa: E402
from tools.gpu_check import trt as trt_checks  # noqa: E402  (not `trt`: that names TensorRT)
from tools.gpu_check.report import (  # noqa: E402, F401  (the names other tools import)
    CUDA_EP,
    TOLERANCES,
    Report,
    Row,
    close_enough,
    sample,
)
from tools.gpu_check.trt import int8_file  # noqa: E402, F401

RESULTS = ROOT / "bench-results" / "gpu-selftest.json"
SECTIONS = ("env", "memory", "ort-cuda", "chain", "iobind", "daemon-pool", "int8", "tensorrt",
            "pool", "daemon", "timing")
TINY = ["tiny_cls", "tiny_cnn", "tiny_two_input", "colors"]
TINY_YAML = {"tiny_cnn": test_models.MODEL_YAML["tiny_cnn"] + (
    "warmup: {shapes: {image: [3, 32, 32]}}\n"
    "tensorrt: {shapes: {image: {min: [3, 16, 16], opt: [3, 32, 32], max: [3, 64, 64]}}}\n")}
PPOCR_YAML = {
    "ppocr_cls": "max_batch_size: 8\ninputs: [{name: x, shape: [3, 48, 192]}]\n"
                 "batching: {preferred_batch_sizes: [8]}\n",
    "ppocr_det": "max_batch_size: 1\ninputs: [{name: x, shape: [3, -1, -1]}]\n"
                 "warmup: {shapes: {x: [3, 640, 640]}}\n"
                 "tensorrt: {shapes: {x: {min: [3, 32, 32], opt: [3, 640, 640], "
                 "max: [3, 960, 960]}}}\n",
}
QUANTIZE_YAML = "quantization: {activation_type: int8}\n"  # TensorRT takes signed INT8 only


def make_repository(root: Path, which: list[str], report: Report) -> list[ModelVersion]:
    names = []
    if "tiny" in which:
        test_models.write_repository(root, names=TINY)
        for name in TINY:
            (root / name / "model.yaml").write_text(TINY_YAML.get(
                name, test_models.MODEL_YAML[name]) + QUANTIZE_YAML)
        names += TINY
    if "ppocr" in which:
        from tools.bench.assets import PPOCR_CLS, PPOCR_DET, AssetMissing, ppocr_model

        for name, file in (("ppocr_cls", PPOCR_CLS), ("ppocr_det", PPOCR_DET)):
            try:
                source = ppocr_model(file)
            except AssetMissing as exc:
                report.skip("models", name, str(exc))
                continue
            (root / name / "1").mkdir(parents=True)
            shutil.copyfile(source, root / name / "1" / "model.onnx")
            (root / name / "model.yaml").write_text(PPOCR_YAML[name] + QUANTIZE_YAML)
            names.append(name)
    repo = ModelRepository(root)
    return [repo.resolve(name) for name in names]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="JSON results (default: bench-results/gpu-selftest.json in the "
                             "repository, which git ignores)")
    parser.add_argument("--models", default="tiny,ppocr", help="tiny, ppocr or both")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"which to run (default: all of {', '.join(SECTIONS)})")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="engine cache to build into and reuse (default: a temporary one)")
    parser.add_argument("--quantize", action="store_true",
                        help="make INT8 Q/DQ variants from random samples where none exists")
    parser.add_argument("--samples", type=int, default=16, help="samples for --quantize")
    parser.add_argument("--build-timeout", type=float, default=1800.0, help="seconds per build")
    parser.add_argument("--rounds", type=int, default=5, help="timing rounds")
    parser.add_argument("--budget-s", type=float, default=10.0, help="timing budget per case")
    parser.add_argument("--quick", action="store_true", help="one timing round, 1s budget")
    parser.add_argument("--memory", default="auto",
                        help="the daemon section's backends.memory (default: auto)")
    parser.add_argument("--daemon-log", type=Path, default=None,
                        help="keep the daemon section's edged.log here")
    parser.add_argument("--require-gpu", action="store_true",
                        help="a machine without a usable CUDA device fails the self-test")
    args = parser.parse_args(argv)
    unknown = set(args.sections.split(",")) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown section(s): {', '.join(sorted(unknown))}")
    if args.quick:
        args.rounds, args.budget_s = 1, 1.0
    return args


def run(args: argparse.Namespace, report: Report, tmp: Path) -> Any:
    wanted = set(args.sections.split(","))
    args.cache_dir = args.cache_dir or tmp / "cache"
    device = basics.section_env(report)
    if "memory" in wanted:
        basics.section_memory(report, device)
    listed = make_repository(tmp / "models", args.models.split(","), report)
    by_name = {m.name: m for m in listed}
    if "ort-cuda" in wanted:
        basics.section_ort_cuda(report, listed, device, tmp)
    if "tiny" in args.models.split(","):
        if "chain" in wanted:
            ort_paths.section_chain(report, by_name, device, tmp)
        if "iobind" in wanted:
            ort_paths.section_iobind(report, by_name, device, tmp)
        if "daemon-pool" in wanted:
            ort_paths.section_daemon_pool(report, tmp / "models", device, tmp,
                                          require_cuda=args.require_gpu)
        if "int8" in wanted:
            ort_paths.section_int8(report, by_name, device, tmp, args.samples)
    engines: dict[str, Any] = {}
    if "tensorrt" in wanted:
        trt_checks.section_tensorrt(report, listed, device, args, engines)
    if "pool" in wanted:
        trt_checks.section_pool(report, listed, device, args)
    if "daemon" in wanted:
        daemon_e2e.section_daemon(report, tmp / "daemon", require_cuda=args.require_gpu,
                                  memory=args.memory, log_copy=args.daemon_log)
    if "timing" in wanted:
        basics.section_timing(report, listed, engines, args)
    for session in engines.values():
        session.close()
    return device


def main(argv: list[str] | None = None) -> int:
    import onnxruntime

    args = parse_args(argv)
    # ORT's own C++ error lines for every provider that cannot load would bury the table;
    # edged's log and the rows say what was dropped and why.
    onnxruntime.set_default_logger_severity(3)
    report = Report()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="edged-gpu-selftest-") as tmp:
        device = run(args, report, Path(tmp))
    if args.require_gpu and device is None:
        report.add("env", "--require-gpu", False, "no usable CUDA device")
    print(report.table())
    report.write(args.out, machine=basics.machine(device),
                 seconds=round(time.perf_counter() - started, 1))
    print(f"\n{'FAILED' if report.failed else 'ok'} ({report.counts()}); written to {args.out}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
