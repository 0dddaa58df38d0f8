"""The composition root: builds the repository, cache, scheduler, socket API, MQTT link and
stream pipelines from config, runs them on one asyncio loop, and shuts them down in order
with every wait bounded."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading

from edged.api.server import ApiServer
from edged.api.shm import ShmRegistry
from edged.cache import ModelCache, backend_options
from edged.config import DaemonConfig
from edged.errors import EdgedError
from edged.metrics import InferenceCounters, Metrics, ModelState
from edged.mqtt import MqttLink
from edged.ota.install import Event, Updater
from edged.ota.manifest import TrustStore
from edged.ota.service import OtaService
from edged.pipeline import StreamPipeline
from edged.reporting import Reporter
from edged.repository import ModelRepository
from edged.scheduler import BatcherStats, Scheduler
from edged.sources import Backoff, FrameQueue, open_source

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 10.0
UNLOAD_TIMEOUT_S = 5.0
SOURCE_STOP_S = 5.0
MQTT_STOP_S = 3.0
OTA_STOP_S = 10.0


class Daemon:
    def __init__(self, config: DaemonConfig) -> None:
        self.config = config
        self.repository = ModelRepository(config.models_dir)
        self.cache = ModelCache(
            self.repository,
            budget_bytes=config.cache.budget_mb * 1024 * 1024,
            options=backend_options(config.backends.onnxruntime, config.cache.dir),
            pinned=config.cache.pinned,
            default_backend=config.backends.default,
        )
        self.scheduler = Scheduler(self.cache)
        self.shm = ShmRegistry(copy_inputs=config.api.shm_copy_inputs)
        self.metrics = Metrics(self.inference_counters, self.model_states)
        self.api = ApiServer(config.api, scheduler=self.scheduler, cache=self.cache,
                             shm=self.shm, metrics=self.metrics, is_ready=self.is_ready)
        self.mqtt = (MqttLink(config.mqtt, prefix=config.mqtt_prefix,
                              client_id=f"edged-{config.device_id}")
                     if config.mqtt.enabled else None)
        self.updater = Updater(self.repository, self.cache, config.ota,
                               TrustStore.load(config.ota.trusted_keys), self._ota_event)
        self.ota = (OtaService(self.updater, self.mqtt, fleet_prefix=config.mqtt.fleet_prefix,
                               groups=config.ota.groups,
                               chunk_timeout_s=config.ota.chunk_timeout_s)
                    if self.mqtt is not None else None)
        self.pipelines: list[StreamPipeline] = []
        self.reporter = Reporter(self.pipelines, self.mqtt.stats if self.mqtt else None,
                                 self.cache.status)
        self._ready = False
        self._stopping = False
        # For threads that wait on the daemon (tests, tools).
        self.ready_event = threading.Event()
        self.stopped_event = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._signals = 0

    def is_ready(self) -> bool:
        return self._ready and not self._stopping

    def warm_up(self) -> None:
        """Undo interrupted installs (OTA recovery), then load and warm the preload list. A model
        that fails is reported and left unavailable; the others still come up."""
        self.config.cache.dir.mkdir(parents=True, exist_ok=True)
        self.updater.recover()
        for name in self.config.cache.preload:
            try:
                self.cache.load(name)
            except EdgedError as exc:
                logger.error("preload of %s failed: %s", name, exc)
        for row in self.cache.status():
            logger.info("model %s:%d %s%s", row.name, row.version, row.state,
                        f" on {', '.join(row.providers)}" if row.providers else
                        f" ({row.reason})" if row.reason else "")

    def start_streams(self) -> None:
        """One pipeline per configured stream. A stream whose model or source is unusable is
        logged and left out; the others run."""
        for cfg in self.config.streams:
            try:
                model = self.scheduler.model(cfg.model)
                spec = model.inputs[0]
                batched = model.max_batch_size > 0
                source = open_source(
                    cfg.name, cfg.source, FrameQueue(cfg.queue, cfg.backpressure),
                    common={"fps": cfg.fps, "watchdog_s": cfg.watchdog_s,
                            "backoff": Backoff(cfg.backoff_initial_s, cfg.backoff_max_s)},
                    camera={"loop": cfg.loop,
                            "size": tuple(cfg.size) if cfg.size else None},
                    sensor={"subscribe": self.mqtt.subscribe if self.mqtt else None,
                            "shape": spec.shape[1:] if batched else spec.shape,
                            "dtype": spec.dtype, "payload": cfg.payload})
            except EdgedError as exc:
                logger.error("stream %s is not started: %s", cfg.name, exc)
                continue
            pipeline = StreamPipeline(cfg, source, self.scheduler, self._publish_result,
                                      backend_of=self._backend_of)
            pipeline.start()
            self.pipelines.append(pipeline)

    def _publish_result(self, stream: str, payload: bytes) -> None:
        if self.mqtt is not None:
            self.mqtt.publish("results", f"streams/{stream}/results", payload)

    def _ota_event(self, event: Event) -> None:
        if self.ota is not None:
            self.ota.report(event)
        else:
            logger.info("OTA %s:%d %s %s", event.model, event.version, event.state,
                        event.detail)

    def _backend_of(self, name: str, version: int) -> str:
        for row in self.cache.status():
            if (row.name, row.version) == (name, version) and row.providers:
                return f"{row.backend}:{row.providers[0]}"
        return "unknown"

    async def _report_loop(self) -> None:
        """Retained model states when they change, and the periodic stats message."""
        interval = self.config.mqtt.stats_interval_s
        while True:
            for name, payload in await asyncio.to_thread(self.reporter.changed_states):
                if self.mqtt is not None:
                    self.mqtt.publish("state", f"models/{name}/state", payload, retain=True)
            stats = json.dumps(self.reporter.stats(), separators=(",", ":")).encode()
            if self.mqtt is not None:
                self.mqtt.publish("stats", "stats", stats)
            await asyncio.sleep(interval)

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
        try:
            # Listen first: liveness answers while models warm, readiness once they are.
            await self.api.start()
            if self.mqtt is not None:
                self.mqtt.start()
            await asyncio.to_thread(self.warm_up)
            await asyncio.to_thread(self.start_streams)
            if self.ota is not None:
                self.ota.start()
            self._ready = True
            self.ready_event.set()
            logger.info("edged %s running with %d model(s) in %s, %d stream(s)",
                        self.config.device_id, len(self.repository.names()),
                        self.config.models_dir, len(self.pipelines))
            reporting = asyncio.create_task(self._report_loop())
            await self._stop.wait()
            reporting.cancel()
        finally:
            await self.shutdown()

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
        logger.info("shutting down: draining queues (up to %.0fs)", DRAIN_TIMEOUT_S)
        try:
            await self.api.stop_accepting()
            if self.ota is not None:  # a download stops; an install in progress finishes
                await asyncio.to_thread(self.ota.stop, OTA_STOP_S)
            await asyncio.to_thread(self._stop_pipelines)
            await asyncio.to_thread(self.scheduler.close, DRAIN_TIMEOUT_S)
            await self.api.stop()
        finally:
            await asyncio.to_thread(self.scheduler.close, 0.0)  # a no-op unless the above failed
            await asyncio.to_thread(self.cache.close, timeout_s=UNLOAD_TIMEOUT_S)
            self.shm.close()
            if self.mqtt is not None:
                await asyncio.to_thread(self.mqtt.stop, MQTT_STOP_S)
            logger.info("stopped")
            self.stopped_event.set()

    def _stop_pipelines(self) -> None:
        for pipeline in self.pipelines:
            if not pipeline.stop_source(SOURCE_STOP_S):
                logger.warning("stream %s: capture did not stop in %.0f s", pipeline.cfg.name,
                               SOURCE_STOP_S)
        for pipeline in self.pipelines:
            if not pipeline.stop(DRAIN_TIMEOUT_S):
                logger.warning("stream %s: frames still in the model after %.0f s",
                               pipeline.cfg.name, DRAIN_TIMEOUT_S)

    # -- metrics snapshots -------------------------------------------------------------------
    def inference_counters(self) -> list[InferenceCounters]:
        """Per model version; batchers of one model (by name, by explicit version) summed."""
        stats: dict[tuple[str, int], BatcherStats] = {}
        pending: dict[tuple[str, int], int] = {}
        for batcher in self.scheduler.batchers():
            for version, s in batcher.stats_by_version().items():
                key = (batcher.name, version)
                stats[key] = stats.get(key, BatcherStats()) + s
            key = (batcher.name, batcher.serving_version)
            stats.setdefault(key, BatcherStats())
            pending[key] = pending.get(key, 0) + batcher.depth
        return [InferenceCounters(name, version, s.success, s.failure, s.inference_count,
                                  s.exec_count, s.request_ns, s.queue_ns, s.compute_ns,
                                  pending.get((name, version), 0))
                for (name, version), s in sorted(stats.items())]

    def model_states(self) -> list[ModelState]:
        return [ModelState(row.name, row.version, row.state == "READY", row.nbytes)
                for row in self.cache.status()]
