"""The shadow rollouts of one device: starting a candidate's shadow once it is installed beside
the serving version (after a memory check against the cache budget), and carrying out each
decision, its own or an operator's signed `promote` / `reject`, on the OTA worker.

Until promotion nothing about serving changes: the active pointer stays on the serving
version and the install journal still names the candidate, so a restart mid-shadow removes
it (edged/ota/install.py's recovery). A shadow never blocks anything urgent: a newer
manifest or a rollback of the model cancels it first.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edged.core.errors import EdgedError
from edged.core.states import ModelState, OtaState
from edged.ota.manifest import Manifest, Rejected
from edged.ota.shadow import Publish, Shadow, Tap

if TYPE_CHECKING:
    from edged.ota.install import Updater

logger = logging.getLogger(__name__)


@dataclass
class ShadowHooks:
    """What the daemon lends shadow runs: the scheduler's taps (model -> Shadow.offer), whether
    serving queues are busy, where progress goes, and how a decision gets onto the OTA
    worker (`defer`; default: at once, on the calling thread)."""

    taps: dict[str, Tap] = field(default_factory=dict)
    busy: Callable[[], bool] = lambda: False
    publish: Publish | None = None
    defer: Callable[[Callable[[], None]], None] = lambda job: job()


class ShadowRollouts:
    def __init__(self, updater: Updater, hooks: ShadowHooks | None = None) -> None:
        self.updater = updater
        self.hooks = hooks or ShadowHooks()
        self._lock = threading.Lock()
        self._running: dict[str, Shadow] = {}

    def get(self, name: str) -> Shadow | None:
        with self._lock:
            return self._running.get(name)

    def proving(self, manifest: Manifest) -> bool:
        """Whether this manifest's candidate is being shadowed now (a retained manifest seen
        again at a reconnect must not start it over)."""
        shadow = self.get(manifest.model)
        return shadow is not None and shadow.candidate == manifest.version and \
            shadow.manifest.artifact.sha256 == manifest.artifact.sha256

    def status(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            shadows = list(self._running.values())
        return {s.name: s.progress() for s in shadows}

    # -- on the OTA worker -----------------------------------------------------------------
    def check_memory(self, manifest: Manifest, files_bytes: int) -> None:
        """Both versions must fit the cache budget before the candidate loads beside the
        serving one; Rejected('no_memory') when they do not."""
        cache = self.updater.cache
        loaded = sum(row.nbytes or 0 for row in cache.status() if row.state == ModelState.READY)
        if loaded + files_bytes > cache.budget_bytes:
            raise Rejected("no_memory", f"the candidate needs about {files_bytes / 1e6:.1f} MB "
                                        f"beside the {loaded / 1e6:.1f} MB loaded; the cache "
                                        f"budget is {cache.budget_bytes / 1e6:.1f} MB")

    def start(self, manifest: Manifest, serving: int) -> None:
        """Begin proving the installed, warmed candidate against `serving`."""
        updater = self.updater
        shadow = Shadow(manifest, serving,
                        updater.repository.get(manifest.model, manifest.version), updater.cache,
                        updater.cfg.shadow, busy=self.hooks.busy, decide=self._decided,
                        publish=self.hooks.publish)
        with self._lock:
            self._running[manifest.model] = shadow
        self.hooks.taps[manifest.model] = shadow.offer
        shadow.start()
        rollout = shadow.rollout
        updater._emit(manifest, OtaState.SHADOWING,
                      f"proving version {manifest.version} beside {serving} on "
                      f"{rollout.sample:.0%} of live inputs until {rollout.min_samples} samples "
                      f"(at most {rollout.max_duration_s:g} s)")

    def cancel(self, name: str, why: str) -> None:
        """Drop a shadow that something more urgent replaces (a newer update, a rollback)."""
        shadow = self.get(name)
        if shadow is not None:
            self._reject(shadow, why, "superseded")

    def decide(self, name: str, promote: bool, version: int | None, by: str) -> None:
        """An operator's signed decision; Rejected('no_shadow') when there is nothing to
        decide (or not about `version`)."""
        shadow = self.get(name)
        if shadow is None or (version is not None and shadow.candidate != version):
            about = f"version {version} of {name}" if version is not None else name
            raise Rejected("no_shadow", f"no shadow rollout of {about} is in progress")
        if promote:
            self._promote(shadow, f"promoted by {by}")
        else:
            self._reject(shadow, f"rejected by {by}", "rejected_by_operator")

    def stop_all(self) -> None:
        with self._lock:
            shadows = list(self._running.values())
        for shadow in shadows:  # the journal removes the candidate at the next start
            self.hooks.taps.pop(shadow.name, None)
            shadow.stop("interrupted", "the daemon stopped; the candidate is removed at the "
                                       "next start", timeout_s=2.0)

    def _decided(self, shadow: Shadow, promote: bool, detail: str) -> None:
        """The shadow's own decision, from its thread: carried out on the OTA worker."""
        def job() -> None:
            if self.get(shadow.name) is not shadow:
                return  # cancelled meanwhile
            if promote:
                self._promote(shadow, f"promoted after {shadow.rollout.min_samples} shadow "
                                      f"samples ({detail})")
            else:
                self._reject(shadow, detail, shadow.reason or "shadow_rejected")

        self.hooks.defer(job)

    def _end(self, shadow: Shadow) -> bool:
        with self._lock:
            if self._running.get(shadow.name) is not shadow:
                return False
            del self._running[shadow.name]
        self.hooks.taps.pop(shadow.name, None)
        return True

    def _promote(self, shadow: Shadow, detail: str) -> None:
        if not self._end(shadow):
            return
        updater, name, version = self.updater, shadow.name, shadow.candidate
        with updater.holding(name, version):
            try:
                updater.cache.swap(name, version, drain_timeout_s=updater.drain_timeout_s)
                updater._step("switched")
                updater.repository.set_active(name, version)
            except (OSError, EdgedError) as exc:
                shadow.stop("rejected", f"promotion failed: {exc}")
                try:
                    updater._undo(shadow.manifest, shadow.serving, f"promotion failed: {exc}",
                                  "promote_failed")
                except Rejected:
                    pass  # reported by _undo
                return
            updater.journal.end(name)
            updater._prune(name, keep={version, shadow.serving})
        shadow.stop("promoted", detail)
        updater._emit(shadow.manifest, OtaState.ACTIVE,
                      f"serving version {version} (was {shadow.serving}): {detail}")

    def _reject(self, shadow: Shadow, detail: str, reason: str) -> None:
        if not self._end(shadow):
            return
        updater, name, version = self.updater, shadow.name, shadow.candidate
        shadow.stop("rejected", detail)
        try:
            updater.cache.unload(name, version, timeout_s=updater.drain_timeout_s)
            if version in updater._on_disk(name):
                updater.repository.remove_version(name, version)
            updater.journal.end(name)
        except (OSError, EdgedError):  # the journal stays: the next start removes it
            logger.exception("OTA: removing the rejected %s:%d failed", name, version)
        updater._emit(shadow.manifest, OtaState.FAILED,
                      f"version {shadow.serving} serves on; version {version} was not "
                      f"promoted: {detail}", reason=reason)

