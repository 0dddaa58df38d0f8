"""The composition root: builds the repository, cache and scheduler from config, runs them, and
shuts them down in order with every wait bounded."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from edged.cache import ModelCache, backend_options
from edged.config import DaemonConfig
from edged.errors import EdgedError
from edged.repository import ModelRepository
from edged.scheduler import Scheduler

logger = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 10.0
UNLOAD_TIMEOUT_S = 5.0


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
        self._stop = threading.Event()
        self._signals = 0

    def start(self) -> None:
        """Clean leftovers of interrupted installs, then load and warm the preload list. A model
        that fails is reported and left unavailable; the others still come up."""
        self.config.cache.dir.mkdir(parents=True, exist_ok=True)
        self.repository.clean_staging()
        for name in self.config.cache.preload:
            try:
                self.cache.load(name)
            except EdgedError as exc:
                logger.error("preload of %s failed: %s", name, exc)
        for row in self.cache.status():
            logger.info("model %s:%d %s%s", row.name, row.version, row.state,
                        f" on {', '.join(row.providers)}" if row.providers else
                        f" ({row.reason})" if row.reason else "")

    def request_stop(self, signum: int = 0, _frame: FrameType | None = None) -> None:
        """Signal handler: only sets flags. A second signal forces exit."""
        self._signals += 1
        if self._signals > 1:
            raise SystemExit(128 + (signum or signal.SIGINT))
        self._stop.set()

    def run(self) -> None:
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGTERM, self.request_stop)
        self.start()
        logger.info("edged %s running with %d model(s) in %s", self.config.device_id,
                    len(self.repository.names()), self.config.models_dir)
        try:
            while not self._stop.wait(1.0):
                pass
        finally:
            self.shutdown()

    def shutdown(self) -> None:
        """Stop accepting → drain the scheduler until a deadline → unload models."""
        logger.info("shutting down: draining queues (up to %.0fs)", DRAIN_TIMEOUT_S)
        self.scheduler.close(DRAIN_TIMEOUT_S)
        self.cache.close(timeout_s=UNLOAD_TIMEOUT_S)
        logger.info("stopped")
