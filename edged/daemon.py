"""The composition root: builds the repository, cache, scheduler, socket API, MQTT link and
stream pipelines from config, runs them on one asyncio loop, tells systemd how it is going
(ready, status, watchdog, reloading, stopping), applies a re-read config on SIGHUP, and shuts
down in order with every wait bounded."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from edged import __version__
from edged.api.remote import RemoteInference
from edged.api.remote_generate import RemoteGenerate
from edged.api.server import ApiServer
from edged.api.shm import ShmRegistry
from edged.config import DaemonConfig
from edged.core.errors import ConfigError, RecordingUnavailable
from edged.describer.service import open_describer
from edged.events.discovery import DeviceInfo
from edged.hardware import host
from edged.hardware.tegra import TegraStats
from edged.inference.cache import ModelCache
from edged.inference.generation import Generations
from edged.inference.loadspec import backend_options
from edged.inference.responses import ResponseCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.mqtt import topics
from edged.mqtt.link import MqttLink
from edged.mqtt.requests import RemoteRequests
from edged.ota.install import Event, Updater
from edged.ota.local import LocalInstalls
from edged.ota.manifest import TrustStore
from edged.ota.progress import OtaProgress
from edged.ota.service import OtaService
from edged.ota.shadows import ShadowHooks
from edged.recording.store import ClipStore, open_clips, retention_loop
from edged.reload import plan as reload_plan
from edged.service.describer_metrics import DescriberCollector
from edged.service.face_metrics import FacesCollector
from edged.service.generation_metrics import GenerationCollector
from edged.service.health import HealthMonitor, RecentErrors
from edged.service.loops import health_loop, report_loop, status_loop
from edged.service.metrics import Metrics
from edged.service.reporting import Reporter, throttle_warning
from edged.service.status import DaemonStatus
from edged.service.statusline import StatusLines, TerminalStatus
from edged.service.systemd import Notifier, activated_unix_socket, listen_fds
from edged.streams.events_stage import EventsHub, open_store
from edged.streams.faces import FaceService, open_faces
from edged.streams.pipeline import StreamPipeline
from edged.streams.streamset import StreamSet

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 10.0
UNLOAD_TIMEOUT_S = 5.0
MQTT_STOP_S = 3.0
OTA_STOP_S = 10.0
REQUESTS_STOP_S = 2.0
DESCRIBER_STOP_S = 2.0


class Daemon:
    def __init__(self, config: DaemonConfig, *,
                 reload_config: Callable[[], DaemonConfig] | None = None,
                 notifier: Notifier | None = None,
                 terminal: TerminalStatus | None = None) -> None:
        """`reload_config` reads the config again (SIGHUP); None: reloading is refused.
        `terminal`: stderr's log handler on a terminal, under which the streams' status
        lines are redrawn (None: a summary line per interval instead)."""
        self.config = config
        self.terminal = terminal
        self.reload_config = reload_config
        self.notifier = notifier or Notifier()
        self.repository = ModelRepository(config.models_dir)
        self.cache = ModelCache(
            self.repository,
            budget_bytes=config.cache.budget_mb * 1024 * 1024,
            options=backend_options(config.backends.onnxruntime, config.cache.dir,
                                    memory=config.backends.memory,
                                    tensorrt=config.backends.tensorrt),
            pinned=config.cache.pinned,
            default_backend=config.backends.default,
        )
        shortcuts = config.api.shortcuts
        self.responses = ResponseCache(config.cache.responses_mb * 1024 * 1024)
        self.cache.session_gone.append(self.responses.forget)
        self.scheduler = Scheduler(self.cache, responses=self.responses
                                   if self.responses.enabled and "response_cache" in shortcuts
                                   else None)
        self.repository.on_version_removed(self.scheduler.retire)
        # language models' queues (model.gguf); they yield to the cameras' inference
        self.generations = Generations(self.cache, working=self.scheduler.working)
        self.shm = ShmRegistry(copy_inputs=config.api.shm_copy_inputs
                               if "shm_views" in shortcuts else "always")
        self.mqtt = (MqttLink(config.mqtt, prefix=config.mqtt_prefix,
                              client_id=f"edged-{config.device_id}")
                     if config.mqtt.enabled else None)
        discovery = config.mqtt.discovery
        self.events = EventsHub(self.mqtt, device=DeviceInfo(
            config.device_id, config.mqtt_prefix, discovery.prefix, __version__)
            if self.mqtt is not None and discovery.enabled else None,
            presence_off_delay_s=config.mqtt.presence_off_delay_s)
        if self.mqtt is not None:
            self.mqtt.on_connected(self.events.republish)
            if discovery.enabled:
                self.mqtt.subscribe(topics.under(discovery.prefix, topics.STATUS),
                                    self.events.rediscover)
        self.faces: FaceService | None = None  # opened by warm_up when faces.enabled
        self.describer = open_describer(config.describer, self.generations, self.cache,
                                        publish=self._publish_description,
                                        keep=self._keep_description)
        if self.describer is not None:  # ended events of streams with describe.enabled
            self.events.describe = self.describer.submit
        self.streams = StreamSet(
            self.scheduler, self._publish_result,
            subscribe=self.mqtt.subscribe if self.mqtt else None,
            unsubscribe=self.mqtt.unsubscribe if self.mqtt else None,
            backend_of=self.cache.serving_on, events=self.events,
            live_viewers=config.api.live_viewers, clip_store=lambda: self.clips,
            announce_clip=self._announce_clip, faces=lambda: self.faces)
        self.clips: ClipStore | None = None  # opened by warm_up when a stream keeps clips
        self._sweeps: list[asyncio.Future[None]] = []  # retention of a store a reload opened
        self.ota_progress = OtaProgress(shadows=lambda: self.updater.shadows.status())
        self.metrics = Metrics(  # streams and the link are looked up at scrape time
            self.scheduler.counters, self.cache.status, loads=self.cache.counters,
            streams=self.streams.read_stats, responses=self.responses.snapshot,
            link=self.mqtt.stats if self.mqtt is not None else None,
            looks=self.streams.looks, ota=self.ota_progress)
        self.metrics.registry.register(GenerationCollector(self.generations.statistics))
        self.metrics.registry.register(FacesCollector(
            lambda: self.faces.status() if self.faces is not None else None))
        if self.describer is not None:
            self.metrics.registry.register(DescriberCollector(self.describer.statistics))
        self.health = HealthMonitor(stall_after_s=config.health.stall_after_s,
                                    batchers=self.scheduler.batchers, beats=self.streams.beats,
                                    loaded=self.cache.ready)
        self.recent = RecentErrors()
        self.status = DaemonStatus(lambda: self.config.device_id, self.cache, self.scheduler,
                                   self.streams, self.mqtt, self.health, self.notifier,
                                   self.recent, ready=self.is_ready, ota=self._ota_status,
                                   updates=self.ota_progress.latest,
                                   generations=self.generations.statistics,
                                   describer=self.describer.statistics
                                   if self.describer is not None else lambda: None)
        self.api = ApiServer(config.api, scheduler=self.scheduler, cache=self.cache,
                             shm=self.shm, metrics=self.metrics, is_ready=self.is_ready,
                             is_live=self.status.live, status=self.status.report,
                             snapshots=lambda: self.events.store, live=self.streams.live,
                             clips=lambda: self.clips,
                             recent=lambda: self.events.recent, installs=lambda: self.local,
                             generations=lambda: self.generations,
                             faces=lambda: self.faces)
        self.updater = Updater(self.repository, self.cache, config.ota,
                               TrustStore.load(config.ota.trusted_keys), self._ota_event)
        self.ota = (OtaService(self.updater, self.mqtt, fleet_prefix=config.mqtt.fleet_prefix,
                               groups=config.ota.groups,
                               chunk_timeout_s=config.ota.chunk_timeout_s,
                               max_downloads=config.ota.max_parallel_downloads,
                               local_dirs=[config.cache.dir])
                    if self.mqtt is not None else None)
        requests = config.mqtt.requests
        self.requests = (RemoteRequests(self.mqtt, requests, RemoteInference(
            self.scheduler, self.cache, self.api.bodies, requests.max_request_mb * 1024 * 1024,
            local_dirs=[config.cache.dir]), generate=RemoteGenerate(self.generations))
            if self.mqtt is not None and requests.enabled else None)
        self.status.requests = self.requests.stats if self.requests is not None else \
            self.status.requests
        self.status.faces = lambda: self.faces.status() if self.faces is not None else None
        # Installs handed over on the socket (the Mender update module), on the same worker.
        self.local = LocalInstalls(self.updater, self.ota.defer if self.ota is not None else None)
        self.updater.shadows.hooks = ShadowHooks(
            self.scheduler.taps, self.scheduler.busy,
            self.ota.report_shadow if self.ota is not None else None,
            self.ota.defer if self.ota is not None else ShadowHooks().defer)
        self.reporter = Reporter(self.streams.pipelines, self.mqtt.stats if self.mqtt else None,
                                 self.cache.status, model_counters=self.cache.counters,
                                 inference=self.scheduler.counters)
        host.TEGRA.on_throttle(self._throttle_warning)
        self._ready = False
        self._stopping = False
        # For threads that wait on the daemon (tests, tools).
        self.ready_event = threading.Event()
        self.stopped_event = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._signals = 0
        self._reloading: asyncio.Task[bool] | None = None
        self._reload_again = False
        self.reloads = self.status.reloads

    def is_ready(self) -> bool:
        """Serving: warm, not stopping, nothing stuck (Kubernetes sends no traffic otherwise)."""
        return self._ready and not self._stopping and not self.health.problems

    def warm_up(self) -> None:
        """Undo interrupted installs (OTA recovery), then load and warm the preload list. A model
        that fails is reported and left unavailable; the others still come up."""
        self.config.cache.dir.mkdir(parents=True, exist_ok=True)
        self.events.store = open_store(self.config.cache.dir / "snapshots",
                                       self.config.cache.snapshots_mb)
        self.clips = open_clips(self.config.recording,
                                any(s.clips.enabled or s.record.enabled
                                    for s in self.config.streams))
        self.updater.recover()
        self.local.recover()
        self.cache.preload(self.config.cache.preload_names(self.repository.names()),
                           within_budget=self.config.cache.preload == "all")
        self.faces = open_faces(self.config.faces, self.config.models_dir, self.scheduler)
        if self.faces is not None:  # each enrolled name's presence sensor, kept in step
            gallery = self.faces.gallery
            gallery.watch(lambda: self.events.presence.faces_from(gallery.enrolled))
            self.events.presence.faces_from(gallery.enrolled)
        for row in self.cache.status():
            logger.info("model %s:%d %s%s", row.name, row.version, row.state,
                        f" on {', '.join(row.providers)}" if row.providers else
                        f" ({row.reason})" if row.reason else "")

    @property
    def pipelines(self) -> tuple[StreamPipeline, ...]:
        return self.streams.pipelines()

    def _publish_result(self, stream: str, payload: bytes) -> None:
        if self.mqtt is not None:
            self.mqtt.publish("results", topics.results(stream), payload)

    def _publish_description(self, object_id: str, payload: bytes) -> None:
        if self.mqtt is not None:
            self.mqtt.publish("events", topics.description(object_id), payload)

    def _keep_description(self, object_id: str, record: dict[str, Any]) -> None:
        """With the object's row in the events listing, and on disk beside its snapshot
        (what was described or failed; a skipped event's reason stays in memory only)."""
        self.events.recent.describe(object_id, record)
        store = self.events.store
        if store is not None and record["state"] != "skipped":
            store.describe(object_id, json.dumps(record, separators=(",", ":")).encode())

    def _announce_clip(self, row: dict[str, Any]) -> None:
        if self.mqtt is not None:
            self.mqtt.publish("events", topics.CLIPS, json.dumps(row).encode())

    def _ota_event(self, event: Event) -> None:
        self.local.observe(event)
        self.ota_progress.record(event)
        if self.ota is not None:
            self.ota.report(event)
        else:
            logger.info("OTA %s:%d %s %s", event.model, event.version, event.state,
                        event.detail)

    # -- running -----------------------------------------------------------------------------
    def run(self) -> None:
        try:
            import uvloop  # libuv's loop: ~1.7x the socket API's request rate here
        except ImportError:
            logger.info("uvloop is not installed; serving on asyncio's own loop")
            asyncio.run(self.main())
        else:
            uvloop.run(self.main())

    async def main(self, *, handle_signals: bool = True) -> None:
        """Serve until stopped. `handle_signals=False` for a daemon run on a thread."""
        self._loop = loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
            loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        logging.getLogger().addHandler(self.recent)
        tasks: list[asyncio.Task[None]] = []
        try:
            # Listen first: liveness answers while models warm, readiness once they are.
            # Under socket activation systemd holds the socket and queues early callers.
            self.notifier.status("starting: opening the API socket")
            await self.api.start(activated_unix_socket(listen_fds(), "api"))
            if self.mqtt is not None:
                self.mqtt.start()
            self.notifier.status("starting: loading and warming "
                                 + ("every model" if self.config.cache.preload == "all" else
                                    f"{len(self.config.cache.preload)} preloaded model(s)"))
            await asyncio.to_thread(self.warm_up)
            await asyncio.to_thread(self.streams.start, self.config.streams)
            if self.ota is not None:
                self.ota.start()
            if self.requests is not None:
                self.requests.start()
            self._ready = True
            self.ready_event.set()
            logger.info("edged %s running with %d model(s) in %s, %d stream(s)",
                        self.config.device_id, len(self.repository.names()),
                        self.config.models_dir, len(self.pipelines))
            self.notifier.ready(self.status_line())
            tasks = [asyncio.create_task(report_loop(
                         self.reporter, self.mqtt, lambda: self.config.mqtt.stats_interval_s)),
                     asyncio.create_task(health_loop(
                         self.health, self.notifier, self.status_line,
                         lambda: self.config.health)),
                     asyncio.create_task(status_loop(StatusLines(
                         self.streams.describe, interval_s=0, terminal=self.terminal,
                         logger=logger), lambda: self.config.logging.status_interval_s))]
            if self.clips is not None:  # clips age out even while no new one comes
                tasks.append(asyncio.create_task(retention_loop(self.clips)))
            await self._stop.wait()
        finally:
            for task in [*tasks, *self._sweeps]:
                task.cancel()
            await self.shutdown()
            logging.getLogger().removeHandler(self.recent)

    # -- health and status -------------------------------------------------------------------
    def _throttle_warning(self, reason: str, stats: TegraStats) -> None:
        if self.config.health.warn_on_throttle and self.mqtt is not None:
            self.mqtt.publish("status", topics.WARNINGS,
                              throttle_warning(self.config.device_id, reason, stats))

    def status_line(self, problems: list[str] | None = None) -> str:
        return self.status.line(problems)

    def status_report(self) -> dict[str, Any]:
        """What `edged status` shows (GET /v2/edged/status); called on a thread."""
        return self.status.report()

    def _ota_status(self) -> dict[str, Any] | None:
        # takes updates: every OTA subscription confirmed by the broker on this connection
        if self.ota is None:
            return None
        return {"listening": self.ota.listening, "shadows": self.updater.shadows.status()}

    # -- reloading ---------------------------------------------------------------------------
    def request_reload(self) -> None:
        """SIGHUP (on the loop): reload now, or once more after the reload under way."""
        if self._reloading is not None and not self._reloading.done():
            self._reload_again = True
            return
        self._reloading = asyncio.get_running_loop().create_task(self.reload())

    def request_reload_threadsafe(self) -> None:
        """From any thread (tools, tests): reload as SIGHUP does."""
        if self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self.request_reload)
        except RuntimeError:  # the loop has already closed: the daemon has stopped
            pass

    async def reload(self) -> bool:
        """Read the config again and apply what a running daemon can: streams added, removed
        or changed, preloaded and pinned models, trusted OTA keys, log level, health limits.
        A config with errors changes nothing. Returns True when the new config was applied."""
        while True:
            self._reload_again = False
            applied = await self._reload_once()
            if not self._reload_again:
                return applied

    async def _reload_once(self) -> bool:
        self.notifier.reloading()
        if self.reload_config is None:
            logger.warning("reload: this daemon was not started from a config file")
            self.notifier.ready(self.status_line())
            return False
        logger.info("reloading the config")
        try:
            new = await asyncio.to_thread(self.reload_config)
        except (ConfigError, OSError) as exc:
            issues = [str(i) for i in exc.issues] if isinstance(exc, ConfigError) else [str(exc)]
            for issue in issues:
                logger.error("reload refused, the old config stays: %s", issue,
                             extra={"code": "config_invalid"})
            self.reloads["failed"] += 1
            self.notifier.ready(f"reload failed ({issues[0]}); running the previous config")
            return False
        await asyncio.to_thread(self._apply, new)
        self.reloads["ok"] += 1
        self.notifier.ready(self.status_line())
        return True

    def _apply(self, new: DaemonConfig) -> None:
        """On a thread: make the running daemon match `new` where it can without a restart."""
        running = {p.cfg.name for p in self.streams.pipelines()}
        steps = reload_plan(self.config, new, streams_running=running,
                            recording_open=self.clips is not None)
        for what in steps.needs_restart:
            logger.warning("reload: %s changed; it takes effect at the next restart", what)
        config = dataclasses.replace(steps.config, ota=self.updater.reconfigure(steps.config.ota))
        logging.getLogger().setLevel(getattr(logging, config.logging.level.upper()))
        self.cache.pinned = set(config.cache.pinned)
        self.config = config
        self.cache.preload(config.cache.preload_names(self.repository.names())
                           if steps.preload == "all" else steps.preload, why="reload: preload",
                           within_budget=steps.preload == "all")
        if self.clips is None:  # a stream that now records needs the folder first
            self._open_recording(config)
        self.streams.restart(steps.stop, steps.start)

    def _open_recording(self, config: DaemonConfig) -> None:
        """A reload turned recording on: open the store (an unusable folder is logged and the
        streams start without recording; the daemon runs on), and its retention sweep."""
        try:
            self.clips = open_clips(config.recording, any(s.clips.enabled or s.record.enabled
                                                          for s in config.streams))
        except RecordingUnavailable as exc:
            logger.error("reload: recording stays off: %s", exc,
                         extra={"code": exc.code})
            return
        if self.clips is not None and self._loop is not None:
            store = self.clips
            self._loop.call_soon_threadsafe(
                lambda: self._sweeps.append(asyncio.ensure_future(retention_loop(store))))

    def request_stop(self) -> None:
        """Ask the daemon to stop (from any thread; calling it again changes nothing)."""
        if self._loop is None or self._stop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._stop.set)
        except RuntimeError:  # the loop has already closed: the daemon has stopped
            pass

    def _on_signal(self, signum: int) -> None:
        """SIGINT/SIGTERM: only sets flags. A second signal forces exit."""
        self._signals += 1
        if self._signals > 1:
            logger.warning("second signal: exiting now")
            os._exit(128 + signum)
        self.request_stop()

    async def shutdown(self) -> None:
        """Stop accepting → stop sources (frames in the model finish) → drain the scheduler
        until a deadline (queued requests run now, new ones on open connections get 503) →
        answer and close connections → unload models → close shared memory regions →
        publish `offline` and disconnect."""
        self._stopping = True
        self.notifier.stopping(f"stopping: draining queues (up to {DRAIN_TIMEOUT_S:.0f} s)")
        if self._reloading is not None:
            self._reloading.cancel()
        logger.info("shutting down: draining queues (up to %.0fs)", DRAIN_TIMEOUT_S)
        try:
            await self.api.stop_accepting()
            if self.requests is not None:  # no new MQTT requests; those decoding finish
                await asyncio.to_thread(self.requests.stop, REQUESTS_STOP_S)
            if self.ota is not None:  # a download stops; an install in progress finishes
                await asyncio.to_thread(self.ota.stop, OTA_STOP_S)
            await asyncio.to_thread(self.local.stop, OTA_STOP_S)
            await asyncio.to_thread(self.updater.shadows.stop_all)
            await asyncio.to_thread(self.streams.stop)
            await asyncio.to_thread(self.scheduler.close, DRAIN_TIMEOUT_S)
            if self.describer is not None:  # the one being asked ends within its timeout
                await asyncio.to_thread(self.describer.close, DESCRIBER_STOP_S)
            await asyncio.to_thread(self.generations.close)  # the queued fail, the rest end
            await self.api.stop()
        finally:
            await asyncio.to_thread(self.scheduler.close, 0.0)  # a no-op unless the above failed
            await asyncio.to_thread(self.generations.close, 0.0)
            await asyncio.to_thread(self.cache.close, timeout_s=UNLOAD_TIMEOUT_S)
            if self.faces is not None:  # after the streams and the API: nothing writes now
                await asyncio.to_thread(self.faces.close)
            self.shm.close()
            self.events.presence.close()  # no one is seen by a daemon that stopped
            if self.mqtt is not None:
                for name, payload in self.reporter.offline_states():  # not READY any more
                    self.mqtt.publish("state", topics.model_state(name), payload, retain=True)
                await asyncio.to_thread(self.mqtt.stop, MQTT_STOP_S)
            host.TEGRA.off_throttle(self._throttle_warning)
            logger.info("stopped")
            self.notifier.close()
            self.stopped_event.set()
