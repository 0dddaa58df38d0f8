"""The warm model cache: keeps loaded model versions (its `ModelLoader` loads and warms them),
hands out refcounted leases, evicts idle unpinned models over a byte budget (LRU), swaps
versions without a gap, and moves a model onto its chosen backend once that is ready."""

from __future__ import annotations

import copy
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from functools import partial

from edged.backends import BackendOptions
from edged.core.errors import EdgedError, ModelLoadError, ModelNotFound, Timeout
from edged.core.states import ModelState
from edged.hardware.host import trim_heap
from edged.inference.entries import Entry, Lease
from edged.inference.loader import Loaded, ModelLoader, journal_fields
from edged.inference.modelstatus import ModelCounters, ModelStatus
from edged.model.repository import ModelRepository, ModelVersion

logger = logging.getLogger(__name__)

Key = tuple[str, int]
# After a failed load, requests get the same error for this long instead of reloading each time.
FAILED_LOAD_RETRY_S = 5.0
# A caller waits this long for another caller's load of the same version (engines build in the
# background, so a load is an ONNX Runtime session, its precision choice and a warm-up).
LOAD_WAIT_S = 300.0


class ModelCache:
    def __init__(self, repository: ModelRepository, *, budget_bytes: int,
                 options: BackendOptions | None = None, pinned: Iterable[str] = (),
                 default_backend: str = "auto", loader: ModelLoader | None = None,
                 load_wait_s: float = LOAD_WAIT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`loader` loads and warms versions (default: one on `options` and
        `default_backend`); `load_wait_s` bounds a wait for another caller's load."""
        self.repository = repository
        self.budget_bytes = budget_bytes
        self.pinned = set(pinned)
        self.loader = loader or ModelLoader(repository, options or BackendOptions(),
                                            default_backend=default_backend, clock=clock)
        self.load_wait_s = load_wait_s
        self._clock = clock
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a lease returned or a load ended
        self._waiting = 0  # threads waiting on _changed (a lease returned wakes them)
        self._entries: dict[Key, Entry] = {}
        self._load_locks: dict[Key, threading.Lock] = {}
        self._loading: set[Key] = set()
        self._failed: dict[Key, tuple[float, EdgedError]] = {}
        self._active: dict[str, int] = {}  # name -> version that requests without one get
        self._retired: set[Key] = set()  # swapped out: a late load of one unloads after use
        self._bytes = 0  # sum of nbytes over _entries, kept as they come and go
        self._counters: dict[str, ModelCounters] = {}  # name -> counts, under _lock
        self._unpreloaded: dict[str, str] = {}  # name -> why preloading left it out
        # Called (name, version), lock held, when a version's session stops serving (unloaded,
        # evicted, swapped out, upgraded): what was computed on it (cached answers) can go.
        self.session_gone: list[Callable[[str, int], None]] = []
        self.evictions = 0
        # Bumped (lock held) whenever what a name or a version serves may have changed: a
        # version loaded (its files read afresh), upgraded onto another backend, or made the
        # active one. A batcher that sees it move asks `serving` and checks requests against
        # that from then on (issue 49: not against the version its workers last ran).
        self.epoch = 0

    @property
    def options(self) -> BackendOptions:
        """The options models load with (the scheduler's pools follow its memory kind)."""
        return self.loader.options

    # -- leases ------------------------------------------------------------------------------
    def default_version(self, name: str) -> int:
        with self._lock:
            version = self._active.get(name)
        return version if version is not None else self.repository.default_version(name)

    def describe(self, name: str, version: int | None = None) -> ModelVersion:
        """The model's parsed config and signature, without loading it. An explicit version
        must be served by the policy (or be loaded or active here)."""
        if version is None:
            return self.repository.get(name, self.default_version(name))
        with self._lock:
            known = (name, version) in self._entries or self._active.get(name) == version
        if known:
            return self.repository.get(name, version)
        return self.repository.resolve(name, version)

    def serving(self, name: str, version: int | None = None) -> ModelVersion | None:
        """The version requests for `name` (or for `version` itself) run on now, if it is
        loaded: from memory only, never the disk."""
        with self._lock:
            version = self._active.get(name) if version is None else version
            entry = self._entries.get((name, version)) if version is not None else None
            return None if entry is None else entry.model

    def acquire_loaded(self, name: str, version: int | None = None) -> Lease | None:
        """Lease the model only if it is loaded now (never loads, never reads the disk)."""
        with self._lock:
            version = self._active.get(name) if version is None else version
            entry = self._entries.get((name, version)) if version is not None else None
            if entry is None:
                return None
            entry.refs += 1
            entry.last_used = self._clock()
            return Lease(self, entry)

    def acquire(self, name: str, version: int | None = None) -> Lease:
        """Lease a ready model (loading and warming it first if needed)."""
        key = (name, self.default_version(name) if version is None else version)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:  # the hot path: one dict lookup under the lock
                entry.refs += 1
                entry.last_used = self._clock()
                return Lease(self, entry)
        if version is not None:
            self.describe(name, version)  # policy check: raises ModelNotFound if not served
        return Lease(self, self._load(key, lease=True))

    def _release(self, entry: Entry) -> None:
        doomed: list[Entry] = []
        with self._lock:
            entry.refs -= 1
            if entry.refs == 0:
                if entry.retiring:
                    doomed.append(entry)
                    self._drop(entry)
                elif self._bytes > self.budget_bytes:
                    doomed = self._pick_evictions()
                if self._waiting:  # an unload (no one else waits here)
                    self._changed.notify_all()
        if doomed:
            self._close(doomed)

    # -- loading -----------------------------------------------------------------------------
    def load(self, name: str, version: int | None = None) -> ModelVersion:
        """Load and warm a model now (preload, explicit load); clears a remembered failure."""
        key = (name, self.default_version(name) if version is None else version)
        return self._load_explicitly(key).model

    def preload(self, names: Iterable[str], *, why: str = "preload",
                within_budget: bool = False) -> list[str]:
        """Load and warm each model named (its active version); a model that fails is logged
        and left unavailable, the others still load. `within_budget`: a model whose file
        would take the cache over its budget is left to load on first request (said in the
        log and in its status row) instead of evicting one preloaded before it. Returns the
        names that did not load."""
        missed = []
        for name in names:
            try:
                if within_budget and not self._fits(name):
                    missed.append(name)
                    continue
                self.load(name)
            except EdgedError as exc:
                missed.append(name)
                logger.error("%s of %s failed: %s", why, name, exc,
                             extra={"model": name, "code": exc.code})
        return missed

    def _fits(self, name: str) -> bool:
        """Whether `name`'s serving version would fit beside what is loaded (its file's size
        estimates what a backend charges); when not, remembers why for its status row."""
        if self.ready(name):
            return True
        model = self.repository.get(name, self.default_version(name))
        size = model.model_path.stat().st_size
        with self._lock:
            fits = self._bytes + size <= self.budget_bytes
            if not fits:
                self._unpreloaded[name] = (
                    f"not preloaded: the cache budget ({self.budget_bytes / 1e6:.0f} MB) is "
                    f"full ({self._bytes / 1e6:.1f} MB loaded, {size / 1e6:.1f} MB more "
                    "needed); loads on first request")
        if not fits:
            logger.warning("%s: %s", name, self._unpreloaded[name],
                           extra={"model": name, "code": "model_not_preloaded"})
        return fits

    def _load_explicitly(self, key: Key) -> Entry:
        with self._lock:
            self._failed.pop(key, None)
            self._retired.discard(key)
        entry = self._load(key, lease=False)
        with self._lock:
            entry.retiring = False  # wanted again, e.g. swapped back while it was draining
        return entry

    def _load(self, key: Key, *, lease: bool) -> Entry:
        with self._held(self._load_lock(key), f"{key[0]}:{key[1]} is still loading"):
            entry, doomed = self._load_locked(key, lease=lease)
        self._close(doomed)
        if entry.upgrade is not None:  # outside the locks: a done future calls back at once
            entry.upgrade.add_done_callback(partial(self._upgrade, key, entry))
        return entry

    def _load_locked(self, key: Key, *, lease: bool) -> tuple[Entry, list[Entry]]:
        """One load per model version (its load lock held): a second caller shares it. Returns
        the entry and what its arrival evicted, for the caller to close outside the locks."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.refs += lease
                entry.last_used = self._clock()
                return entry, []
            failed = self._failed.get(key)
            if failed and self._clock() - failed[0] < FAILED_LOAD_RETRY_S:
                # A fresh copy: re-raising one object would grow its traceback (and keep
                # every failed caller's frames alive) with each raise.
                raise copy.copy(failed[1])
            self._loading.add(key)
        try:
            default = self.default_version(key[0])
            entry = self._entry(self.loader.load(*key))
        except Exception as exc:
            error = exc if isinstance(exc, EdgedError) else ModelLoadError(
                f"{key[0]}:{key[1]}: loading failed: {exc}")
            if error is not exc:
                logger.exception("%s:%d: loading failed", *key,
                                 extra={"model": key[0], "version": key[1]})
            with self._lock:
                self._failed[key] = (self._clock(), copy.copy(error))
                self._count(key[0]).failed_loads += 1
            if error is exc:
                raise
            raise error from exc
        finally:
            with self._lock:
                self._loading.discard(key)
        with self._lock:
            entry.refs = int(lease)
            entry.retiring = key in self._retired  # a version swapped out meanwhile
            self._entries[key] = entry
            self.epoch += 1
            self._bytes += entry.nbytes
            self._failed.pop(key, None)
            self._count_load(entry)
            # Routing sticks to what was loaded: a version dropped on disk must not take
            # requests before it is warmed and swapped in.
            self._active.setdefault(key[0], default)
            # Never the model just loaded: its caller wants it (and may hold no lease).
            doomed = self._pick_evictions(keep=key) if self._bytes > self.budget_bytes else []
            self._changed.notify_all()
        return entry, doomed

    def _upgrade(self, key: Key, waiting: Entry, ready: Future[None]) -> None:
        """The backend `waiting` fell back from is ready (its engine is built): load and warm
        the model there and put it in `waiting`'s place, as a swap does. Leases already taken
        finish on the old session, which closes when the last is returned. A failed build or
        load leaves `waiting` serving. Runs on the thread that completed `ready`."""
        label = waiting.model.label
        if ready.cancelled() or ready.exception() is not None:
            logger.warning("%s stays on %s: %s", label, waiting.backend,
                           "cancelled" if ready.cancelled() else ready.exception(),
                           extra=journal_fields(waiting.model, "model_upgrade_failed"))
            return
        try:
            with self._held(self._load_lock(key), f"{label} is busy loading or unloading"):
                upgraded, doomed = self._upgrade_locked(key, waiting)
        except Exception as exc:  # anything from the backend, or a timeout: keep the fallback
            logger.warning("%s stays on %s: %s", label, waiting.backend, exc,
                           extra=journal_fields(waiting.model, "model_upgrade_failed"))
            return
        self._close(doomed)
        if upgraded is not None:
            logger.info("%s: requests now go to %s (was %s)", label, upgraded.backend,
                        waiting.backend, extra=journal_fields(waiting.model, "model_upgraded"))

    def _upgrade_locked(self, key: Key, waiting: Entry) -> tuple[Entry | None, list[Entry]]:
        """Load the upgrade and swap it in (the version's load lock held). Returns the entry
        now serving (None: nothing changed) and the entries to close: `waiting` once idle,
        evictions, or the upgrade itself when `waiting` went meanwhile."""
        with self._lock:
            if self._entries.get(key) is not waiting or waiting.retiring:
                return None, []  # unloaded, evicted or swapped out: a later load asks afresh
        entry = self._entry(self.loader.load(*key, upgrading=True))
        with self._lock:
            if self._entries.get(key) is not waiting or waiting.retiring:
                return None, [entry]
            self._entries[key] = entry
            self.epoch += 1
            self._bytes += entry.nbytes - waiting.nbytes
            for gone in self.session_gone:
                gone(*key)
            waiting.retiring = True  # _release closes it after the last lease
            doomed = [waiting] if waiting.refs == 0 else []
            self._count_load(entry)
            if self._bytes > self.budget_bytes:
                doomed += self._pick_evictions(keep=key)
            self._changed.notify_all()
        return entry, doomed

    def _entry(self, loaded: Loaded) -> Entry:
        return Entry(loaded.model, loaded.session, loaded.backend, loaded.session.nbytes,
                     loaded.seconds, self._clock(), precision=loaded.precision,
                     upgrade=loaded.upgrade)

    def _load_lock(self, key: Key) -> threading.Lock:
        with self._lock:
            return self._load_locks.setdefault(key, threading.Lock())

    @contextmanager
    def _held(self, lock: threading.Lock, busy: str) -> Iterator[None]:
        """Hold `lock`, waiting at most `load_wait_s` for it (Timeout naming `busy`)."""
        if not lock.acquire(timeout=self.load_wait_s):
            raise Timeout(f"{busy} after {self.load_wait_s:g} s")
        try:
            yield
        finally:
            lock.release()

    def _count_load(self, entry: Entry) -> None:
        """A load that succeeded, and how long it took (lock held)."""
        counters = self._count(entry.model.name)
        counters.loads += 1
        counters.load_seconds = {**counters.load_seconds, entry.model.version: entry.load_seconds}

    # -- eviction and unloading --------------------------------------------------------------
    def _drop(self, entry: Entry) -> None:
        """Forget an entry (lock held); the caller closes its session outside the lock. An
        entry already replaced under its key (by `_upgrade`) leaves its successor in place."""
        key = (entry.model.name, entry.model.version)
        if self._entries.get(key) is entry:
            del self._entries[key]
            self._bytes -= entry.nbytes
            for gone in self.session_gone:
                gone(*key)

    def _pick_evictions(self, keep: Key | None = None) -> list[Entry]:
        """Idle, unpinned models, least recently used first, until under budget (lock held)."""
        doomed = []
        idle = sorted((e for k, e in self._entries.items()
                       if e.refs == 0 and e.model.name not in self.pinned and k != keep),
                      key=lambda e: e.last_used)
        for entry in idle:
            if self._bytes <= self.budget_bytes:
                break
            doomed.append(entry)
            self._drop(entry)
            self.evictions += 1
            self._count(entry.model.name).evictions += 1
            logger.info("evicting %s (idle, %.1f MB) to stay within the %.1f MB budget",
                        entry.model.label, entry.nbytes / 1e6, self.budget_bytes / 1e6,
                        extra=journal_fields(entry.model, "model_evicted"))
        if self._bytes > self.budget_bytes:
            logger.warning("model cache over budget (%.1f MB > %.1f MB): the rest is pinned or "
                           "in use", self._bytes / 1e6, self.budget_bytes / 1e6)
        return doomed

    def _close(self, entries: Iterable[Entry]) -> None:
        closed = False
        for entry in entries:
            try:
                entry.session.close()
                closed = True
            except Exception:  # a backend's close: log and go on
                logger.exception("%s: closing the session failed", entry.model.label)
        if closed:
            trim_heap()  # what the session freed goes back to the system, not to the heap

    def unload(self, name: str, version: int | None = None, *, timeout_s: float = 30.0) -> bool:
        """Unload once in-flight leases are returned; False if they were not within timeout."""
        key = (name, self.default_version(name) if version is None else version)
        deadline = self._clock() + timeout_s
        with self._lock:
            load_lock = self._load_locks.setdefault(key, threading.Lock())
        # A load of this version in flight lands first, then goes with the rest.
        if not load_lock.acquire(timeout=max(0.0, timeout_s)):
            logger.warning("%s:%d is still loading after %.1fs; not unloaded", *key, timeout_s)
            return False
        try:
            with self._lock:
                entry = self._entries.get(key)
                if entry is None:
                    return True
                entry.retiring = True
                while entry.refs > 0:
                    left = deadline - self._clock()
                    if left <= 0:
                        logger.warning("%s still in use after %.1fs; it unloads when released",
                                       entry.model.label, timeout_s)
                        return False
                    self._waiting += 1
                    try:
                        self._changed.wait(left)
                    finally:
                        self._waiting -= 1
                self._drop(entry)
        finally:
            load_lock.release()
        self._close([entry])
        logger.info("unloaded %s", entry.model.label)
        return True

    def swap(self, name: str, version: int, *, drain_timeout_s: float = 30.0) -> None:
        """Load and warm `version` beside the current one, switch new requests to it atomically,
        then drain and unload the old one. A failure leaves the old version serving."""
        old = self.default_version(name)
        self._load_explicitly((name, version))
        with self._lock:
            self._active[name] = version
            self.epoch += 1
            if old != version:
                self._retired.add((name, old))
        logger.info("%s: requests now go to version %d (was %d)", name, version, old)
        if old != version:
            self.unload(name, old, timeout_s=drain_timeout_s)

    def close(self, *, timeout_s: float = 10.0) -> None:
        deadline = self._clock() + timeout_s
        for name, version in list(self._entries):
            self.unload(name, version, timeout_s=max(0.0, deadline - self._clock()))

    # -- status ------------------------------------------------------------------------------
    def status(self) -> list[ModelStatus]:
        """Every model version served or loaded, with its state."""
        rows: dict[Key, ModelStatus] = {}
        for name in self.repository.names():
            try:
                versions = self.repository.served_versions(name)
            except EdgedError as exc:
                rows[(name, 0)] = ModelStatus(name, 0, ModelState.UNAVAILABLE, reason=str(exc))
                continue
            for version in versions:
                rows[(name, version)] = ModelStatus(
                    name, version, ModelState.UNAVAILABLE, pinned=name in self.pinned,
                    reason=self._unpreloaded.get(name, "unloaded; loads on first request"))
        with self._lock:
            for key in self._loading:
                rows[key] = ModelStatus(*key, ModelState.LOADING, pinned=key[0] in self.pinned)
            for key, (_when, error) in self._failed.items():
                rows[key] = ModelStatus(*key, ModelState.UNAVAILABLE, reason=str(error))
            for key, e in self._entries.items():
                rows[key] = ModelStatus(*key, ModelState.READY, e.backend,
                                        tuple(e.session.providers), e.nbytes, e.refs,
                                        key[0] in self.pinned, e.load_seconds,
                                        precision=e.precision)
        return [rows[k] for k in sorted(rows)]

    def counters(self) -> list[ModelCounters]:
        """Loads, failed loads, evictions and last load times, per model loaded at least once."""
        with self._lock:
            return [dataclasses.replace(c) for _, c in sorted(self._counters.items())]

    def _count(self, name: str) -> ModelCounters:
        """The model's counters (lock held)."""
        counters = self._counters.get(name)
        if counters is None:
            counters = self._counters[name] = ModelCounters(name)
        return counters

    def loaded(self) -> list[str]:
        """`name:version` of every loaded version, from memory only (no disk reads: the health
        tick calls it on the event loop)."""
        with self._lock:
            return [f"{name}:{version}" for name, version in sorted(self._entries)]

    def serving_on(self, name: str, version: int) -> str:
        """`backend:provider` of a loaded version, from memory ("unknown" when not loaded):
        results name what really ran them."""
        with self._lock:
            entry = self._entries.get((name, version))
        if entry is None or not entry.session.providers:
            return "unknown"
        return f"{entry.backend}:{entry.session.providers[0]}"

    def ready(self, name: str, version: int | None = None) -> bool:
        try:
            key = (name, self.default_version(name) if version is None else version)
        except ModelNotFound:
            return False
        with self._lock:
            return key in self._entries
