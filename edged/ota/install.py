"""Installing one verified update, rolling back, and recovering after a crash.

The order makes every crash safe. Before the new version's directory appears, the model's
active pointer is pinned to the serving version and a journal (`<name>/.ota-pending`) names
the version being installed. The pointer moves only after the cache has loaded, warmed and
golden-checked the new version and switched requests to it. A restart that finds the journal
removes the version unless the pointer reached it, so a power cut at any step leaves the old
version serving; leftover staging files go at the same time.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edged.core.errors import EdgedError, InvalidModel, ModelNotFound
from edged.core.states import OtaState
from edged.inference.cache import ModelCache
from edged.model.gguf import read_header
from edged.model.repository import GGUF_FILE, MODEL_FILE, ModelRepository
from edged.model.signature import read_signature
from edged.ota.bundle import GOLDEN, unpack
from edged.ota.config import OtaConfig
from edged.ota.fetch import Delivery, Fetcher, download_deadline_s
from edged.ota.journal import InstallJournal
from edged.ota.manifest import Manifest, Rejected, TrustStore
from edged.ota.shadows import ShadowRollouts
from edged.ota.transfer import Reservation, TransferBudget
from edged.ota.verify import check_io, golden_check, verify_artifact

logger = logging.getLogger(__name__)

MAX_CRASHES = 2  # an artifact whose install was cut this often is not tried again
# Where an install can be cut: the states it enters, and "switched" (after the swap, before
# the active pointer moves). `Updater.step_hook` is called with each as it is reached.
STEPS = ("downloading", "verifying", "installing", "warming", "switched")


@dataclass(frozen=True)
class Event:
    model: str
    version: int
    state: OtaState
    detail: str = ""
    progress: float | None = None  # 0..100 while downloading
    reason: str | None = None  # a Rejected reason code, when failed
    transient: bool = False  # not about the model's state (a refused command): not retained

    def to_dict(self) -> dict[str, object]:
        body: dict[str, object] = {"model": self.model, "version": self.version,
                                   "state": self.state, "detail": self.detail,
                                   "progress": self.progress, "ts": round(time.time(), 3)}
        if self.reason is not None:
            body["reason"] = self.reason
        return body


Report = Callable[[Event], None]


@dataclass(frozen=True)
class Staged:
    """An update's artifact, downloaded and waiting to be verified and installed; it holds its
    share of the staging budget until then."""

    stage: Path
    reservation: Reservation


class Updater:
    """Applies updates one at a time per model; another update of a model that is updating
    is refused with reason `busy` (the fleet tool re-pushes; a queue would hide staleness).
    `download` may run for several models at once (their bytes within `transfers`);
    `install` runs for one update at a time (the caller's single lane)."""

    def __init__(self, repository: ModelRepository, cache: ModelCache, cfg: OtaConfig,
                 trust: TrustStore, report: Report, *, fetcher: Fetcher | None = None,
                 drain_timeout_s: float = 30.0,
                 step_hook: Callable[[str], None] | None = None) -> None:
        """`step_hook` is called with each of STEPS as an install reaches it: tests that prove
        crash safety kill the process there."""
        self.repository = repository
        self.cache = cache
        self.cfg = cfg
        self.trust = trust
        self.report = report
        self.stop = threading.Event()
        self.fetcher = fetcher or Fetcher(max_bytes=cfg.max_artifact_mb * 1024 * 1024,
                                          ca_file=cfg.ca_file, stop=self.stop)
        self.drain_timeout_s = drain_timeout_s
        self.step_hook = step_hook
        self.journal = InstallJournal(repository)
        rate = cfg.download_rate_kbps * 1024 if cfg.download_rate_kbps else None
        self.transfers = TransferBudget(repository.staging_dir, cfg.staging_mb << 20, rate,
                                        self.stop)
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}
        # Why a model takes no other update now (None: it may): an install that waits for its
        # commit (edged.ota.local, Mender's standalone install -> commit | rollback).
        self.held: Callable[[str], str | None] = lambda name: None
        self.shadows = ShadowRollouts(self)  # the daemon lends it its hooks

    def reconfigure(self, cfg: OtaConfig) -> OtaConfig:
        """Take a reloaded `ota` section (its restart-only keys already held by the reload
        plan). New trusted keys that cannot be read leave the old ones in force; returns the
        section now in force."""
        if cfg.trusted_keys != self.cfg.trusted_keys:
            try:
                self.trust = TrustStore.load(cfg.trusted_keys)
            except EdgedError as exc:
                logger.error("reload: the trusted keys are not changed: %s", exc,
                             extra={"code": exc.code})
                cfg = dataclasses.replace(cfg, trusted_keys=self.cfg.trusted_keys)
        self.cfg = cfg
        return cfg

    # -- one update ------------------------------------------------------------------------
    def claim(self, manifest: Manifest) -> bool:
        """Reserve the model for this update; False when it needs no work (this exact
        manifest is already active, e.g. a retained fleet manifest seen again)."""
        with self._lock:
            held = self._busy.get(manifest.model)
            if held == manifest.version:  # the same push again (a retained manifest re-sent)
                return False
            if held is None and self.shadows.proving(manifest):
                return False  # being proven now: a retained manifest re-sent at a reconnect
            if held is not None:
                raise Rejected("busy", f"an update of {manifest.model} to version {held} is in "
                                       "progress; push again when it has finished")
            if self._current(manifest.model) == manifest.version and self.journal.\
                    installed_sha256(manifest.model, manifest.version) == manifest.artifact.sha256:
                return False
            waiting = self.held(manifest.model)
            if waiting is not None:
                raise Rejected("uncommitted", waiting)
            crashes = self.journal.crashes(manifest.model, manifest.artifact.sha256)
            if crashes >= MAX_CRASHES:  # e.g. a model that kills the runtime as it loads
                raise Rejected("crash_loop", f"installing this artifact was cut by a restart "
                                             f"{crashes} times; it is not tried again (push a "
                                             "different artifact)")
            self._busy[manifest.model] = manifest.version
            return True

    def serving(self, name: str) -> int | None:
        """The version that requests of `name` go to now (None: not in the repository)."""
        return self._current(name)

    def release(self, manifest: Manifest) -> None:
        with self._lock:
            self._busy.pop(manifest.model, None)

    @contextmanager
    def holding(self, name: str, version: int) -> Iterator[None]:
        """The model reserved (as by claim) while a shadow's candidate is promoted."""
        with self._lock:
            self._busy.setdefault(name, version)
        try:
            yield
        finally:
            with self._lock:
                if self._busy.get(name) == version:
                    del self._busy[name]

    def apply(self, manifest: Manifest, chunks: Delivery | None = None) -> None:
        """Download, then install (below), on the calling thread. The caller holds claim()."""
        self.install(manifest, self.download(manifest, chunks))

    def download(self, manifest: Manifest, chunks: Delivery | None = None) -> Staged:
        """Check the manifest, then fetch its artifact into a staging folder of its own,
        within the transfer budget: the network part of an update, which updates of other
        models may do at the same time. Raises Rejected (reported; nothing changed). A shadow
        rollout of the model in progress gives way to it."""
        self.shadows.cancel(manifest.model, f"superseded by version {manifest.version}")
        try:
            return self._download(manifest, chunks)
        except Rejected as exc:
            self._emit(manifest, OtaState.FAILED, str(exc), reason=exc.reason)
            raise

    def install(self, manifest: Manifest, staged: Staged) -> None:
        """Verify, stage, install, warm, golden-check, switch: the caller runs one update at a
        time here. Raises Rejected (with nothing changed, or after an automatic rollback)."""
        try:
            try:
                files = self._verify(manifest, staged.stage)
            except Rejected as exc:
                self._emit(manifest, OtaState.FAILED, str(exc), reason=exc.reason)
                raise
            self._install(manifest, files)
        finally:
            staged.reservation.release()

    def _download(self, manifest: Manifest, chunks: Delivery | None) -> Staged:
        name, version = manifest.model, manifest.version
        self._emit(manifest, OtaState.RECEIVED)
        self.trust.verify(manifest, allow_unsigned=self.cfg.allow_unsigned)
        current = self._current(name)
        if current == version:
            raise Rejected("downgrade", f"version {version} is already active with other "
                                        "content; publish a new version number")
        if current is not None and version < current and not manifest.force:
            raise Rejected("downgrade", f"version {version} is older than the active "
                                        f"{current} (set force to downgrade)")
        self.fetcher.check_size(manifest.artifact)
        if chunks is None and manifest.artifact.url is None:
            raise Rejected("bad_manifest", "the artifact has no url and no bytes came with it")
        limit = download_deadline_s(manifest.artifact.size, self.cfg.download_timeout_s)
        deadline = time.monotonic() + limit
        reservation = self.transfers.reserve(
            manifest.artifact.size, deadline, lambda held: self._emit(
                manifest, OtaState.RECEIVED, f"waiting for staging room: downloads in "
                f"progress hold {held >> 20} MiB of ota.staging_mb"))
        stage = self.repository.staging_dir() / f"ota-{name}-{version}-{uuid.uuid4().hex[:8]}"
        try:
            stage.mkdir()
            artifact = stage / "artifact"
            self._step("downloading")
            meter = _Meter(lambda p: self._emit(manifest, OtaState.DOWNLOADING, progress=p))
            if chunks is not None:
                chunks.wait(artifact, meter, self.stop)
            else:
                self.fetcher.fetch(manifest.artifact, artifact, meter,
                                   deadline_s=max(deadline - time.monotonic(), 0.001),
                                   take=self.transfers.take)
        except BaseException:  # a refusal, or anything else that stopped it, leaves no trace
            shutil.rmtree(stage, ignore_errors=True)
            reservation.release()
            raise
        return Staged(stage, reservation)

    def discard(self, staged: Staged) -> None:
        """A download that will not be installed (the daemon is stopping)."""
        shutil.rmtree(staged.stage, ignore_errors=True)
        staged.reservation.release()

    def _verify(self, manifest: Manifest, stage: Path) -> Path:
        """Everything else before the repository changes: verified files in the staging
        folder, the manifest recorded beside them."""
        name = manifest.model
        current = self._current(name)
        staged = False
        try:
            artifact = stage / "artifact"
            self._emit(manifest, OtaState.VERIFYING)
            self._step("verifying")
            verify_artifact(manifest, artifact)
            files = stage / "version"
            files.mkdir()
            if manifest.format in ("onnx", "gguf"):
                os.rename(artifact, files / (MODEL_FILE if manifest.format == "onnx"
                                             else GGUF_FILE))
            else:
                unpack(artifact, files, self.fetcher.max_bytes)
                artifact.unlink()
            try:  # a GGUF's header here; its tensors when it loads (a failure: undone)
                if (files / MODEL_FILE).is_file():
                    read_signature(files / MODEL_FILE)
                else:
                    read_header(files / GGUF_FILE)
            except InvalidModel as exc:
                raise Rejected("corrupt_model", str(exc)) from None
            try:
                candidate = self.repository.read_candidate(name, files)
            except InvalidModel as exc:  # readable, but not what model.yaml declares
                raise Rejected("io_mismatch", str(exc)) from None
            check_io(manifest, candidate, None if current is None else
                     self.repository.get(manifest.model, current))
            self.journal.record(files, manifest.raw)
            staged = True
            return files
        finally:
            if not staged:  # a refusal, or anything else that stopped it, leaves no trace
                shutil.rmtree(stage, ignore_errors=True)

    def _install(self, manifest: Manifest, files: Path) -> None:
        name, version = manifest.model, manifest.version
        current = self._current(name)
        self._emit(manifest, OtaState.INSTALLING)
        self._step("installing")
        try:
            if current is not None and self.repository.active_version(name) is None:
                self.repository.set_active(name, current)  # pinned: the new one is not yet
            self.journal.begin(name, version, manifest.artifact.sha256)
            if version in self._on_disk(name):  # an earlier, failed or rolled-back attempt
                self.cache.unload(name, version, timeout_s=self.drain_timeout_s)
                self.repository.remove_version(name, version)
            self.repository.adopt(name, version, files)
        except (OSError, EdgedError) as exc:
            shutil.rmtree(files.parent, ignore_errors=True)
            self._undo(manifest, current, f"install failed: {exc}", "install_failed")
        except Exception as exc:  # a bug: the repository may have changed, so undo all the same
            logger.exception("OTA: installing %s:%d failed", name, version)
            shutil.rmtree(files.parent, ignore_errors=True)
            self._undo(manifest, current, f"{type(exc).__name__}: {exc}", "internal")
        shutil.rmtree(files.parent, ignore_errors=True)
        try:
            self._emit(manifest, OtaState.WARMING)
            self._step("warming")
            shadow = manifest.shadow and current is not None  # a new model has no live data
            if shadow:
                self.shadows.check_memory(manifest, self.repository.get(name, version)
                                          .model_path.stat().st_size)
            self.cache.load(name, version)
            with self.cache.acquire(name, version) as lease:
                golden_check(self.repository.version_dir(name, version) / GOLDEN,
                             lease.session.infer)
            if shadow:
                assert current is not None
                self.shadows.start(manifest, current)  # the journal stays until decided
                return
            self.cache.swap(name, version, drain_timeout_s=self.drain_timeout_s)
            self._step("switched")
            self.repository.set_active(name, version)
        except Rejected as exc:
            self._undo(manifest, current, str(exc), exc.reason)
        except (OSError, EdgedError) as exc:
            self._undo(manifest, current, f"{type(exc).__name__}: {exc}", "warmup_failed")
        except Exception as exc:  # a bug must not leave an unchecked version serving
            logger.exception("OTA: warming %s:%d failed", name, version)
            self._undo(manifest, current, f"{type(exc).__name__}: {exc}", "internal")
        self.journal.end(name)
        self._prune(name, keep={version, current})
        self._emit(manifest, OtaState.ACTIVE, f"serving version {version}"
                   + (f" (was {current})" if current is not None else ""))

    def _undo(self, manifest: Manifest, previous: int | None, detail: str, reason: str) -> None:
        """Back to `previous` after a failure past the point where files changed."""
        name, version = manifest.model, manifest.version
        self._emit(manifest, OtaState.FAILED, detail, reason=reason)
        try:
            if previous is not None and self.cache.default_version(name) != previous:
                self.cache.swap(name, previous, drain_timeout_s=self.drain_timeout_s)
            if previous is not None:
                self.repository.set_active(name, previous)
            self.cache.unload(name, version, timeout_s=self.drain_timeout_s)
            if version in self._on_disk(name):
                self.repository.remove_version(name, version)
            self.journal.end(name)
        except (OSError, EdgedError):  # the journal stays: the next start finishes the job
            logger.exception("OTA: rolling %s back to %s failed", name, previous)
        back = f"version {previous} serves again" if previous is not None else \
            "the model was new; nothing serves it"
        self._emit(manifest, OtaState.ROLLED_BACK, f"{back} ({detail})", reason=reason,
                   version=previous if previous is not None else version)
        raise Rejected(reason, detail)

    # -- manual rollback ---------------------------------------------------------------------
    def rollback(self, name: str, from_version: int | None = None) -> int:
        """Serve the newest version older than the active one again and remove the active
        one. Returns the version now serving; Rejected('no_previous') if there is none, and
        Rejected('not_active') when `from_version` is given and is not the active one (a
        fleet-wide rollback must not take a device that never updated one step further). A
        shadow rollout of the model in progress is cancelled first."""
        self.shadows.cancel(name, "cancelled by a rollback")
        current = self._current(name)
        if current is None:
            raise Rejected("no_previous", f"model {name!r} is not in the repository")
        if from_version is not None and current != from_version:
            raise Rejected("not_active", f"{name} serves version {current}, not "
                                         f"{from_version}: nothing to roll back")
        older = [v for v in self._on_disk(name) if v < current]
        if not older:
            raise Rejected("no_previous", f"{name} has no version older than {current} on disk")
        with self._lock:
            if name in self._busy:
                raise Rejected("busy", f"an update of {name} is in progress")
            waiting = self.held(name)
            if waiting is not None:  # its own rollback (revert) is the install owner's
                raise Rejected("uncommitted", waiting)
            self._busy[name] = older[-1]
        try:
            target = older[-1]
            self.cache.swap(name, target, drain_timeout_s=self.drain_timeout_s)
            self.repository.set_active(name, target)
            self.cache.unload(name, current, timeout_s=self.drain_timeout_s)
            self.repository.remove_version(name, current)
        finally:
            with self._lock:
                self._busy.pop(name, None)
        self.report(Event(name, target, OtaState.ROLLED_BACK,
                          f"manual rollback from version {current}"))
        return target

    def revert(self, name: str, version: int, previous: int | None, why: str) -> None:
        """Undo one install of `name:version` (an uncommitted install rolled back): `previous`
        serves again and `version` is removed; a model that was new (previous None) leaves the
        repository. The warm swap: requests in flight finish on the version they started on."""
        with self._lock:
            if name in self._busy:
                raise Rejected("busy", f"an update of {name} is in progress")
            self._busy[name] = version
        try:
            if previous is not None:
                self.cache.swap(name, previous, drain_timeout_s=self.drain_timeout_s)
                self.repository.set_active(name, previous)
            if version in self._on_disk(name):
                self.cache.unload(name, version, timeout_s=self.drain_timeout_s)
                self.repository.remove_version(name, version)
            if previous is None and not self._on_disk(name):
                shutil.rmtree(self.repository.model_dir(name), ignore_errors=True)
        finally:
            with self._lock:
                self._busy.pop(name, None)
        back = f"version {previous} serves again" if previous is not None else \
            "the model was new and is removed"
        self.report(Event(name, previous if previous is not None else version,
                          OtaState.ROLLED_BACK, f"{back} ({why})"))

    # -- start-up ----------------------------------------------------------------------------
    def recover(self) -> list[str]:
        """After a crash: drop staging leftovers and every half-done install. Returns what
        was done, one line per model, for the log."""
        done = []
        self.repository.clean_staging()
        for name in self.repository.names():
            cut = self.journal.pending(name)
            if cut is None:
                continue
            pending, sha256 = cut
            if pending is not None and self.repository.active_version(name) != pending and \
                    pending in self._on_disk(name):
                self.repository.remove_version(name, pending)
                crashes = self.journal.count_crash(name, sha256)
                done.append(f"{name}: removed version {pending}, whose install was interrupted"
                            + (f" ({crashes} times: not tried again)"
                               if crashes >= MAX_CRASHES else ""))
                self.report(Event(name, pending, OtaState.ROLLED_BACK, "the install was "
                                  "interrupted by a restart; the previous version serves",
                                  reason="interrupted"))
            self.journal.end(name)
        for line in done:
            logger.warning("OTA recovery: %s", line)
        return done

    # -- helpers -----------------------------------------------------------------------------
    def _current(self, name: str) -> int | None:
        try:
            return self.cache.default_version(name)
        except ModelNotFound:
            return None

    def _on_disk(self, name: str) -> list[int]:
        try:
            return self.repository.versions_on_disk(name)
        except ModelNotFound:
            return []

    def _prune(self, name: str, keep: set[int | None]) -> None:
        versions = self._on_disk(name)
        kept = set(versions[-self.cfg.keep_versions:]) | keep
        for version in versions:
            if version not in kept:
                self.cache.unload(name, version, timeout_s=self.drain_timeout_s)
                self.repository.remove_version(name, version)
                logger.info("OTA: removed %s:%d (ota.keep_versions %d)", name, version,
                            self.cfg.keep_versions)

    def _emit(self, manifest: Manifest, state: OtaState, detail: str = "", *,
              progress: float | None = None, reason: str | None = None,
              version: int | None = None) -> None:
        self.report(Event(manifest.model, manifest.version if version is None else version,
                          state, detail, progress, reason))

    def _step(self, step: str) -> None:
        if self.step_hook is not None:
            self.step_hook(step)


class _Meter:
    """Download progress at most every 10 percent."""

    def __init__(self, emit: Callable[[float], None]) -> None:
        self.emit = emit
        self.last = -10.0

    def __call__(self, done: int, total: int) -> None:
        percent = 100.0 * done / total if total else 100.0
        if percent >= self.last + 10 or (percent == 100.0 and self.last < 100.0):
            self.last = percent
            self.emit(round(percent, 1))
