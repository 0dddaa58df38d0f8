"""The events room in the running daemon: an `EventsStage` per detect stream runs its
`StreamEvents` on the stream's own thread (after post-processing and cascades) and hands what
changed to its `EventPublisher`; the `EventsHub` makes the stages, keeps Home Assistant's
discovery configs in step with the streams, and has every stage publish its whole retained
state again after the MQTT link reconnects.

A stage's engine is only ever touched by its stream's thread: a reconnect (paho's thread)
raises a flag that the stream's loop acts on when it next comes round (at least every 0.2 s).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from edged.describer.config import StreamDescribeConfig
from edged.describer.prompt import Subject
from edged.events.config import check_labels
from edged.events.discovery import (
    DeviceInfo,
    recognition_configs,
    state_configs,
    stream_configs,
)
from edged.events.engine import Changes, StreamEvents
from edged.events.path import Paths
from edged.events.presence import Name
from edged.events.publish import EventPublisher, Publish
from edged.events.store import SnapshotStore
from edged.events.tally import RecentEvents, Tally
from edged.processing.detections import Detections
from edged.recording.clips import ClipRecorder
from edged.sources import worth_logging
from edged.streams.config import StreamConfig
from edged.streams.live import Visible
from edged.streams.presence_hub import DEFAULT_OFF_DELAY_S, PresenceHub
from edged.streams.stats import EventsStats, Percentiles

logger = logging.getLogger(__name__)

# Hands an ended event to the describer (edged/describer: it queues, never waits); True when
# it was queued.
Describe = Callable[[Subject, StreamDescribeConfig], bool]

_STAGES = itertools.count(1)  # (presence keys)
TIMES_WINDOW = 1024  # frames whose events time the stats' percentiles cover
MIN_STALL_S = 0.5  # an idle stream ends its objects after max(track.max_age_s, this)


class Link(Protocol):
    """What the hub needs of the MQTT link (edged.mqtt.link.MqttLink)."""

    def publish(self, kind: Literal["events"], suffix: str, payload: bytes, *,
                retain: bool = False) -> None: ...

    def publish_to(self, kind: Literal["discovery"], topic: str, payload: bytes, *,
                   retain: bool = False) -> None: ...


class EventsStage:
    """One detect stream's events. `frame` for each processed frame, `tick` each time round
    the stream's loop, `close` once when the stream stops; all on the stream's thread."""

    def __init__(self, cfg: StreamConfig, publisher: EventPublisher, *,
                 on_close: Callable[[EventsStage], None] = lambda stage: None,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time,
                 recent: RecentEvents | None = None,
                 clips: ClipRecorder | None = None,
                 activity: Callable[[float], None] | None = None,
                 describe: Describe | None = None,
                 present: Callable[[str, frozenset[Name]], None] | None = None) -> None:
        """`recent`: the daemon's list of recent objects, which this stage's events join;
        `clips`: the stream's clip recorder (None: no clips), told of the objects that
        `clips.labels`/`clips.zones` pick, whose events then name their clip; `activity`:
        told the capture time of each frame with tracked objects in view (continuous
        recording's `active_objects` mode); `describe`: given each ended object (its data,
        best snapshot and path) when the stream's `describe.enabled` (None: not described);
        `present`: told the (kind, name) pairs of the stream's live objects whenever they
        change (presence of faces and known plates)."""
        self.cfg = cfg
        self.engine = StreamEvents(cfg.name, cfg, keep_plates=publisher.store is not None)
        self.publisher = publisher
        self.on_close = on_close
        self.clock = clock
        self.wall = wall
        self.stall_s = max(cfg.track.max_age_s, MIN_STALL_S)
        self._last = clock()  # when the engine last saw a frame (or the lack of one)
        self._republish = threading.Event()
        self._lock = threading.Lock()  # the timing window only; never held while computing
        self._times: deque[float] = deque(maxlen=TIMES_WINDOW)
        self._closed = False
        self.failed = 0  # frames the stage failed on (a bug; logged)
        self.tally = Tally()
        self.recent = recent
        self.visible: tuple[Visible, ...] = ()  # the objects in the last frame (live view)
        self.clips = clips
        self.activity = activity
        self._clipped: set[str] = set()  # objects the recorder was told of, until their end
        self.describe = describe if cfg.describe.enabled else None
        self.paths = Paths()  # where each object went, while it is described at its end
        self.present = present
        self._present: frozenset[Name] = frozenset()  # as last told
        # whom presence hears it as: this stage, not its stream's name (a reload's new stage
        # may start before the old one's last word, and must not be cancelled by it)
        self._present_as = f"{cfg.name}#{next(_STAGES)}"

    def frame(self, frame_time: float, detections: Detections,
              frame: np.ndarray | None) -> None:
        """A processed frame: its capture time, detections (with the cascades' sub_labels)
        and pixels (None: no snapshots from it)."""
        start = time.perf_counter()
        try:
            self._report(self.engine.update(frame_time, detections, frame))
            self.visible = tuple((obj.id, obj.label, obj.score, obj.box, obj.sub_label)
                                 for obj in self.engine.seen)
            if self.visible and self.activity is not None:
                self.activity(frame_time)
            if self.describe is not None:
                self.paths.observe(frame_time, ((obj.id, obj.box) for obj in self.engine.seen))
        except Exception as exc:  # a bug here must not stop the stream's results
            self._failed(exc)
        elapsed_ms = (time.perf_counter() - start) * 1000
        self._last = self.clock()
        with self._lock:
            self._times.append(elapsed_ms)

    def tick(self, idle: bool) -> None:
        """The whole retained state again when a reconnect asked for it; and when the stream
        is `idle` (no frame in the model) and no frame came for `stall_s`, an empty frame
        now, so that objects of a stalled source end. Not sooner: an empty frame also drops
        tentative objects, which a slow but live source must keep."""
        if self._republish.is_set():
            self._republish.clear()
            engine = self.engine
            self.publisher.state(engine.counts(), engine.zone_counts(), engine.line_totals())
            self.publisher.recognized()
        if idle and self.clock() - self._last > self.stall_s:
            self._last = self.clock()
            try:
                self._report(self.engine.update(self.wall(), Detections.empty(), None))
            except Exception as exc:
                self._failed(exc)

    def close(self) -> None:
        """End every object (counts go to 0) and publish that; the stream is stopping."""
        if self._closed:
            return
        self._closed = True
        try:
            self._report(self.engine.flush())
        finally:
            if self.present is not None and self._present:  # (a flush that failed: its names
                self._present = frozenset()                  # would stay on until a restart)
                self.present(self._present_as, self._present)
            if self.clips is not None:
                self.clips.close()
            self.on_close(self)

    def request_republish(self) -> None:
        """From any thread: publish the whole retained state when the loop next comes round."""
        self._republish.set()

    def read_stats(self) -> EventsStats:
        """The events stage's counters for the stream's stats."""
        with self._lock:
            times = np.array(self._times, np.float64)
        return EventsStats(self.publisher.messages, self.failed, Percentiles.of(times))

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self.failed += 1
            count = self.failed
        if worth_logging(count):
            logger.error("stream %s: the events stage failed (#%d)", self.cfg.name, count,
                         exc_info=exc, extra={"stream": self.cfg.name, "code": "events_failed"})

    def _report(self, changes: Changes) -> None:
        if self.present is not None:  # (before the check: an object dropped is no change)
            names = self.engine.present()
            if names != self._present:
                self._present = names
                self.present(self._present_as, names)
        if not changes:
            return
        if self.clips is not None:
            self._name_clips(changes.events)
        self.publisher.changes(changes)
        now = self.wall()
        self.tally.add(changes, now)
        if self.recent is not None:
            self.recent.add(changes, now)
        if self.describe is not None:
            self._describe(changes)
        if self.cfg.log_results:
            for event in changes.events:
                if event["type"] != "update":
                    after = event["after"]
                    logger.info("stream %s: %s %s %s%s", self.cfg.name, event["type"],
                                after["label"], after["id"],
                                f" (zones: {', '.join(after['entered_zones'])})"
                                if after["entered_zones"] else "",
                                extra={"stream": self.cfg.name})

    def _describe(self, changes: Changes) -> None:
        """Each ended object to the describer: its end's data, best snapshot, path and the
        lines it crossed."""
        assert self.describe is not None
        for event in changes.events:
            if event["type"] == "end":
                object_id = event["after"]["id"]
                self.describe(Subject(object_id, self.cfg.name, event["after"],
                                      changes.final_snapshots.get(object_id),
                                      tuple(self.paths.take(object_id)),
                                      tuple(changes.final_crossings.get(object_id, ()))),
                              self.cfg.describe)

    def _name_clips(self, events: list[dict]) -> None:
        """Tell the recorder of objects that want a clip, and name it in their events:
        `has_clip` on each, and on the `end` the clip's id, URL and span."""
        assert self.clips is not None
        cfg = self.cfg.clips
        for event in events:
            after = event["after"]
            object_id = after["id"]
            if event["type"] == "end":
                # (told of its end whether or not a clip could start: the recorder may have
                # started one for it later, at a keyframe, and must not wait for it forever)
                ref = self.clips.object_ended(object_id, after["end_time"]) \
                    if object_id in self._clipped else None
                self._clipped.discard(object_id)
                after["has_clip"] = ref is not None
                if ref is not None:
                    after["clip"] = ref.payload()
                continue
            if object_id not in self._clipped and wants_clip(cfg.labels, cfg.zones, after):
                self.clips.object_started(object_id, after["start_time"])
                self._clipped.add(object_id)
            after["has_clip"] = self.clips.in_clip(object_id)


def wants_clip(labels: Sequence[str], zones: Sequence[str], obj: dict) -> bool:
    """An object gets a clip when its label is one of `labels` and it entered one of
    `zones` (empty: any), as Frigate's required zones."""
    return (not labels or obj["label"] in labels) and \
        (not zones or any(z in zones for z in obj["entered_zones"]))


class EventsHub:
    """The daemon's detect streams' events: their stages, their discovery configs, and the
    snapshot store they share. `link` None: MQTT is off; `device` None: no discovery."""

    def __init__(self, link: Link | None, *, device: DeviceInfo | None,
                 store: SnapshotStore | None = None,
                 presence_off_delay_s: float = DEFAULT_OFF_DELAY_S) -> None:
        self.link = link
        self.device = device
        self.store = store  # set once the cache folder exists (Daemon.warm_up)
        self.recent = RecentEvents()  # every stage's objects, for the status page
        self.describe: Describe | None = None  # set by the daemon when it has a describer
        self._lock = threading.Lock()
        self._stages: dict[str, EventsStage] = {}
        self._discovery: dict[str, dict[str, bytes]] = {}  # stream -> topic -> config
        # (and presence's configs under a key no stream has)
        self.presence = PresenceHub(link.publish if link is not None else None, device,
                                    self.announce, off_delay_s=presence_off_delay_s)

    def stage(self, cfg: StreamConfig, known_labels: Sequence[str],
              clips: ClipRecorder | None = None,
              activity: Callable[[float], None] | None = None) -> EventsStage:
        """The events stage of a stream whose model can produce `known_labels`, its discovery
        configs published. Raises ConfigError when `labels:` (or `clips.labels:`) names one the
        model has not."""
        if known_labels:
            check_labels(cfg.labels, known_labels, path="")
            if cfg.clips.enabled:
                check_labels(cfg.clips.labels, known_labels, path="clips")
        publish: Publish | None = self.link.publish if self.link is not None else None
        stage = EventsStage(cfg, EventPublisher(cfg.name, publish, self.store),
                            on_close=self._closed, recent=self.recent, clips=clips,
                            activity=activity, describe=self.describe,
                            present=self.presence.seen)
        with self._lock:
            self._stages[cfg.name] = stage
        labels = list(cfg.labels) or list(known_labels)
        if not labels:
            logger.info("stream %s: its model names no labels, so Home Assistant gets no "
                        "entities for it (set labels:)", cfg.name)
        self.announce(cfg.name, stream_configs(
            self.device, cfg.name, labels, [z.name for z in cfg.zones],
            [ln.name for ln in cfg.lines], cfg.snapshots.enabled)
            | state_configs(self.device, cfg.name, [s.name for s in cfg.states])
            | recognition_configs(self.device, cfg.name,
                                  faces=any(s.as_ == "identity" for s in cfg.secondary),
                                  plates=cfg.lpr.enabled)
            if self.device else {})
        self.presence.plates_known(cfg.name, cfg.lpr.known_plates if cfg.lpr.enabled else ())
        return stage

    def stages(self) -> dict[str, EventsStage]:
        with self._lock:
            return dict(self._stages)

    def announce(self, stream: str, configs: dict[str, bytes]) -> None:
        """Publish the stream's discovery configs; those it had before and has no more are
        removed (a reload that dropped a zone)."""
        with self._lock:  # (sent under the lock: a republish cannot overtake a removal)
            before = self._discovery.get(stream, {})
            self._discovery[stream] = configs
            for topic in before.keys() - configs.keys():
                self._send(topic, b"")
            for topic, payload in configs.items():
                if before.get(topic) != payload:
                    self._send(topic, payload)

    def withdraw(self, stream: str) -> None:
        """Remove the stream's entities from Home Assistant (it is gone after a reload)."""
        self.announce(stream, {})
        with self._lock:
            self._discovery.pop(stream, None)
        self.presence.plates_known(stream, ())

    def republish(self) -> None:
        """After a reconnect (paho's thread): every discovery config now, and every stage's
        retained state when its loop next comes round."""
        with self._lock:  # (the configs sent under the lock, as `announce` sends: an old
            # config copied here cannot reach the broker after the removal that replaced it)
            for c in self._discovery.values():
                for topic, payload in c.items():
                    self._send(topic, payload)
            stages = list(self._stages.values())
        for stage in stages:
            stage.request_republish()
        self.presence.republish()

    def rediscover(self, _topic: str, payload: bytes) -> None:
        """Home Assistant's birth message (`<discovery prefix>/status`): it (re)started and
        wants the discovery configs again."""
        if payload.strip() == b"online":
            with self._lock:
                for c in self._discovery.values():
                    for topic, config in c.items():
                        self._send(topic, config)

    def _send(self, topic: str, payload: bytes) -> None:
        if self.link is not None:
            self.link.publish_to("discovery", topic, payload, retain=True)

    def _closed(self, stage: EventsStage) -> None:
        with self._lock:
            if self._stages.get(stage.cfg.name) is stage:
                del self._stages[stage.cfg.name]


def open_store(directory: Path, budget_mb: int) -> SnapshotStore | None:
    """Objects' snapshots on disk (`cache.snapshots_mb`); None when none are kept, or the
    folder cannot be used (logged: the streams run without it)."""
    if budget_mb == 0:
        return None
    try:
        store = SnapshotStore(directory, budget_mb * 1024 * 1024)
    except OSError as exc:
        logger.error("snapshots are not kept on disk: %s: %s", directory, exc,
                     extra={"code": "snapshots_unavailable"})
        return None
    logger.info("snapshots: %d kept in %s (%.1f of %d MiB)", len(store.list()), directory,
                store.used_bytes / 2**20, budget_mb)
    return store
