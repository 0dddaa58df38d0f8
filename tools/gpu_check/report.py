"""Rows of the device check, how outputs are compared with ONNX Runtime on the CPU, and the
reasons a row cannot run here, worded once."""

from __future__ import annotations

import dataclasses
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from edged.inference.loadspec import warmup_inputs
from edged.model.repository import ModelVersion

CUDA_EP = "CUDAExecutionProvider"
# Closeness to ONNX Runtime on the CPU: max|got - want| <= atol + rtol * max|want|; INT8 by
# cosine similarity of the flattened outputs (the same Q/DQ file runs on both sides).
TOLERANCES: dict[str, dict[str, float]] = {
    "ort-cuda": {"rtol": 1e-2, "atol": 1e-3},  # cuDNN may use TF32 on Ampere and newer
    "fp32": {"rtol": 1e-3, "atol": 1e-4},
    "fp16": {"rtol": 2e-2, "atol": 2e-3},
    "int8": {"cosine": 0.99},
}
# TensorRT's libraries come from NVIDIA's own index or JetPack: a host that installs from PyPI
# alone (the lent GPU hosts) cannot run a TensorRT row, and the table says so in these words.
NOT_ON_PYPI = "not runnable here: TensorRT libraries are not on PyPI"


def tensorrt_missing() -> str | None:
    """None when TensorRT's Python module imports here, else the row's reason."""
    try:
        importlib.import_module("tensorrt")
    except ImportError as exc:
        return f"{NOT_ON_PYPI} (`import tensorrt`: {exc}; NVIDIA's index or JetPack has them)"
    return None


@dataclasses.dataclass
class Row:
    section: str
    check: str
    status: str  # pass | FAIL | skip
    detail: str = ""
    data: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0


class Report:
    def __init__(self) -> None:
        self.rows: list[Row] = []

    def add(self, section: str, check: str, ok: bool, detail: str = "", **data: Any) -> None:
        self.rows.append(Row(section, check, "pass" if ok else "FAIL", detail, data))

    def skip(self, section: str, check: str, reason: str) -> None:
        self.rows.append(Row(section, check, "skip", reason))

    def guard(self, section: str, check: str, run: Callable[[], None]) -> None:
        """Run one check; an exception is that check's failure, not the self-test's end. The
        rows it adds carry its time."""
        import time

        first, started = len(self.rows), time.perf_counter()
        try:
            run()
        except Exception as exc:  # report it in the table and go on
            self.add(section, check, False, f"{type(exc).__name__}: {exc}"[:600])
        for row in self.rows[first:]:
            row.seconds = round(time.perf_counter() - started, 3)

    @property
    def failed(self) -> bool:
        return any(r.status == "FAIL" for r in self.rows)

    def counts(self) -> dict[str, int]:
        out = {"pass": 0, "FAIL": 0, "skip": 0}
        for row in self.rows:
            out[row.status] += 1
        return out

    def table(self, width_limit: int = 160) -> str:
        width = max([len(r.check) for r in self.rows] + [5])
        left = max([len(r.section) for r in self.rows] + [7])
        lines = [f"{'section':<{left}} {'check':<{width}} result  detail",
                 f"{'-' * left} {'-' * width} ------  {'-' * 40}"]
        lines += [f"{r.section:<{left}} {r.check:<{width}} {r.status:<6}  "
                  f"{r.detail[:width_limit]}" for r in self.rows]
        return "\n".join(lines)

    def write(self, path: Path, **extra: Any) -> None:
        doc = {"ok": not self.failed, "counts": self.counts(), "tolerances": TOLERANCES,
               **extra, "rows": [dataclasses.asdict(r) for r in self.rows]}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2, default=str) + "\n")


def close_enough(want: dict[str, np.ndarray], got: dict[str, np.ndarray],
                 tol: dict[str, float]) -> tuple[bool, str, dict[str, float]]:
    worst: dict[str, float] = {}
    ok = True
    for name, ref in want.items():
        ref64, out64 = ref.astype(np.float64), got[name].astype(np.float64)
        if ref64.shape != out64.shape:
            worst[name] = float("inf")
            ok = False
            continue
        if "cosine" in tol:
            a, b = ref64.ravel(), out64.ravel()
            value = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))
            ok = ok and value >= tol["cosine"]
        else:
            value = float(np.max(np.abs(out64 - ref64))) if ref.size else 0.0
            ok = ok and value <= tol["atol"] + tol["rtol"] * float(np.max(np.abs(ref64),
                                                                          initial=0.0))
        worst[name] = value
    what = "cosine" if "cosine" in tol else "max|d|"
    return ok, ", ".join(f"{n} {what} {v:.2e}" for n, v in worst.items()), worst


def sample(model: ModelVersion, rows: int | None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of the warm-up shapes with `rows` rows (batched models)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, zeros in warmup_inputs(model).items():
        shape = ((rows, *zeros.shape[1:]) if model.max_batch_size and rows else zeros.shape)
        out[name] = (rng.random(shape).astype(zeros.dtype)
                     if np.issubdtype(zeros.dtype, np.floating) else np.zeros(shape, zeros.dtype))
    return out
