"""Installs handed over on the socket API (`POST /v2/edged/ota/install`): a manifest and, when
its artifact is attached, the artifact's bytes. They go through the same verified installer as
MQTT manifests (signature by a trusted key, freshness for the topic root `local`, size and
sha256, staging, golden check, warm-up, the warm swap), on the OTA worker.

An install may be *held*: once active it serves, but waits for a commit, and until then a
rollback serves the version before it again. That is what Mender's update module maps its
ArtifactInstall, ArtifactCommit and ArtifactRollback onto (deploy/mender/edged-model). While an
install is held, no other held install is taken (Mender's standalone mode would let a second
one overwrite the first's state), and no other update of that model (manual rollbacks
included). Held installs are recorded in `<models>/.ota-local.json` and outlive a restart."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edged.core.fsutil import write_atomically
from edged.core.states import OtaState
from edged.ota.fetch import Progress
from edged.ota.freshness import LOCAL_ROOT, check_fresh
from edged.ota.install import Event, Updater
from edged.ota.manifest import FINAL, Manifest, Rejected, parse_manifest

logger = logging.getLogger(__name__)

RECORD = ".ota-local.json"  # <models>/: held installs and the latest others
KEEP_DONE = 16  # finished installs remembered for GET, beside the held ones
KEEP_EVENTS = 32  # status events kept per install
# Refusals that say nothing about the model's state (as edged.ota.service.NOT_A_MODEL_STATE).
TRANSIENT = frozenset({"busy", "stale", "replayed", "expired", "wrong_target", "uncommitted"})
_TAG_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-:+@")


@dataclass
class LocalInstall:
    id: str
    model: str
    version: int
    hold: bool  # waits for a commit once active
    tag: str | None = None  # who asked, in their words (Mender's artifact name)
    state: str = OtaState.RECEIVED
    previous: int | None = None  # the version serving before it (None: a new model)
    detail: str = ""
    reason: str | None = None
    committed: bool = False
    created: float = field(default_factory=time.time)
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.state in FINAL

    @property
    def uncommitted(self) -> bool:
        """Held and not yet decided: active and waiting for its commit, or still installing."""
        return self.hold and not self.committed and self.state not in (OtaState.FAILED,
                                                                       OtaState.ROLLED_BACK)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AttachedFile:
    """The artifact the socket received with its manifest: moved into staging as it is."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def wait(self, dest: Path, progress: Progress, stop: threading.Event) -> None:
        size = self.path.stat().st_size
        os.replace(self.path, dest)
        progress(size, size)


