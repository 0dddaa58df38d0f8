"""The daemon's streams as one set: a pipeline per configured stream, started together,
stopped in order (captures first, then the frames in the model), and restarted by name on a
reload while the others keep flowing. What a stream publishes is settled when it starts, by
its model's kind: a detect stream gets an events stage (and then, by default, publishes no
per-frame results, and a change gate), the others publish every frame's results. Status,
metrics, stats and the health tick read it through immutable snapshots, never through a list
they could change."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

from edged.core.errors import ConfigError, ConfigIssue, EdgedError, InvalidModel
from edged.core.states import SourceState
from edged.events.config import outputs
from edged.events.discovery import state_configs
from edged.inference.scheduler import Scheduler
from edged.model.config import PostprocessConfig
from edged.model.repository import ModelVersion
from edged.processing.post import Postprocessor
from edged.recording.clips import Announce, ClipRecorder
from edged.recording.segments import PacketTee, SegmentRecorder
from edged.recording.store import ClipStore
from edged.sources import SensorLink, Source, open_source
from edged.sources.sensor import Subscribe
from edged.streams.cascade import Cascade
from edged.streams.config import SecondaryConfig, StreamConfig
from edged.streams.events_stage import EventsHub, EventsStage
from edged.streams.face_cascade import FaceCascade
from edged.streams.faces import FaceService
from edged.streams.gate import ChangeGate, wanted
from edged.streams.live import LiveView
from edged.streams.pipeline import Publish, StreamPipeline
from edged.streams.plate_cascade import PlateCascade
from edged.streams.states import States, StateWatcher
from edged.streams.stats import StreamStats
from edged.tasks import BOXED_TASKS

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 10.0  # a stopped stream's frames in the model finish within this
SOURCE_STOP_S = 5.0  # a stopped stream's capture call returns within this


class StreamSet:
    def __init__(self, scheduler: Scheduler, publish: Publish | None, *,
                 subscribe: Subscribe | None = None,
                 unsubscribe: Callable[[str], None] | None = None,
                 backend_of: Callable[[str, int], str] | None = None,
                 events: EventsHub | None = None, live_viewers: int = 4,
                 clip_store: Callable[[], ClipStore | None] = lambda: None,
                 announce_clip: Announce | None = None,
                 faces: Callable[[], FaceService | None] = lambda: None) -> None:
        """`publish` takes each result; `subscribe`/`unsubscribe` are the MQTT link's, for
        sensor streams (None while MQTT is off); `backend_of` names what runs a version;
        `events` makes detect streams' events stages (None: no events); `live_viewers`: live
        MJPEG viewers per stream at once; `clip_store` gives the store clips go into (None:
        none are kept), `announce_clip` publishes each finished clip."""
        self.scheduler = scheduler
        self.live_viewers = live_viewers
        self.events = events
        self.publish = publish
        self.subscribe = subscribe
        self.unsubscribe = unsubscribe
        self.backend_of = backend_of
        self.clip_store = clip_store
        self.announce_clip = announce_clip
        self.faces = faces  # the face pipeline, for `as: identity` cascades (None: off)
        self._lock = threading.Lock()  # changes of the set; readers take the tuple as it is
        self._pipelines: tuple[StreamPipeline, ...] = ()

    def pipelines(self) -> tuple[StreamPipeline, ...]:
        return self._pipelines

    def start(self, configs: Iterable[StreamConfig]) -> int:
        """Start a pipeline per config. A stream whose model or source is unusable is logged
        and left out; the others run. Returns how many started."""
        started = [p for p in map(self._open, configs) if p is not None]
        with self._lock:
            self._pipelines = (*self._pipelines, *started)
        return len(started)

    def restart(self, stop: Iterable[str], start: Iterable[StreamConfig]) -> None:
        """Stop the streams named, then start the ones given; the rest are not touched (their
        frames keep flowing)."""
        names = set(stop)
        with self._lock:  # out of the set first: stats and the health tick stop looking
            gone = [p for p in self._pipelines if p.cfg.name in names]
            self._pipelines = tuple(p for p in self._pipelines if p not in gone)
        self._stop(gone)
        for pipeline in gone:
            logger.info("reload: stream %s stopped", pipeline.cfg.name,
                        extra={"stream": pipeline.cfg.name})
        for cfg in start:
            if self.start([cfg]):
                logger.info("reload: stream %s started (%s → %s)", cfg.name, cfg.source,
                            cfg.model, extra={"stream": cfg.name})
        running = {p.cfg.name for p in self._pipelines}
        if self.events is not None:  # gone, or failed to start again: out of Home Assistant
            for name in names - running:
                self.events.withdraw(name)

    def stop(self) -> None:
        """Stop every stream: captures first, then the frames already in the model finish."""
        self._stop(self._pipelines)

    def _stop(self, pipelines: Iterable[StreamPipeline]) -> None:
        pipelines = list(pipelines)
        for pipeline in pipelines:
            if not pipeline.stop_source(SOURCE_STOP_S):
                logger.warning("stream %s: capture did not stop in %.0f s", pipeline.cfg.name,
                               SOURCE_STOP_S)
        for pipeline in pipelines:
            if not pipeline.stop(DRAIN_TIMEOUT_S):
                logger.warning("stream %s: frames still in the model after %.0f s",
                               pipeline.cfg.name, DRAIN_TIMEOUT_S)

    def _open(self, cfg: StreamConfig) -> StreamPipeline | None:
        try:
            model = self.scheduler.model(cfg.model)
            spec = model.inputs[0]
            sample = spec.shape[1:] if model.max_batch_size > 0 else spec.shape
            cascades = self._cascades(cfg, model)
            states = self._states(cfg)
            # Without a hub nothing tracks: every frame's results, as before events.
            publish = cfg.publish if self.events is not None else \
                dataclasses.replace(cfg.publish, events=False)
            output = outputs(publish, (model.config.postprocess or PostprocessConfig()).kind)
            recorder = self._recorder(cfg, output.events)
            segments = self._segments(cfg, output.events)
            sinks = [s for s in (recorder, segments) if s is not None]
            source = open_source(cfg, SensorLink(self.subscribe, self.unsubscribe, sample,
                                                 spec.dtype),  # (started by the pipeline)
                                 sinks[0] if len(sinks) == 1 else
                                 PacketTee(sinks) if sinks else None)
            events = self._events(cfg, model, recorder, segments) \
                if output.events else None  # the last check
        except EdgedError as exc:
            logger.error("stream %s is not started: %s", cfg.name, exc,
                         extra={"stream": cfg.name, "model": cfg.model, "code": exc.code})
            return None
        live = None if source.kind == "sensor" else \
            LiveView(cfg, state=lambda: str(source.state), max_viewers=self.live_viewers)
        gate = None
        if wanted(cfg.gate, tracking=events is not None, frames=output.frames,
                  pictures=source.kind != "sensor"):
            gate = ChangeGate(cfg.gate)
            logger.info("stream %s: change gate on (frames go to the model when over %g of "
                        "the picture changed, at least every %g s)", cfg.name,
                        cfg.gate.threshold, cfg.gate.max_skip_s, extra={"stream": cfg.name})
        if events is None and states is not None and self.events is not None \
                and self.events.device is not None:  # (a stage announces its own)
            self.events.announce(cfg.name, state_configs(self.events.device, cfg.name,
                                                         [s.name for s in cfg.states]))
        motion = segments.activity if segments is not None and \
            cfg.record.mode == "motion" else None
        pipeline = StreamPipeline(cfg, source, self.scheduler,
                                  self.publish if output.frames else None,
                                  backend_of=self.backend_of, cascades=cascades, events=events,
                                  live=live, gate=gate, motion=motion, states=states)
        pipeline.start()
        return pipeline

    def _events(self, cfg: StreamConfig, model: ModelVersion, recorder: ClipRecorder | None,
                segments: SegmentRecorder | None) -> EventsStage:
        """The stream's events stage, its `labels:` checked against the model's (ConfigError
        names those it cannot produce: the stream is then not started)."""
        assert self.events is not None  # (output.events is false without a hub)
        known = Postprocessor(model.config.postprocess, model.dir.parent, model.head).labels
        activity = segments.activity if segments is not None and \
            cfg.record.mode == "active_objects" else None
        return self.events.stage(cfg, known, clips=recorder, activity=activity)

    def _recorder(self, cfg: StreamConfig, events: bool) -> ClipRecorder | None:
        """The stream's clip recorder when it keeps clips (and can: its objects' events are
        what start them, and the store must be open)."""
        if not cfg.clips.enabled:
            return None
        store = self.clip_store()
        if store is None or not events:
            logger.warning("stream %s: no clips: %s", cfg.name,
                           "the recording folder is not open (see the log)" if store is None
                           else "clips follow tracked objects' events, which this stream has "
                                "not", extra={"stream": cfg.name, "code": "clips_off"})
            return None
        return ClipRecorder(cfg.name, cfg.clips, store, self.announce_clip)

    def _segments(self, cfg: StreamConfig, events: bool) -> SegmentRecorder | None:
        """The stream's continuous recording, when asked for and the store is open."""
        if not cfg.record.enabled:
            return None
        if cfg.record.mode == "active_objects" and not events:
            logger.warning("stream %s: record.mode active_objects keeps segments with tracked "
                           "objects in view, and this stream tracks none: nothing will be kept",
                           cfg.name, extra={"stream": cfg.name, "code": "clips_off"})
        store = self.clip_store()
        if store is None:
            logger.warning("stream %s: not recording: the recording folder is not open (see "
                           "the log)", cfg.name, extra={"stream": cfg.name, "code": "clips_off"})
            return None
        return SegmentRecorder(cfg.name, cfg.record, store)

    def _cascades(self, cfg: StreamConfig, model: ModelVersion) -> list[Cascade]:
        """The stream's secondary models, each checked (EdgedError names the first that
        cannot run: the stream is then not started)."""
        if not cfg.secondary:
            return []
        kind = (model.config.postprocess or PostprocessConfig()).kind
        if kind not in BOXED_TASKS or cfg.source.startswith("mqtt://"):
            raise InvalidModel(f"stream {cfg.name}: secondary models crop detections, but "
                               f"{model.label} is a {kind} model"
                               + (" on a sensor stream" if kind in BOXED_TASKS else ""))
        return [self._cascade(cfg, secondary) for secondary in cfg.secondary]

    def _cascade(self, cfg: StreamConfig, secondary: SecondaryConfig) -> Cascade:
        if secondary.as_ == "plate":
            return PlateCascade(secondary, self.scheduler, priority=cfg.priority)
        if secondary.as_ != "identity":
            return Cascade(secondary, self.scheduler, priority=cfg.priority)
        faces = self.faces()
        if faces is None:
            raise InvalidModel(f"stream {cfg.name}: `as: identity` needs the face pipeline, "
                               "which is not running (faces.enabled: false, or its gallery "
                               "could not be opened: see the log)")
        return FaceCascade(secondary, self.scheduler, faces, stream=cfg.name,
                           priority=cfg.priority)

    def _states(self, cfg: StreamConfig) -> States | None:
        """The stream's classified regions, each model checked (ConfigError names a state
        whose model is no classifier: the stream is then not started). Their changes go out
        on the events' MQTT class."""
        if not cfg.states:
            return None
        if cfg.source.startswith("mqtt://"):
            raise ConfigError([ConfigIssue(f"stream {cfg.name}: states", "states classify "
                                           "regions of pictures; mqtt:// sensor streams have "
                                           "none")])
        link = self.events.link if self.events is not None else None
        send = None if link is None else (
            lambda suffix, payload, retain: link.publish("events", suffix, payload,
                                                         retain=retain))
        return States([StateWatcher(cfg.name, state, f"stream {cfg.name}: states[{j}]",
                                    self.scheduler,
                                    send, priority=cfg.priority)
                       for j, state in enumerate(cfg.states)])

    # -- what the rest of the daemon reads ---------------------------------------------------
    def up(self) -> tuple[int, int]:
        """(streams whose source is streaming, streams)."""
        pipelines = self._pipelines
        return sum(1 for p in pipelines if p.source.state is SourceState.STREAMING), \
            len(pipelines)

    def beats(self) -> list[StreamPipeline | Source]:
        """The threads the health tick watches: each stream's loop and capture thread."""
        return [part for p in self._pipelines for part in (p, p.source)]

    def read_stats(self) -> dict[str, StreamStats]:
        """Each stream's counters by name (metrics)."""
        return {p.cfg.name: p.read_stats() for p in self._pipelines}

    def describe(self) -> dict[str, dict[str, Any]]:
        """Each stream's source, model, running time, counters, what a person looks at, and
        its zones and lines (the status report; the page's zone helper starts from them)."""
        return {p.cfg.name: {"source": p.cfg.source, "model": p.cfg.model,
                             "running_s": round(p.running_s(), 1),
                             **p.read_stats().as_dict(), **p.view(),
                             "zones": [dataclasses.asdict(z) for z in p.cfg.zones],
                             "lines": [dataclasses.asdict(ln) for ln in p.cfg.lines]}
                for p in self._pipelines}

    def live(self, name: str) -> LiveView | None:
        """The running stream's live view (None: no such stream, or one without pictures)."""
        for pipeline in self._pipelines:
            if pipeline.cfg.name == name:
                return pipeline.live
        return None

    def looks(self) -> dict[str, dict[str, Any]]:
        """Per stream, what /metrics adds to its counters: the events' totals (detect
        streams that track), live viewers and pictures drawn."""
        rows: dict[str, dict[str, Any]] = {}
        for p in self._pipelines:
            row: dict[str, Any] = {}
            if p.events is not None:
                row["events"] = p.events.tally.totals()
            if p.live is not None:
                row["live"] = {"viewers": p.live.viewers, "pictures": p.live.pictures}
            rows[p.cfg.name] = row
        return rows
