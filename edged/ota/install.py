"""Installing one verified update, rolling back, and recovering after a crash.

The order makes every crash safe. Before the new version's directory appears, the model's
active pointer is pinned to the serving version and a journal (`<name>/.ota-pending`) names
the version being installed. The pointer moves only after the cache has loaded, warmed and
golden-checked the new version and switched requests to it. A restart that finds the journal
removes the version unless the pointer reached it, so a power cut at any step leaves the old
version serving; leftover staging files go at the same time.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edged.cache import ModelCache
from edged.config import OtaConfig
from edged.errors import EdgedError, InvalidModel, ModelNotFound
from edged.fsutil import file_sha256, write_atomically
from edged.model.repository import MODEL_FILE, ModelRepository, ModelVersion
from edged.model.signature import read_signature
from edged.ota.bundle import GOLDEN, unpack
from edged.ota.fetch import ChunkAssembler, Fetcher
from edged.ota.manifest import Manifest, Rejected, Tensor, TrustStore
from edged.states import OtaState

logger = logging.getLogger(__name__)

PENDING = ".ota-pending"  # <models>/<name>/: "<version> <sha256>" of an unfinished install
CRASHES = ".ota-crashes"  # <models>/<name>/: {sha256: installs of it cut by a restart}
MAX_CRASHES = 2  # an artifact whose install was cut this often is not tried again
RECORD = ".ota.json"  # <models>/<name>/<version>/: the manifest that installed it
# Tests set this to a state name to make the daemon SIGKILL itself as it enters that state
# (plus "switched": after the swap, before the pointer moves), to prove crash safety.
CRASH_AT_ENV = "EDGED_TEST_OTA_CRASH_AT"


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


class Updater:
    """Applies updates one at a time per model; another update of a model that is updating
    is refused with reason `busy` (the fleet tool re-pushes; a queue would hide staleness)."""

    def __init__(self, repository: ModelRepository, cache: ModelCache, cfg: OtaConfig,
                 trust: TrustStore, report: Report, *, fetcher: Fetcher | None = None,
                 drain_timeout_s: float = 30.0) -> None:
        self.repository = repository
        self.cache = cache
        self.cfg = cfg
        self.trust = trust
        self.report = report
        self.stop = threading.Event()
        self.fetcher = fetcher or Fetcher(max_bytes=cfg.max_artifact_mb * 1024 * 1024,
                                          ca_file=cfg.ca_file, stop=self.stop)
        self.drain_timeout_s = drain_timeout_s
        self._lock = threading.Lock()
        self._busy: dict[str, int] = {}

    # -- one update ------------------------------------------------------------------------
    def claim(self, manifest: Manifest) -> bool:
        """Reserve the model for this update; False when it needs no work (this exact
        manifest is already active, e.g. a retained fleet manifest seen again)."""
        with self._lock:
            held = self._busy.get(manifest.model)
            if held == manifest.version:  # the same push again (a retained manifest re-sent)
                return False
            if held is not None:
                raise Rejected("busy", f"an update of {manifest.model} to version {held} is in "
                                       "progress; push again when it has finished")
            if self._installed_record(manifest.model) == manifest.artifact.sha256 and \
                    self._current(manifest.model) == manifest.version:
                return False
            crashes = self._crashes(manifest.model).get(manifest.artifact.sha256, 0)
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

    def apply(self, manifest: Manifest, chunks: ChunkAssembler | None = None) -> None:
        """Check, stage, install, warm, golden-check, switch. The caller holds claim().
        Raises Rejected (with nothing changed, or after an automatic rollback)."""
        try:
            stage = self._stage(manifest, chunks)
        except Rejected as exc:
            self._emit(manifest, OtaState.FAILED, str(exc), reason=exc.reason)
            raise
        self._install(manifest, stage)

    def _stage(self, manifest: Manifest, chunks: ChunkAssembler | None) -> Path:
        """Everything before the repository changes: verified files in a staging folder."""
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
        stage = self.repository.staging_dir() / f"ota-{name}-{version}-{uuid.uuid4().hex[:8]}"
        stage.mkdir()
        staged = False
        try:
            artifact = stage / "artifact"
            self._crash_point("downloading")
            meter = _Meter(lambda p: self._emit(manifest, OtaState.DOWNLOADING, progress=p))
            if chunks is not None:
                chunks.wait(artifact, meter, self.stop)
            else:
                self.fetcher.fetch(manifest.artifact, artifact, meter)
            self._emit(manifest, OtaState.VERIFYING)
            self._crash_point("verifying")
            self._verify_artifact(manifest, artifact)
            files = stage / "version"
            files.mkdir()
            if manifest.format == "onnx":
                os.rename(artifact, files / MODEL_FILE)
            else:
                unpack(artifact, files, self.fetcher.max_bytes)
                artifact.unlink()
            try:
                read_signature(files / MODEL_FILE)
            except InvalidModel as exc:
                raise Rejected("corrupt_model", str(exc)) from None
            try:
                candidate = self.repository.read_candidate(name, files)
            except InvalidModel as exc:  # readable, but not what model.yaml declares
                raise Rejected("io_mismatch", str(exc)) from None
            self._check_io(manifest, candidate, current)
            (files / RECORD).write_text(json.dumps(dict(manifest.raw), sort_keys=True))
            staged = True
            return files
        finally:
            if not staged:  # a refusal, or anything else that stopped it, leaves no trace
                shutil.rmtree(stage, ignore_errors=True)

    def _install(self, manifest: Manifest, files: Path) -> None:
        name, version = manifest.model, manifest.version
        current = self._current(name)
        self._emit(manifest, OtaState.INSTALLING)
        self._crash_point("installing")
        try:
            if current is not None and self.repository.active_version(name) is None:
                self.repository.set_active(name, current)  # pinned: the new one is not yet
            (self.repository.root / name).mkdir(parents=True, exist_ok=True)
            write_atomically(self.repository.root / name / PENDING,
                             f"{version} {manifest.artifact.sha256}\n")
            if version in self._on_disk(name):  # an earlier, failed or rolled-back attempt
                self.cache.unload(name, version, timeout_s=self.drain_timeout_s)
                self.repository.remove_version(name, version)
            self.repository.adopt(name, version, files)
        except (OSError, EdgedError) as exc:
            shutil.rmtree(files.parent, ignore_errors=True)
            self._undo(manifest, current, f"install failed: {exc}", "install_failed")
        shutil.rmtree(files.parent, ignore_errors=True)
        try:
            self._emit(manifest, OtaState.WARMING)
            self._crash_point("warming")
            self.cache.load(name, version)
            self._golden_check(name, version)
            self.cache.swap(name, version, drain_timeout_s=self.drain_timeout_s)
            self._crash_point("switched")
            self.repository.set_active(name, version)
        except Rejected as exc:
            self._undo(manifest, current, str(exc), exc.reason)
        except (OSError, EdgedError) as exc:
            self._undo(manifest, current, f"{type(exc).__name__}: {exc}", "warmup_failed")
        (self.repository.root / name / PENDING).unlink(missing_ok=True)
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
            (self.repository.root / name / PENDING).unlink(missing_ok=True)
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
        fleet-wide rollback must not take a device that never updated one step further)."""
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

    # -- start-up ----------------------------------------------------------------------------
    def recover(self) -> list[str]:
        """After a crash: drop staging leftovers and every half-done install. Returns what
        was done, one line per model, for the log."""
        done = []
        self.repository.clean_staging()
        for name in self.repository.names():
            journal = self.repository.root / name / PENDING
            if not journal.is_file():
                continue
            version, _, sha256 = journal.read_text().strip().partition(" ")
            pending = int(version) if version.isdigit() else None
            if pending is not None and self.repository.active_version(name) != pending and \
                    pending in self._on_disk(name):
                self.repository.remove_version(name, pending)
                crashes = self._count_crash(name, sha256)
                done.append(f"{name}: removed version {pending}, whose install was interrupted"
                            + (f" ({crashes} times: not tried again)"
                               if crashes >= MAX_CRASHES else ""))
                self.report(Event(name, pending, OtaState.ROLLED_BACK, "the install was "
                                  "interrupted by a restart; the previous version serves",
                                  reason="interrupted"))
            journal.unlink(missing_ok=True)
        for line in done:
            logger.warning("OTA recovery: %s", line)
        return done

    # -- checks ------------------------------------------------------------------------------
    def _verify_artifact(self, manifest: Manifest, path: Path) -> None:
        size = path.stat().st_size
        if size != manifest.artifact.size:
            raise Rejected("size_mismatch", f"the artifact is {size} bytes; the manifest says "
                                            f"{manifest.artifact.size}")
        digest = file_sha256(path)
        if digest != manifest.artifact.sha256:
            raise Rejected("sha256_mismatch", f"the artifact's sha256 is {digest[:16]}..., the "
                                              f"manifest says {manifest.artifact.sha256[:16]}...")

    def _check_io(self, manifest: Manifest, candidate: ModelVersion, current: int | None) -> None:
        got = _signature(candidate)
        if manifest.io is not None:
            batched = candidate.max_batch_size > 0
            want = tuple(tuple(Tensor(t.name, t.dtype, ((-1,) if batched else ()) + t.shape)
                               for t in side) for side in manifest.io)
            if not _compatible(want, got):
                raise Rejected("io_mismatch", f"the model's I/O {_describe(got)} is not the "
                                              f"manifest's {_describe(want)}")
        if current is None or manifest.allow_io_change:
            return
        serving = _signature(self.repository.get(manifest.model, current))
        if not _compatible(serving, got):
            raise Rejected("io_mismatch", f"version {manifest.version} has I/O "
                                          f"{_describe(got)}; version {current} has "
                                          f"{_describe(serving)} (set allow_io_change)")

    def _golden_check(self, name: str, version: int) -> None:
        folder = self.repository.root / name / str(version) / GOLDEN
        if not folder.is_dir():
            return
        try:
            tolerance = {"rtol": 1e-3, "atol": 1e-5}
            if (folder / "tolerance.json").is_file():
                tolerance.update(json.loads((folder / "tolerance.json").read_text()))
            with np.load(folder / "inputs.npz") as f:
                inputs = {k: f[k] for k in f.files}
            with np.load(folder / "outputs.npz") as f:
                expected = {k: f[k] for k in f.files}
        except (OSError, ValueError, TypeError) as exc:
            raise Rejected("golden_failed", f"unreadable golden check: {exc}") from None
        with self.cache.acquire(name, version) as lease:
            try:
                outputs = lease.session.infer(inputs)
            except EdgedError as exc:
                raise Rejected("golden_failed", f"the golden inputs do not run: {exc}") from None
        for key, want in expected.items():
            got = outputs.get(key)
            if got is None or got.shape != want.shape or not np.allclose(
                    got, want, rtol=float(tolerance["rtol"]), atol=float(tolerance["atol"])):
                worst = float(np.max(np.abs(got - want))) if got is not None and \
                    got.shape == want.shape else float("nan")
                raise Rejected("golden_failed", f"output {key!r} differs from the golden "
                                                f"output (max abs error {worst:.3g}, tolerance "
                                                f"{tolerance})")

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

    def _installed_record(self, name: str) -> str | None:
        current = self._current(name)
        if current is None:
            return None
        try:
            record = json.loads((self.repository.root / name / str(current) / RECORD)
                                .read_text())
            return str(record["artifact"]["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _crashes(self, name: str) -> dict[str, int]:
        try:
            counts = json.loads((self.repository.root / name / CRASHES).read_text())
        except (OSError, ValueError):
            return {}
        return {k: v for k, v in counts.items() if isinstance(v, int)} \
            if isinstance(counts, dict) else {}

    def _count_crash(self, name: str, sha256: str) -> int:
        counts = self._crashes(name)
        counts[sha256] = counts.get(sha256, 0) + 1
        write_atomically(self.repository.root / name / CRASHES, json.dumps(counts) + "\n")
        return counts[sha256]

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

    @staticmethod
    def _crash_point(state: str) -> None:
        if os.environ.get(CRASH_AT_ENV) == state:
            logger.warning("OTA: %s=%s: killing this process", CRASH_AT_ENV, state)
            os.kill(os.getpid(), signal.SIGKILL)


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


def _signature(model: ModelVersion) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    return tuple(tuple(Tensor(s.name, str(s.dtype), tuple(s.shape)) for s in side)
                 for side in (model.inputs, model.outputs))  # type: ignore[return-value]


def _compatible(a: tuple[tuple[Tensor, ...], ...], b: tuple[tuple[Tensor, ...], ...]) -> bool:
    """Same names and dtypes; shapes equal where both are fixed (-1 matches anything)."""
    for side_a, side_b in zip(a, b, strict=True):
        if sorted(t.name for t in side_a) != sorted(t.name for t in side_b):
            return False
        by_name = {t.name: t for t in side_b}
        for t in side_a:
            u = by_name[t.name]
            if t.dtype != u.dtype or len(t.shape) != len(u.shape) or any(
                    x != y and x != -1 and y != -1 for x, y in zip(t.shape, u.shape,
                                                                   strict=True)):
                return False
    return True


def _describe(sig: tuple[tuple[Tensor, ...], ...]) -> str:
    inputs, outputs = (", ".join(f"{t.name}:{t.dtype}{list(t.shape)}" for t in side)
                       for side in sig)
    return f"({inputs}) -> ({outputs})"
