"""Backends as the tests run them: `options()` keeps ONNX Runtime to one CPU thread with its
cache under the test's directory, and `GateBackend` wraps real ONNX Runtime sessions in a gate
so a test can hold a worker mid-inference without sleeping (`hold_worker` parks one there)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future
from pathlib import Path

import numpy as np

from edged.backends import BackendOptions, LoadSpec
from edged.backends.onnxruntime import OrtBackend, OrtSession
from edged.inference.scheduler import Scheduler

ORT_TARGET = "edged.backends.onnxruntime:OrtBackend"  # the registered default, put back


def options(tmp_path: Path) -> BackendOptions:
    return BackendOptions(providers=("cpu",), intra_op_threads=1, cache_dir=tmp_path / "cache")


class GateBackend:
    """Real ONNX Runtime sessions whose infer() records each call and then waits for the gate.

    With the gate closed a worker is held mid-batch, so queued requests stay queued for as
    long as the test needs; `wait_calls(n)` waits (bounded) until n calls have started."""

    name = "onnxruntime"

    def __init__(self) -> None:
        self.real = OrtBackend()
        self.gate = threading.Event()
        self.gate.set()
        self.cond = threading.Condition()
        self.calls: list[dict[str, np.ndarray]] = []
        self.loads: list[str] = []
        self.threads: list[str] = []  # the thread each call ran on
        self.fail_if = None  # optional predicate on inputs: raise inside the backend call

    def unavailable_reason(self) -> str | None:
        return None

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        return self.real.auto_precision(int8, why)

    def load(self, spec: LoadSpec, opts: BackendOptions) -> GatedSession:
        with self.cond:
            self.loads.append(spec.label)
        return GatedSession(self, self.real.load(spec, opts))

    def wait_calls(self, n: int, timeout: float = 10.0) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.calls) >= n, timeout), \
                f"expected {n} backend calls, saw {len(self.calls)}"

    def reset(self) -> None:
        with self.cond:
            self.calls.clear()
            self.threads.clear()


class GatedSession:
    def __init__(self, backend: GateBackend, session: OrtSession) -> None:
        self.backend = backend
        self.session = session
        self.inputs, self.outputs = session.inputs, session.outputs
        self.providers, self.nbytes = session.providers, session.nbytes

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.backend.cond:
            self.backend.calls.append({k: np.array(v, copy=True) for k, v in inputs.items()})
            self.backend.threads.append(threading.current_thread().name)
            self.backend.cond.notify_all()
        if not self.backend.gate.wait(10):
            raise RuntimeError("test gate never opened")
        if self.backend.fail_if is not None and self.backend.fail_if(inputs):
            raise RuntimeError("injected backend failure")
        return self.session.infer(inputs)

    def close(self) -> None:
        self.session.close()


def hold_worker(scheduler: Scheduler, gate: GateBackend, model: str,
                inputs: dict[str, np.ndarray]) -> Future[dict[str, np.ndarray]]:
    """Load `model`, then park its worker inside a backend call until gate.gate is set."""
    scheduler.cache.load(model)
    gate.reset()
    gate.gate.clear()
    future = scheduler.submit(model, inputs)
    gate.wait_calls(1)
    return future
