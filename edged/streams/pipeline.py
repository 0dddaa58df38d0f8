"""One stream: source → pre → scheduler → post → (cascades, events) → publish, on a thread of
its own.

Capture never waits for the model: the source's bounded queue sits between them (its policy
drops frames and counts them). At most `in_flight` frames of the stream are inside the model,
each in an input buffer of the stream's own small pool, so pre-processing the next frame
overlaps inference of the last and memory stays flat whatever the model's speed. Publishing
hands a message to the MQTT link, which never blocks either. A detect stream's events stage
(`edged/streams/events_stage.py`) sees each frame's detections after the cascades added their
sub_labels, on this same thread and outside the stats lock. A stream with a change gate
(`edged/streams/gate.py`) sends a frame to the model only when its picture changed; the frames
it holds back take their place in the window and get the last answer (`_hold`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.core.errors import EdgedError
from edged.events.publish import compact
from edged.hardware.host import name_os_thread
from edged.inference.scheduler import Outputs, Scheduler
from edged.model.repository import ModelVersion
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor, published
from edged.processing.pre import Geometry, image_preprocess, preprocess, size_inputs
from edged.sources import Frame, Source, worth_logging
from edged.streams.cascade import Cascade, run_all
from edged.streams.config import StreamConfig
from edged.streams.events_stage import EventsStage
from edged.streams.gate import ChangeGate
from edged.streams.live import LiveView, answer_of
from edged.streams.states import States
from edged.streams.stats import Percentiles, StreamStats
from edged.tasks.rle import encode_rows

logger = logging.getLogger(__name__)

Publish = Callable[[str, bytes], None]  # (stream name, result JSON)
LATENCY_WINDOW = 1024


@dataclass
class _InFlight:
    frame: Frame
    geometry: Geometry | None
    future: Future[Outputs] | None  # None: the gate held the frame back (the last answer holds)
    buffer: np.ndarray | None
    model: ModelVersion
    submitted: float


@dataclass
class PipelineStats:
    processed: int = 0
    failed: int = 0
    secondary_failed: int = 0  # frames published without what a secondary model would add
    gated: int = 0  # frames the change gate kept from the model (their scene had not changed)
    last_error: str | None = None


class StreamPipeline:
    def __init__(self, cfg: StreamConfig, source: Source, scheduler: Scheduler,
                 publish: Publish | None, *, backend_of: Callable[[str, int], str] | None = None,
                 cascades: Sequence[Cascade] = (), events: EventsStage | None = None,
                 live: LiveView | None = None, gate: ChangeGate | None = None,
                 motion: Callable[[float], None] | None = None,
                 states: States | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`publish` takes each frame's results (None: the stream publishes none); `events`
        tracks a detect stream's detections; `live` keeps the latest frame for pictures;
        `gate` keeps frames whose picture did not change from the model; `motion` is told
        the capture time of each frame whose picture changed (continuous recording's
        `motion` mode), measured by `gate`, or by a gate of its own that holds nothing back
        where the stream has none; `states` reads the stream's classified regions on every
        frame that has pixels (gated ones too: they are read on their own clock)."""
        self.cfg = cfg
        self.states = states
        self.events = events
        self.live = live
        self.cascades = list(cascades)
        self.source = source
        self.scheduler = scheduler
        self.publish = publish
        self.gate = gate
        self.motion = motion
        self._motion_gate = ChangeGate(cfg.gate) if motion is not None and gate is None \
            else None
        self.backend_of = backend_of or (lambda name, version: "unknown")
        self.clock = clock
        self.stats = PipelineStats()
        self._latencies: deque[float] = deque(maxlen=LATENCY_WINDOW)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._free: list[np.ndarray] = []
        self._version: tuple[ModelVersion, Postprocessor, str] | None = None
        self._answer: tuple[dict[str, Any], Geometry | None] | None = None  # the last one
        self._beat: float | None = None  # each time round the loop (the health tick reads it)
        self.started_at: float | None = None

    def start(self) -> None:
        self.started_at = self.clock()
        self.source.start()
        self._thread = threading.Thread(target=self._run, name=f"pipeline-{self.cfg.name}",
                                        daemon=True)
        self._thread.start()

    def stop_source(self, timeout_s: float) -> bool:
        return self.source.stop(timeout_s)

    def stop(self, timeout_s: float) -> bool:
        """Stop taking frames; frames in the model finish (bounded by `timeout_s`)."""
        self._stop.set()
        self.source.stop(timeout_s)
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    # -- the loop ----------------------------------------------------------------------------
    def _run(self) -> None:
        name_os_thread(f"pipeline-{self.cfg.name}")  # its CPU in top -H (and the live bench)
        window: deque[_InFlight] = deque()
        try:
            self._loop(window)
        except Exception:  # a bug: the beat is left to go stale, so the health tick reports it
            logger.exception("stream %s: the processing loop died", self.cfg.name,
                             extra={"stream": self.cfg.name, "code": "pipeline_died"})
            self._close_events()
            return
        self._close_events()
        self._beat = None

    def _close_events(self) -> None:
        """The stream stops: its objects end and their counts go to 0 (published)."""
        if self.events is None:
            return
        try:
            self.events.close()
        except Exception:
            logger.exception("stream %s: ending its objects failed", self.cfg.name,
                             extra={"stream": self.cfg.name})

    def _loop(self, window: deque[_InFlight]) -> None:
        while not (self._stop.is_set() and not window):
            self._beat = self.clock()
            if self.events is not None:
                self.events.tick(idle=not window)
            while len(window) < self.cfg.in_flight and not self._stop.is_set():
                frame = self.source.queue.get(0.0 if window else 0.2)
                if frame is None:
                    break
                item = self._submit(frame)
                if item is not None:
                    window.append(item)
            if not window:
                continue
            future = window[0].future
            if future is None:  # held back by the gate: its turn comes after the frames before
                self._hold(window.popleft())
                continue
            try:
                outputs = future.result(timeout=0.2)
            except FutureTimeout:
                continue
            except EdgedError as exc:
                failed = window.popleft()
                self._failed(failed.frame, failed.buffer, exc)
                continue
            self._finish(window.popleft(), outputs)

    def _submit(self, frame: Frame) -> _InFlight | None:
        buffer = None
        try:
            model = self.scheduler.model(self.cfg.model)
            admitted = self.gate is None or self.gate.admit(
                frame.data, frame.captured_mono, (model.name, model.version))
            if self.motion is not None:
                self._measure_motion(frame)
            if not admitted:
                return _InFlight(frame, None, None, None, model, self.clock())
            inputs, geometry, buffer = self._inputs(frame, model)
            future = self.scheduler.submit(self.cfg.model, inputs, priority=self.cfg.priority)
        except EdgedError as exc:  # model missing or failing to load, frame not an input
            self._failed(frame, buffer, exc)
            return None
        return _InFlight(frame, geometry, future, buffer, model, self.clock())

    def _measure_motion(self, frame: Frame) -> None:
        assert self.motion is not None
        gate = self.gate
        if gate is None:
            gate = self._motion_gate
            assert gate is not None
            gate.admit(frame.data, frame.captured_mono)  # (measures only: nothing held back)
        if gate.moved:
            self.motion(frame.captured)

    def _inputs(self, frame: Frame, model: ModelVersion
                ) -> tuple[dict[str, np.ndarray], Geometry | None, np.ndarray | None]:
        spec = model.inputs[0]
        if self.source.kind == "sensor":
            tensor = frame.data[None] if model.max_batch_size > 0 else frame.data
            return {spec.name: np.ascontiguousarray(tensor, spec.dtype)}, None, None
        batched = model.max_batch_size > 0
        cfg = image_preprocess(model.config.preprocess, model.label, spec, batched)
        buffer = self._free.pop() if self._free else None
        tensor, geometry = preprocess(frame.data, cfg, spec, buffer)
        inputs = {spec.name: tensor if batched else tensor[0]}
        if len(model.inputs) > 1:  # D-FINE's orig_target_sizes beside the image
            inputs.update(size_inputs(model.inputs, tensor, cfg.layout, batched))
        return inputs, geometry, tensor

    def _finish(self, item: _InFlight, outputs: Outputs) -> None:
        inference_ms = (self.clock() - item.submitted) * 1000
        self._release(item.buffer)
        try:
            post, backend = self._per_version(item.model)
            results = post(outputs, item.geometry)
        except EdgedError as exc:
            self._failed(item.frame, None, exc)
            return
        if self.cascades and item.geometry is not None:
            self._run_cascades(item.frame, results)
        if self.gate is not None:
            self._answer = (results, item.geometry)
        frame = item.frame
        if self.states is not None and item.geometry is not None:
            self.states.frame(frame.data, frame.captured, frame.captured_mono)
        found = results.get("detections")
        if self.events is not None:
            self.events.frame(frame.captured, found if isinstance(found, Detections)
                              else Detections.empty(),
                              frame.data if item.geometry is not None else None)
        now = self.clock()
        latency_ms = (now - frame.captured_mono) * 1000
        message: dict[str, Any] = {
            "stream": self.cfg.name, "seq": frame.seq, "capture_ts": round(frame.captured, 6),
            "publish_ts": round(time.time(), 6), "model": item.model.name,
            "version": item.model.version,
            "backend": backend,
            "latency_ms": round(latency_ms, 3), "inference_ms": round(inference_ms, 3),
            "results": published(results)}
        if item.geometry is not None:
            width, height = item.geometry.frame_size
            message["frame"] = {"width": width, "height": height}
            if self.cfg.masks == "rle" and "detections" in message["results"]:
                encode_rows(message["results"]["detections"], width, height)
        if self.states is not None:
            now_states = self.states.view()
            if now_states:
                message["states"] = now_states
        with self._lock:
            self.stats.processed += 1
            self._latencies.append(latency_ms)
        if self.live is not None and item.geometry is not None:  # a reference, no drawing
            self.live.record(frame.seq, frame.captured, frame.data, results,
                             self.events.visible if self.events is not None else None)
        # Per frame: DEBUG (at INFO the terminal's status line shows the stream instead).
        if self.cfg.log_results and (self.publish is not None or self.events is None) \
                and logger.isEnabledFor(logging.DEBUG):
            logger.debug("stream %s #%d: %s (%.1f ms)", self.cfg.name, frame.seq,
                         summarize(results), latency_ms,
                         extra={"stream": self.cfg.name, "model": item.model.name,
                                "version": item.model.version})
        if self.publish is not None:
            self.publish(self.cfg.name, compact(message))

    def _hold(self, item: _InFlight) -> None:
        """A frame the gate kept from the model: its picture is the one the model last saw,
        so that answer holds. The events stage gets the answer's detections again at this
        frame's time (objects stay alive where they were; no snapshot from an unseen frame),
        the live view gets the frame; nothing is published for it, and no latency counted."""
        with self._lock:
            self.stats.gated += 1
        if self._answer is None:  # nothing answered yet (the model failed so far)
            return
        results, geometry = self._answer
        frame = item.frame
        if self.states is not None and geometry is not None:
            self.states.frame(frame.data, frame.captured, frame.captured_mono)
        if self.events is not None:
            found = results.get("detections")
            self.events.frame(frame.captured, found if isinstance(found, Detections)
                              else Detections.empty(), None)
        if self.live is not None and geometry is not None:
            self.live.record(frame.seq, frame.captured, frame.data, results,
                             self.events.visible if self.events is not None else None)

    def _run_cascades(self, frame: Frame, results: dict[str, Any]) -> None:
        """Secondary models on this frame's detections. A failure is counted and logged; the
        frame is still published with what the primary model found."""
        try:
            run_all(self.cascades, frame.data, results)
        except EdgedError as exc:
            with self._lock:
                self.stats.secondary_failed += 1
                count = self.stats.secondary_failed
            if worth_logging(count):
                logger.warning("stream %s: secondary model failed on frame %d (#%d): %s",
                               self.cfg.name, frame.seq, count, exc,
                               extra={"stream": self.cfg.name, "code": exc.code})

    def _per_version(self, model: ModelVersion) -> tuple[Postprocessor, str]:
        """Post-processing and backend name of the version that ran, worked out once per
        version (a new one brings its own config), not once per frame."""
        if self._version is None or self._version[0] is not model:
            self._version = (model, Postprocessor(model.config.postprocess, model.dir.parent,
                                                  model.head),
                             self.backend_of(model.name, model.version))
        return self._version[1], self._version[2]

    def _release(self, buffer: np.ndarray | None) -> None:
        """Back to the stream's pool: the batch that read it is done with it."""
        if buffer is not None and len(self._free) < self.cfg.in_flight:
            self._free.append(buffer)

    def _failed(self, frame: Frame, buffer: np.ndarray | None, error: EdgedError) -> None:
        self._release(buffer)
        if self.gate is not None:  # the model has not seen this picture: the next frame goes
            self.gate.reset()
        with self._lock:
            self.stats.failed += 1
            self.stats.last_error = str(error)
            count = self.stats.failed
        if worth_logging(count):
            logger.warning("stream %s: frame %d failed (#%d): %s", self.cfg.name, frame.seq,
                           count, error, extra={"stream": self.cfg.name,
                                                "model": self.cfg.model, "code": error.code})

    def running_s(self) -> float:
        return 0.0 if self.started_at is None else self.clock() - self.started_at

    def heartbeat(self) -> tuple[str, float | None]:
        """When the loop last came round (it does at least every 0.2 s); None once stopped."""
        return f"stream {self.cfg.name}: processing loop", self._beat

    def read_stats(self) -> StreamStats:
        """Counters for the stats message, status and metrics (rates are computed by whoever
        samples them)."""
        with self._lock:
            latencies = np.array(self._latencies, np.float64)
            counts = self.stats
            processed, failed, secondary = counts.processed, counts.failed, \
                counts.secondary_failed
            frame_error, gated = counts.last_error, counts.gated
        latency = Percentiles.of(latencies)
        source = self.source.read_stats()
        events = self.events.read_stats() if self.events is not None else None
        return StreamStats(processed, failed, secondary, frame_error, source, events, latency,
                           gated)

    def view(self) -> dict[str, Any]:
        """What a person looks at (the status report, the page, the terminal): fps now, the
        last answer, objects and the last event, whether there are pictures."""
        live = self.live
        row: dict[str, Any] = {"picture": live is not None, "fps": None, "last_result": None}
        if live is not None:
            fps = live.fps()
            row["fps"] = None if fps is None else round(fps, 2)
            row["viewers"] = live.viewers
            seen = live.latest
            row["last_result"] = answer_of(seen.results) if seen is not None else None
        if self.events is not None:
            row.update(self.events.tally.view())
        if self.states is not None:  # (read across threads: each value is whole when read)
            row["states"] = self.states.view()
        return row


def summarize(results: dict[str, Any]) -> str:
    """One short line for the log."""
    if "classes" in results:
        return ", ".join(f"{c['label']} {c['score']:.2f}" for c in results["classes"])
    if "detections" in results:
        found = results["detections"]
        best = zip(found.labels[:3], found.scores[:3].tolist(), strict=True)
        return f"{len(found)} detections" + (
            ": " + ", ".join(f"{label} {score:.2f}" for label, score in best) if found else "")
    return ", ".join(f"{name} {entry['shape']}" for name, entry in results["outputs"].items())
