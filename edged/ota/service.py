"""OTA over MQTT: manifests in on the device's, the fleet's and its groups' topics, chunks and
commands in, status events out. The MQTT thread only parses and hands over. An update's
download runs on a thread of the download pool (`ota.max_parallel_downloads`), beside other
models' (a slow artifact server holds up only its own model's update; the staging disk and
the link are one budget: `edged.ota.transfer`); then its install joins the one worker that
installs, runs commands and deferred jobs one at a time, as every install did before. A
second update of a model that is updating is refused with reason `busy`."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from edged.core.errors import ModelNotFound
from edged.core.numbers import ascii_int
from edged.core.redact import remote_text
from edged.core.states import OtaState
from edged.model.repository import check_model_name
from edged.mqtt import topics
from edged.mqtt.link import MqttLink
from edged.ota.fetch import ChunkAssembler
from edged.ota.freshness import Freshness, check_fresh
from edged.ota.install import Event, Updater
from edged.ota.manifest import (
    FINAL,
    MAX_MANIFEST_BYTES,
    Rejected,
    parse_command,
    parse_manifest,
)

logger = logging.getLogger(__name__)

# Refusals that say nothing about the model's state (the update never started): published,
# never retained, so a replayed or stray message cannot overwrite the retained final state.
NOT_A_MODEL_STATE = frozenset({"busy", "stale", "replayed", "expired", "wrong_target"})


class OtaService:
    def __init__(self, updater: Updater, link: MqttLink, *, fleet_prefix: str,
                 groups: list[str], chunk_timeout_s: float, max_downloads: int = 4,
                 local_dirs: Iterable[Path] = ()) -> None:
        """`local_dirs`: folders besides the model repository (and its staging) that an
        update's detail may name: published without them (edged.core.redact)."""
        self.updater = updater
        self.local_dirs = tuple(local_dirs)
        self.link = link
        self.roots = [link.prefix, fleet_prefix.rstrip("/"),
                      *(f"{fleet_prefix.rstrip('/')}/groups/{g}" for g in groups)]
        self.chunk_timeout_s = chunk_timeout_s
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="edged-ota")
        self._downloads = ThreadPoolExecutor(max_downloads, thread_name_prefix="edged-ota-fetch")
        self._lock = threading.Lock()
        self._chunks: dict[tuple[str, str], ChunkAssembler] = {}
        self.pending: list[Future[None]] = []

    def start(self) -> None:
        """Subscribe the OTA topics: the link subscribes them again at every connect; the
        device takes updates once the broker has confirmed them (`listening`)."""
        for root in self.roots:  # the device's, the fleet's and its groups'
            manifests, chunks, commands = topics.OTA_FILTERS
            self.link.subscribe(topics.under(root, manifests), self._on_manifest)
            self.link.subscribe(topics.under(root, chunks), self._on_chunk)
            self.link.subscribe(topics.under(root, commands), self._on_command)

    @property
    def filters(self) -> list[str]:
        return [topics.under(root, suffix) for root in self.roots
                for suffix in topics.OTA_FILTERS]

    @property
    def listening(self) -> bool:
        """Whether the broker has confirmed every OTA subscription on this connection."""
        return self.link.subscribed(self.filters)

    def wait_listening(self, timeout_s: float) -> bool:
        return self.link.wait_subscribed(self.filters, timeout_s)

    def stop(self, timeout_s: float) -> None:
        self.updater.stop.set()
        self._downloads.shutdown(wait=False, cancel_futures=True)
        self._executor.shutdown(wait=False, cancel_futures=True)
        for future in list(self.pending):
            try:
                future.result(timeout=timeout_s)
            except (CancelledError, FutureTimeout):  # run() reports its own failures
                pass

    def report_shadow(self, model: str, progress: Mapping[str, Any]) -> None:
        """A shadow rollout's progress, retained on `<prefix>/ota/<model>/shadow`."""
        told = dict(progress)
        if isinstance(told.get("detail"), str):
            told["detail"] = self._remote(told["detail"])
        payload = json.dumps(told, separators=(",", ":")).encode()
        self.link.publish("ota", topics.ota_shadow(model), payload, retain=True)

    def _remote(self, text: str) -> str:
        """`text` as the fleet may read it: nothing of the device's filesystem (its staging
        folders name files the fleet has no business knowing)."""
        return remote_text(text, self.updater.repository.root, self.local_dirs)

    def defer(self, job: Callable[[], None]) -> None:
        """Run `job` on the OTA worker, after the updates and commands queued before it."""
        def run() -> None:
            try:
                job()
            except Exception:  # a bug must not kill the worker
                logger.exception("OTA: a deferred job failed")

        self._submit(run)

    def report(self, event: Event) -> None:
        """Updater events to `<prefix>/ota/<model>/status`; final states retained."""
        body = event.to_dict()
        body["detail"] = self._remote(event.detail)
        payload = json.dumps(body, separators=(",", ":")).encode()
        retain = event.state in FINAL and not event.transient
        self.link.publish("ota", topics.ota_status(event.model), payload, retain=retain)
        log = logger.warning if event.state in (OtaState.FAILED, OtaState.ROLLED_BACK) \
            else logger.info
        log("OTA %s:%d %s %s", event.model, event.version, event.state, event.detail,
            extra={"model": event.model, "version": event.version, "code": f"ota_{event.state}"})

    # -- inbound (paho's thread: quick, never raises) ------------------------------------------
    def _on_manifest(self, topic: str, payload: bytes) -> None:
        root, model = topic.rsplit(topics.OTA, 1)
        if not payload:  # a retained manifest being cleared
            return
        if len(payload) > MAX_MANIFEST_BYTES:  # refused unread: no parse of a 40 MB "manifest"
            self.report(Event(model if _is_name(model) else "?", 0, OtaState.FAILED,
                              f"the manifest is {len(payload)} bytes; the limit is "
                              f"{MAX_MANIFEST_BYTES}", reason="bad_manifest"))
            return
        try:
            check_model_name(model)
        except ModelNotFound:
            logger.warning("OTA: ignoring a manifest on %s: not a model name", topic)
            return
        try:
            manifest = parse_manifest(payload)
            if manifest.model != model:
                raise Rejected("bad_manifest", f"the manifest is for {manifest.model!r} but came "
                                               f"on the topic of {model!r}")
            if manifest.artifact.attached:
                raise Rejected("bad_manifest", "the artifact has neither url nor chunks: over "
                                               "MQTT it needs one (an attached artifact comes "
                                               "with its manifest through the socket API)")
            fresh = self._fresh(manifest.raw, root, model, "bad_manifest", idempotent=True)
            claimed = self.updater.claim(manifest)
            try:
                self._accept(model, fresh)
            except Rejected:
                if claimed:
                    self.updater.release(manifest)
                raise
            if not claimed:
                if self.updater.serving(model) == manifest.version:  # say so: a pusher waits
                    self.report(Event(model, manifest.version, OtaState.ACTIVE,
                                      f"already serving version {manifest.version}"))
                return
        except Rejected as exc:
            self.report(Event(model, _version_in(payload), OtaState.FAILED, str(exc),
                              reason=exc.reason, transient=exc.reason in NOT_A_MODEL_STATE))
            return
        assembler = None
        if manifest.artifact.chunks is not None:
            assembler = ChunkAssembler(manifest.artifact, self.chunk_timeout_s)
            with self._lock:
                self._chunks[(root, model)] = assembler

        def failed(exc: Exception) -> None:  # a bug must not kill a worker; say what happened
            logger.error("OTA: update of %s:%d failed", model, manifest.version, exc_info=exc)
            self.report(Event(model, manifest.version, OtaState.FAILED, repr(exc),
                              reason="internal"))

        def download() -> None:
            try:
                staged = self.updater.download(manifest, assembler)
            except Exception as exc:
                if not isinstance(exc, Rejected):  # a Rejected is reported by the updater
                    failed(exc)
                self.updater.release(manifest)
                return
            finally:
                with self._lock:
                    self._chunks.pop((root, model), None)

            def install() -> None:
                try:
                    self.updater.install(manifest, staged)
                except Rejected:
                    pass  # reported by the updater
                except Exception as exc:
                    failed(exc)
                finally:
                    self.updater.release(manifest)

            if not self._submit(install):  # stopping: it will not be installed
                self.updater.discard(staged)
                self.updater.release(manifest)

        if not self._submit(download, self._downloads):
            self.updater.release(manifest)

    def _on_chunk(self, topic: str, payload: bytes) -> None:
        head, index = topic.rsplit(topics.CHUNK, 1)
        root, model = head.rsplit(topics.OTA, 1)
        with self._lock:
            assembler = self._chunks.get((root, model))
        number = ascii_int(index)
        if assembler is None or number is None:
            return  # no chunked update of that model in progress, or no chunk's number
        assembler.add(number, payload)

    def _on_command(self, topic: str, payload: bytes) -> None:
        root, rest = topic.rsplit(topics.OTA, 1)
        model = rest.rsplit("/command", 1)[0]
        try:
            check_model_name(model)
            command = parse_command(payload)  # refused unread when oversized
            if command.model != model:
                raise Rejected("bad_command", f"the command is for {command.model!r} but came "
                                              f"on the topic of {model!r}")
            self._accept(model, self._fresh(command.raw, root, model, "bad_command",
                                            idempotent=False))
        except (ModelNotFound, Rejected) as exc:  # bad JSON, name, signature or freshness:
            # reported, never raised into paho's thread
            reason = exc.reason if isinstance(exc, Rejected) else "bad_command"
            logger.warning("OTA: ignoring command on %s: %s", topic, exc)
            self.report(Event(model if _is_name(model) else "?", 0, OtaState.FAILED, str(exc),
                              reason=reason, transient=True))
            return

        def run() -> None:
            try:
                if command.action == "rollback":
                    self.updater.rollback(model, command.from_version)
                else:
                    self.updater.shadows.decide(model, command.action == "promote",
                                                command.version, "the operator")
            except Rejected as exc:
                if exc.reason == "not_active":  # not on that version: nothing to do is fine
                    self.report(Event(model, self.updater.serving(model) or 0, OtaState.ACTIVE,
                                      str(exc), transient=True))
                    return
                self.report(Event(model, 0, OtaState.FAILED, str(exc), reason=exc.reason,
                                  transient=True))

        self._submit(run)

    def _fresh(self, document: Mapping[str, Any], root: str, model: str, bad: str, *,
               idempotent: bool) -> Freshness | None:
        """Authentic (signed by a trusted key), then fresh (edged/ota/freshness.py): for this
        root, not expired, and a seq above the last one accepted for `model`."""
        allow_unsigned = self.updater.cfg.allow_unsigned
        self.updater.trust.verify_document(document, allow_unsigned=allow_unsigned)
        return check_fresh(document, root=root, accepted=self.updater.journal.accepted_seq(model),
                           allow_unsigned=allow_unsigned, bad=bad, idempotent=idempotent)

    def _accept(self, model: str, fresh: Freshness | None) -> None:
        """Acted on: a message with this seq or a lower one is refused from now on."""
        if fresh is None:
            return
        try:
            self.updater.journal.accept_seq(model, fresh.seq, fresh.digest)
        except OSError as exc:  # not recorded: not acted on (it could be replayed)
            raise Rejected("internal", f"cannot record the message's seq: {exc}") from None

    def _submit(self, job: Callable[[], None],
                executor: ThreadPoolExecutor | None = None) -> bool:
        """Run `job` on `executor` (default: the one worker); False when stopping."""
        try:
            future: Future[None] = (executor or self._executor).submit(job)
        except RuntimeError:  # shutting down
            return False
        with self._lock:
            self.pending = [f for f in self.pending if not f.done()] + [future]
        return True


def _version_in(payload: bytes) -> int:
    """The version a rejected manifest asked for, when it says (for the status event)."""
    try:
        version = json.loads(payload).get("version")
        return version if isinstance(version, int) and not isinstance(version, bool) else 0
    except (ValueError, AttributeError, RecursionError):
        return 0


def _is_name(name: str) -> bool:
    try:
        check_model_name(name)
        return True
    except ModelNotFound:
        return False