class LocalInstalls:
    def __init__(self, updater: Updater,
                 submit: Callable[[Callable[[], None]], None] | None = None) -> None:
        """`submit` runs a job on the OTA worker (OtaService.defer), after the updates queued
        before it; None: a worker of its own (a daemon without MQTT)."""
        self.updater = updater
        self._executor = None if submit is not None else \
            ThreadPoolExecutor(1, thread_name_prefix="edged-ota-local")
        self._pending: list[Future[None]] = []
        # Until recover() has run (the daemon's warm-up): its staging clean-up would take an
        # upload from under an install.
        self.accepting = False
        self.submit = submit or self._submit_own
        self.path = updater.repository.root / RECORD
        self._lock = threading.Lock()
        self._installs: dict[str, LocalInstall] = {}
        updater.held = self.holding

    def _submit_own(self, job: Callable[[], None]) -> None:
        assert self._executor is not None
        try:
            future: Future[None] = self._executor.submit(job)
        except RuntimeError:  # shutting down
            return
        self._pending = [f for f in self._pending if not f.done()] + [future]

    def stop(self, timeout_s: float) -> None:
        """Its own worker: an install under way finishes (bounded), queued ones are dropped.
        (On the OTA service's worker, the service stops it.)"""
        if self._executor is None:
            return
        self._executor.shutdown(wait=False, cancel_futures=True)
        for future in self._pending:
            try:
                future.result(timeout=timeout_s)
            except (CancelledError, FutureTimeout):
                pass

    # -- start-up ----------------------------------------------------------------------------
    def recover(self) -> None:
        """Read the record: held installs are held again; one a restart cut is failed. Then
        installs are taken."""
        try:
            rows = json.loads(self.path.read_text())
        except FileNotFoundError:
            rows = []
        except (OSError, ValueError) as exc:
            logger.error("OTA: cannot read %s (%s); held installs are forgotten", self.path, exc)
            rows = []
        for row in rows if isinstance(rows, list) else []:
            try:
                install = LocalInstall(**row)
            except TypeError:
                continue
            if not install.final:
                install.state, install.reason = OtaState.FAILED, "interrupted"
                install.detail = "the install was interrupted by a restart"
            elif install.uncommitted and self.updater.serving(install.model) != install.version:
                install.state, install.reason = OtaState.FAILED, "interrupted"
                install.detail = (f"version {install.version} no longer serves after a restart "
                                  f"(version {self.updater.serving(install.model)} does)")
            self._installs[install.id] = install
        if rows:
            self._save()
        self.accepting = True

    # -- what the API asks -------------------------------------------------------------------
    @property
    def max_bytes(self) -> int:
        return self.updater.fetcher.max_bytes

    def staging(self) -> Path:
        """Where an attached artifact is written as it arrives (beside the repository, so it
        moves into staging without a copy); Rejected('busy') while the daemon starts."""
        self._check_accepting()
        return self.updater.repository.staging_dir()

    def _check_accepting(self) -> None:
        if not self.accepting:
            raise Rejected("busy", "the daemon is starting: send the install again once it is "
                                   "ready (/v2/health/ready)")

    def begin(self, payload: bytes, artifact: Path | None, *, hold: bool,
              tag: str | None = None) -> dict[str, Any]:
        """Check the manifest (`payload`) and start its install on the OTA worker; Rejected
        with nothing changed when it is refused. `artifact`: the attached bytes, if any (this
        call owns the file from now on)."""
        try:
            self._check_accepting()
            manifest = parse_manifest(payload)
            self._check_delivery(manifest, artifact)
            if tag is not None and (len(tag) > 128 or not set(tag) <= _TAG_CHARS):
                raise Rejected("bad_request", "tag: up to 128 letters, digits and _ . - : + @")
            with self._lock:
                waiting = next((i for i in self._installs.values() if i.uncommitted), None)
                if hold and waiting is not None:
                    raise Rejected("uncommitted", self._describe(waiting))
            self._authentic(manifest)
            claimed = self.updater.claim(manifest)
        except Rejected as exc:
            if artifact is not None:
                artifact.unlink(missing_ok=True)
            self._report_refusal(payload, exc)
            raise
        install = LocalInstall(uuid.uuid4().hex[:12], manifest.model, manifest.version, hold,
                               tag, previous=self.updater.serving(manifest.model))
        with self._lock:
            self._installs[install.id] = install
        if not claimed:  # already serving exactly this: nothing to install or to undo
            if artifact is not None:
                artifact.unlink(missing_ok=True)
            install.state, install.previous = OtaState.ACTIVE, manifest.version
            install.detail = f"already serving version {manifest.version}"
            install.committed = not hold
            self._save()
            return install.to_dict()
        self._save()
        self.submit(lambda: self._run(install, manifest, artifact))
        return install.to_dict()

    def get(self, install_id: str) -> dict[str, Any]:
        return self._find(install_id).to_dict()

    def listing(self) -> list[dict[str, Any]]:
        with self._lock:
            return [i.to_dict() for i in sorted(self._installs.values(), key=lambda i: i.created)]

    def commit(self, install_id: str) -> dict[str, Any]:
        """Make a held install final: only once it is active and its version serves."""
        install = self._find(install_id)
        if install.committed:
            return install.to_dict()
        if install.state != OtaState.ACTIVE:
            raise Rejected("not_active", f"install {install.id} is {install.state}; only an "
                                         "active install can be committed")
        serving = self.updater.serving(install.model)
        if serving != install.version or not self.updater.cache.ready(install.model, serving):
            raise Rejected("not_active", f"{install.model} serves version {serving}, not a "
                                         f"ready version {install.version}")
        install.committed = True
        install.detail = f"committed: version {install.version} serves"
        self._save()
        logger.info("OTA %s:%d committed (%s)", install.model, install.version,
                    install.tag or install.id)
        return install.to_dict()

    def rollback(self, install_id: str) -> dict[str, Any]:
        """Undo a held install that is not committed: the version before it serves again. One
        that failed was already undone by the installer (nothing more to do)."""
        install = self._find(install_id)
        if install.state in (OtaState.FAILED, OtaState.ROLLED_BACK):
            return install.to_dict()
        if install.committed:
            raise Rejected("committed", f"install {install.id} was committed; roll the model "
                                        "back with a new install or `edged ota rollback`")
        if not install.final:
            raise Rejected("busy", f"install {install.id} is still {install.state}")
        if install.previous != install.version:
            self.updater.revert(install.model, install.version, install.previous,
                                f"install {install.tag or install.id} rolled back")
        install.state, install.reason = OtaState.ROLLED_BACK, "rolled_back"
        install.detail = ("nothing was installed" if install.previous == install.version else
                          f"version {install.previous} serves again"
                          if install.previous is not None else "the new model was removed")
        self._save()
        return install.to_dict()

    def holding(self, model: str) -> str | None:
        """Why `model` takes no other update now (Updater.held)."""
        with self._lock:
            held = next((i for i in self._installs.values()
                         if i.uncommitted and i.model == model), None)
            return None if held is None else self._describe(held)

    def observe(self, event: Event) -> None:
        """The installer's status events (any thread): the running install of that model."""
        with self._lock:
            install = next((i for i in self._installs.values()
                            if i.model == event.model and not i.final), None)
            if install is None:
                return
            install.events = [*install.events[-(KEEP_EVENTS - 1):], event.to_dict()]
            if event.state not in FINAL:  # the job itself sets the final state
                install.state, install.detail = event.state, event.detail

    # -- the job ---------------------------------------------------------------------------
    def _run(self, install: LocalInstall, manifest: Manifest, artifact: Path | None) -> None:
        try:
            self.updater.apply(manifest, AttachedFile(artifact) if artifact else None)
        except Rejected as exc:
            undone = any(e["state"] == OtaState.ROLLED_BACK for e in install.events)
            install.state = OtaState.ROLLED_BACK if undone else OtaState.FAILED
            install.reason, install.detail = exc.reason, str(exc)
        except Exception as exc:  # a bug must not kill the worker; say what happened
            logger.exception("OTA: local install of %s:%d failed", manifest.model,
                             manifest.version)
            install.state, install.reason, install.detail = OtaState.FAILED, "internal", repr(exc)
        else:
            install.state = OtaState.ACTIVE
            install.committed = not install.hold
            install.detail = f"serving version {manifest.version}" + (
                "; waiting for a commit" if install.hold else "")
        finally:
            self.updater.release(manifest)
            if artifact is not None:
                artifact.unlink(missing_ok=True)
        self._save()

    # -- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _check_delivery(manifest: Manifest, artifact: Path | None) -> None:
        if manifest.artifact.chunks is not None:
            raise Rejected("bad_manifest", "artifact.chunks come over MQTT; through the socket "
                                           "send the bytes with the manifest (no url, no chunks)")
        if manifest.artifact.attached and artifact is None:
            raise Rejected("bad_manifest", "the manifest's artifact has no url, and no bytes "
                                           "came after the manifest")
        if not manifest.artifact.attached and artifact is not None:
            raise Rejected("bad_manifest", "bytes came with a manifest whose artifact has a url "
                                           "(leave the url out to attach them)")

    def _authentic(self, manifest: Manifest) -> None:
        """Signed by a trusted key (unless ota.allow_unsigned), and fresh for `local`."""
        allow_unsigned = self.updater.cfg.allow_unsigned
        journal = self.updater.journal
        self.updater.trust.verify(manifest, allow_unsigned=allow_unsigned)
        fresh = check_fresh(manifest.raw, root=LOCAL_ROOT,
                            accepted=journal.accepted_seq(manifest.model),
                            allow_unsigned=allow_unsigned, bad="bad_manifest", idempotent=True)
        if fresh is not None:
            try:
                journal.accept_seq(manifest.model, fresh.seq, fresh.digest)
            except OSError as exc:
                raise Rejected("internal", f"cannot record the manifest's seq: {exc}") from None

    def _report_refusal(self, payload: bytes, exc: Rejected) -> None:
        """On the model's status topic, as a refused MQTT manifest is (retained unless it says
        nothing about the model's state)."""
        try:
            manifest = parse_manifest(payload)
        except Rejected:
            return  # no model to report it for; the caller has the answer
        self.updater.report(Event(manifest.model, manifest.version, OtaState.FAILED, str(exc),
                                  reason=exc.reason, transient=exc.reason in TRANSIENT))

    def _find(self, install_id: str) -> LocalInstall:
        with self._lock:
            install = self._installs.get(install_id)
        if install is None:
            raise Rejected("unknown_install", f"no install {install_id[:40]!r} (edged keeps "
                                              f"held installs and the last {KEEP_DONE} others)")
        return install

    @staticmethod
    def _describe(install: LocalInstall) -> str:
        return (f"the install of {install.model} version {install.version} "
                f"({install.tag or install.id}) is not committed: commit or roll it back "
                "first (mender commit | mender rollback)")

    def _save(self) -> None:
        """Held installs and the latest finished ones, atomically."""
        with self._lock:
            done = sorted((i for i in self._installs.values() if not i.uncommitted),
                          key=lambda i: i.created)[:-KEEP_DONE]
            for install in done:
                del self._installs[install.id]
            rows = [{**i.to_dict(), "events": i.events[-4:]} for i in self._installs.values()]
        try:
            write_atomically(self.path, json.dumps(rows) + "\n")
        except OSError as exc:  # the installs go on; a restart would forget the held ones
            logger.error("OTA: cannot write %s: %s", self.path, exc)
