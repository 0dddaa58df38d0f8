"""Shadow runs: a candidate version proves itself on the device's own live inputs before it
serves. The scheduler hands each request of the model to `Shadow.offer` (its tap); a sampled
share is also run through the candidate on one low-priority thread, never ahead of serving
work: a sample is skipped, and counted, when serving queues are busy, when the shadow's own
queue is full, or when the candidate has used its share of time (ota.shadow.max_share).
Outputs are compared with the model's own kind of agreement (edged/processing/agreement.py);
progress goes out retained on `<prefix>/ota/<model>/shadow`. Once `min_samples` are in (or
`max_duration_s` passed) the shadow asks for its decision; the Updater carries it out on the
OTA worker (promote: the usual warm swap; reject: the candidate is unloaded and removed).
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from edged.inference.cache import ModelCache
from edged.model.repository import ModelVersion
from edged.ota.config import ShadowConfig
from edged.ota.manifest import Manifest
from edged.ota.rollout import bounds_for, judge
from edged.processing.agreement import Agreement, classify_output
from edged.processing.post import Postprocessor
from edged.tasks import BOXED_TASKS

logger = logging.getLogger(__name__)

Outputs = dict[str, np.ndarray]
Sink = Callable[["Future[Outputs] | Outputs | None"], None]
Tap = Callable[[Mapping[str, np.ndarray]], "Sink | None"]
Decide = Callable[["Shadow", bool, str], None]
Publish = Callable[[str, dict[str, Any]], None]
LATENCY_WINDOW = 2048  # the candidate's last run times kept for its p50/p99


def kind_of(model: ModelVersion) -> str:
    """classify, detect or raw: which agreement a shadow of `model` is judged by (segment and
    pose models by their boxes, as detectors)."""
    post = model.config.postprocess
    if post is not None and post.kind in BOXED_TASKS and model.max_batch_size > 0:
        return "detect"
    return "classify" if classify_output(model) is not None else "raw"


class Shadow:
    """One candidate's shadow run, from `start()` to its decision (or `stop()`)."""

    def __init__(self, manifest: Manifest, serving: int, model: ModelVersion,
                 cache: ModelCache, cfg: ShadowConfig, *, busy: Callable[[], bool],
                 decide: Decide, publish: Publish | None = None,
                 clock: Callable[[], float] = time.monotonic, seed: int | None = None) -> None:
        assert manifest.rollout is not None
        self.manifest = manifest
        self.rollout = manifest.rollout
        self.name, self.candidate, self.serving = manifest.model, manifest.version, serving
        self.model = model  # the candidate's config and signature
        self.kind = kind_of(model)
        self.bounds = bounds_for(self.rollout, self.kind)  # Rejected('bad_rollout') first
        self.cache, self.cfg = cache, cfg
        self._busy, self._decide, self._publish, self._clock = busy, decide, publish, clock
        self._random = random.Random(seed)
        self._agreement = Agreement(classify_output(model) if self.kind == "classify" else None)
        self._post = Postprocessor(model.config.postprocess, model.dir.parent, model.head) \
            if self.kind == "detect" else None
        self._queue: queue.Queue[tuple[dict[str, np.ndarray], Outputs]] = \
            queue.Queue(cfg.queue)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"edged-shadow-{self.name}")
        self.started = clock()
        self.started_wall = time.time()
        self.seen = self.sampled = self.runs = self.failures = 0
        self.skipped = {"busy": 0, "queue": 0, "share": 0}
        self._spent = 0.0  # seconds the candidate ran
        self._latencies: list[float] = []
        self.state = "running"  # running | promoting | rejecting | promoted | rejected | ...
        self.detail = ""
        self.reason = ""  # why it was rejected: shadow_rejected, shadow_timeout, ...
        self._last_publish = -1e9

    # -- the scheduler's side (serving threads: quick, never raises) -----------------------
    def offer(self, inputs: Mapping[str, np.ndarray]) -> Sink | None:
        """A serving request of the model: None when not sampled (or skipped); else a sink
        for its outputs (a future, the outputs, or None when the request failed)."""
        with self._lock:
            self.seen += 1
            if self.state != "running" or self._random.random() >= self.rollout.sample:
                return None
            self.sampled += 1
            why = self._skip_reason()
            if why is not None:
                self.skipped[why] += 1
                return None
        copied = {k: np.array(v, copy=True) for k, v in inputs.items()}
        return lambda result: self._enqueue(copied, result)

    def _skip_reason(self) -> str | None:
        """Why a sample is skipped now (lock held), None when it may run."""
        if self._busy():
            return "busy"
        if self._queue.full():
            return "queue"
        if self._spent > self.cfg.max_share * max(self._clock() - self.started, 1e-3):
            return "share"
        return None

    def _enqueue(self, inputs: dict[str, np.ndarray],
                 result: Future[Outputs] | Outputs | None) -> None:
        if isinstance(result, Future):
            if result.cancelled() or result.exception() is not None:
                return  # the serving request failed: nothing to compare with
            result = result.result()
        if result is None:
            return
        outputs = {k: np.array(v, copy=True) for k, v in result.items()}
        try:
            self._queue.put_nowait((inputs, outputs))
        except queue.Full:
            with self._lock:
                self.skipped["queue"] += 1

    # -- the shadow's thread ---------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()
        self._report(force=True)

    def stop(self, state: str, detail: str = "", *, timeout_s: float = 10.0) -> None:
        """End the run (its decision carried out, or cancelled); publishes the final state."""
        with self._lock:
            self.state, self.detail = state, detail
        self._stop.set()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)
        self._report(force=True)

    def _run(self) -> None:
        deadline = self.started + self.rollout.max_duration_s
        while not self._stop.is_set():
            try:
                inputs, outputs = self._queue.get(timeout=0.2)
            except queue.Empty:
                if self._clock() >= deadline:
                    self._ask(False, f"only {self._agreement.samples} of "
                                     f"{self.rollout.min_samples} samples in "
                                     f"{self.rollout.max_duration_s:g} s", "shadow_timeout")
                    return
                self._report()
                continue
            with self._lock:
                if self._busy():  # serving work arrived while this waited: it goes first
                    self.skipped["busy"] += 1
                    continue
            self._compare(inputs, outputs)
            self._report()
            if self._agreement.samples >= self.rollout.min_samples:
                checks, failed = judge(self.metrics(), self.bounds)
                if failed:
                    self._ask(False, "; ".join(failed), "shadow_rejected")
                else:
                    self._ask(True, ", ".join(f"{c.name} {c.value:.4g}" for c in checks
                                              if c.value is not None), "")
                return

    def _compare(self, inputs: dict[str, np.ndarray], outputs: Outputs) -> None:
        started = self._clock()
        try:
            with self.cache.acquire(self.name, self.candidate) as lease:
                got = lease.session.infer(inputs)
            ok = True
        except Exception as exc:  # the candidate's failure is a measure, never the daemon's
            logger.warning("shadow %s:%d: a run failed: %s", self.name, self.candidate, exc,
                           extra={"model": self.name, "code": "shadow_run_failed"})
            ok = False
        spent = self._clock() - started
        with self._lock:
            self._spent += spent
            self.runs += 1
            self._latencies.append(spent)
            del self._latencies[:-LATENCY_WINDOW]
            if not ok:
                self.failures += 1
                return
        try:
            for ref, other in _rows(self.model, outputs, got):
                self._agreement.add(ref, other)
                if self._post is not None:
                    self._agreement.add_boxes(self._boxes(ref), self._boxes(other))
        except (ValueError, KeyError, IndexError) as exc:  # outputs that cannot be compared
            logger.warning("shadow %s:%d: outputs differ from the serving version's: %s",
                           self.name, self.candidate, exc)
            with self._lock:
                self.failures += 1

    def _boxes(self, outputs: Outputs) -> tuple[np.ndarray, np.ndarray]:
        assert self._post is not None
        found = self._post({k: v[None] for k, v in outputs.items()}, None)["detections"]
        return found.boxes, found.classes

    def _ask(self, promote: bool, detail: str, reason: str) -> None:
        with self._lock:
            if self.state != "running":
                return
            self.state = "promoting" if promote else "rejecting"
            self.detail = detail
            self.reason = reason
        self._report(force=True)
        self._decide(self, promote, detail)

    # -- progress --------------------------------------------------------------------------
    def metrics(self) -> dict[str, float | None]:
        metrics = self._agreement.metrics()
        with self._lock:
            runs, failures, times = self.runs, self.failures, sorted(self._latencies)
        metrics["failure_rate"] = failures / runs if runs else None
        metrics["candidate_p50_ms"] = _percentile(times, 50)
        metrics["candidate_p99_ms"] = _percentile(times, 99)
        return metrics

    def progress(self) -> dict[str, Any]:
        metrics = self.metrics()
        checks, failed = judge(metrics, self.bounds)
        with self._lock:
            return {"model": self.name, "serving": self.serving, "candidate": self.candidate,
                    "state": self.state, "detail": self.detail, "kind": self.kind,
                    "samples": self._agreement.samples, "min_samples": self.rollout.min_samples,
                    "sample": self.rollout.sample, "offered": self.seen, "sampled": self.sampled,
                    "runs": self.runs, "failures": self.failures, "skipped": dict(self.skipped),
                    "metrics": {k: _round(v) for k, v in metrics.items()},
                    "checks": [{"name": c.name, "threshold": c.threshold,
                                "value": _round(c.value), "passed": c.passed} for c in checks],
                    "failing": failed, "started": round(self.started_wall, 3),
                    "elapsed_s": round(self._clock() - self.started, 3),
                    "max_duration_s": self.rollout.max_duration_s, "ts": round(time.time(), 3)}

    def _report(self, *, force: bool = False) -> None:
        now = self._clock()
        if self._publish is None or (not force and
                                     now - self._last_publish < self.cfg.publish_every_s):
            return
        self._last_publish = now
        try:
            self._publish(self.name, self.progress())
        except Exception:  # progress is news, never a reason to stop the run
            logger.exception("shadow %s: publishing progress failed", self.name)


def _rows(model: ModelVersion, ref: Outputs, other: Outputs) -> list[tuple[Outputs, Outputs]]:
    """Per-sample output pairs: a batched model's rows one by one."""
    if model.max_batch_size == 0:
        return [(ref, other)]
    rows = len(next(iter(ref.values())))
    return [({k: v[i] for k, v in ref.items()}, {k: other[k][i] for k in ref})
            for i in range(rows)]


def _percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
