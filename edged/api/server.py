"""The socket API: the KServe v2 HTTP/REST protocol with Triton's extensions (binary tensors,
system shared memory, model repository), served by edged's own HTTP layer (`edged.api.http`)
on the daemon's asyncio loop over a Unix socket and, when configured, a loopback TCP port.

Handlers do not block the loop: inference goes through `Scheduler.submit` (its future wrapped
with `asyncio.wrap_future`); anything that reads model files or loads a model runs on a thread.
The one exception is a request that is alone (the only one being handled, none other parsed in
the same turn of the loop: `HttpServer.handling`) for a loaded, idle model whose
batches take under `batcher.INLINE_MAX_NS`: it runs on the loop, skipping two thread hops.
Every failure becomes a KServe-style `{"error": ...}` body with the error's HTTP status."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import Callable
from typing import Any

from edged import __version__
from edged.api import browsers, describe, logsettings
from edged.api.bodies import json_body
from edged.api.budget import JSON_WEIGHT, BodyBudget, Charge, read_body
from edged.api.http import HttpServer
from edged.api.listeners import UnixListener, bind_unix, peer_identity
from edged.api.messages import (
    Handler,
    HttpError,
    Request,
    Response,
    error_response,
    json_response,
)
from edged.api.ota_routes import Installs, OtaRoutes
from edged.api.protocol import (
    HEADER_LENGTH,
    InferRequest,
    decode_request,
    encode_response,
)
from edged.api.rawbinary import copies_body, decode_raw
from edged.api.routing import Router
from edged.api.shm import Lease, ShmRegistry
from edged.api.shm_routes import Asker, ShmRoutes
from edged.api.snapshots import SnapshotRoutes
from edged.api.turns import Turns
from edged.cache import ModelCache
from edged.config import ApiConfig, split_host_port
from edged.errors import BodyTimeout, EdgedError, Forbidden, InvalidInput, ModelNotFound
from edged.events.store import SnapshotStore
from edged.instances import instance_count
from edged.metrics import CONTENT_TYPE, Metrics
from edged.model.loadspec import options_for
from edged.model.repository import ModelVersion
from edged.scheduler import Scheduler
from edged.states import ModelState

logger = logging.getLogger(__name__)

EXTENSIONS = ["binary_tensor_data", "system_shared_memory", "model_repository",
              "model_configuration", "schedule_policy", "statistics", "logging"]
DECODE_ON_THREAD_BYTES = 256 * 1024
# A binary answer up to this size is joined into one buffer and sent with its headers in one
# write: written part by part it took three sends, ~19% of the daemon's samples (py-spy,
# tiny_cls under perf_analyzer, c=8), where copying 64 KiB costs a few microseconds.
JOIN_BYTES = 64 * 1024
SHUTDOWN_S = 5.0  # in-flight requests get this long to be answered at stop
_VERSION = re.compile(r"^[0-9]{1,9}$")
Liveness = Callable[[], tuple[bool, list[str]]]


class ApiServer:
    def __init__(self, config: ApiConfig, *, scheduler: Scheduler, cache: ModelCache,
                 shm: ShmRegistry, metrics: Metrics, is_ready: Callable[[], bool],
                 is_live: Liveness | None = None,
                 status: Callable[[], dict[str, Any]] | None = None,
                 snapshots: Callable[[], SnapshotStore | None] = lambda: None,
                 installs: Callable[[], Installs | None] = lambda: None) -> None:
        self.config = config
        self.scheduler = scheduler
        self.cache = cache
        self.shm = shm
        self.metrics = metrics
        self.is_ready = is_ready
        self.is_live: Liveness = is_live or (lambda: (True, []))
        self.status = status
        self.snapshots = SnapshotRoutes(snapshots)
        self.installs = OtaRoutes(installs)
        self.activated = False  # the Unix socket came from systemd (edged.socket)
        self._allowed_uids = frozenset(config.allowed_uids)
        self._allowed_gids = frozenset(config.allowed_gids)
        # Shared by both listeners: the connection cap is on what the process holds open.
        self.connections = HttpServer(self._dispatch, max_connections=config.max_connections,
                                      header_timeout_s=config.header_timeout_s,
                                      keepalive_s=config.keepalive_s,
                                      body_timeout_s=config.body_timeout_s)
        self.bodies = BodyBudget(config.max_bodies_mb * 1024 * 1024)
        self._unix: UnixListener | None = None
        self.router = self._make_router()
        self.turns = Turns(scheduler)

    # -- lifecycle ---------------------------------------------------------------------------
    def _make_router(self) -> Router:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        routes: list[tuple[str, str, Handler]] = [
            # The hot path first: dynamic routes are tried in order.
            ("POST", model + "/infer", self.infer),
            ("POST", versioned + "/infer", self.infer),
            ("GET", "/v2", self.server_metadata),
            ("GET", "/v2/health/live", self.live),
            ("GET", "/v2/health/ready", self.ready),
            # Before /v2/models/{model}: "stats" is not a model name here.
            ("GET", "/v2/models/stats", self.statistics),
            ("GET", model + "/stats", self.statistics),
            ("GET", versioned + "/stats", self.statistics),
            *(route for base in (model, versioned) for route in (
                ("GET", base, self.model_metadata),
                ("GET", base + "/ready", self.model_ready),
                ("GET", base + "/config", self.model_config),
            )),
            ("POST", "/v2/repository/index", self.repository_index),
            ("POST", "/v2/repository/models/{model}/load", self.load),
            ("POST", "/v2/repository/models/{model}/unload", self.unload),
            *ShmRoutes(self.shm).routes(),
            ("GET", "/metrics", self.prometheus),
            ("GET", "/v2/logging", self.logging),
            ("POST", "/v2/logging", self.logging),
            ("GET", "/v2/edged/status", self.daemon_status),
            *self.snapshots.routes(),
            *self.installs.routes(),
        ]
        router = Router()
        for method, path, handler in routes:
            router.add(method, path, handler)
        return router

    async def start(self, activated: socket.socket | None = None) -> None:
        """Listen on the Unix socket (and the loopback port, if configured). `activated` is a
        listening socket systemd passed (edged.socket): served as it is, its file left to
        systemd, which owns its path, mode and group."""
        cfg = self.config
        if activated is not None:
            activated.setblocking(False)
            self.activated = True
            sock = activated
        else:
            self._unix = bind_unix(cfg.socket, int(cfg.socket_mode, 8), cfg.socket_group)
            sock = self._unix.sock
        try:
            await self.connections.listen(sock)
            if activated is not None:
                logger.info("API on unix:%s (socket activation: passed by systemd)",
                            sock.getsockname() or "(unnamed)")
            else:
                logger.info("API on unix:%s (mode %s%s)", cfg.socket, cfg.socket_mode,
                            f", group {cfg.socket_group}" if cfg.socket_group else "")
            if cfg.http:
                host, port = split_host_port(cfg.http)
                tcp = socket.create_server((host, port), family=socket.AF_INET6
                                           if ":" in host else socket.AF_INET)
                tcp.setblocking(False)
                await self.connections.listen(tcp)
                logger.info("API on http://%s", cfg.http)
                if self._allowed_uids or self._allowed_gids:
                    logger.warning("the TCP listener %s cannot check peer uids/gids: the "
                                   "allowlist applies to the Unix socket only", cfg.http)
        except BaseException:  # close what did start, then re-raise: no half-open socket
            await self.stop()
            raise

    async def stop_accepting(self) -> None:
        """Close the listeners; connections already open are still served."""
        await self.connections.stop_accepting()
        if self._unix is not None:
            self._unix.remove()

    async def stop(self) -> None:
        """Stop accepting, let in-flight requests finish (bounded), remove the socket file."""
        try:
            await self.connections.stop(SHUTDOWN_S)
        finally:
            if self._unix is not None:
                self._unix.remove()
                self._unix.sock.close()
                self._unix = None

    # -- dispatch ----------------------------------------------------------------------------
    async def _dispatch(self, request: Request) -> Response:
        """Route, check and run one request; every failure becomes its JSON error answer."""
        try:
            handler = self.router.resolve(request)
            self._check_peer(request)
            self._check_not_a_browser(request)
            return await handler(request)
        except BodyTimeout as exc:  # the rest of the body may still come: not on this one
            response = self._error(exc.http_status, exc.code, str(exc))
            response.close = True
            return response
        except EdgedError as exc:
            return self._error(exc.http_status, exc.code, str(exc))
        except HttpError as exc:
            response = self._error(exc.status, "http", str(exc))
            if exc.allow is not None:
                response.headers = {"Allow": exc.allow}
            return response
        except Exception as exc:  # last resort: one request fails, the server keeps serving
            logger.exception("%s %s failed", request.method, request.path)
            return self._error(500, "internal", f"internal error: {exc}")

    def _error(self, status: int, code: str, message: str) -> Response:
        self.metrics.api_errors.labels(code).inc()
        return error_response(status, message, code)

    def _check_not_a_browser(self, request: Request) -> None:
        """The loopback TCP listener refuses what a web page can make a browser send."""
        if request.is_unix:
            return  # no browser reaches a Unix socket
        why = browsers.refusal(request.method, request.headers.get("host"),
                               request.content_type)
        if why is not None:
            raise Forbidden(why)

    def _check_peer(self, request: Request) -> None:
        """With an allowlist, a Unix-socket peer must be on it; a peer that cannot be told
        (no socket, no credentials) is refused, never waved through."""
        if not (self._allowed_uids or self._allowed_gids):
            return
        sock = request.sock
        if sock is not None and sock.family != socket.AF_UNIX:
            return  # the loopback TCP listener: documented as outside the allowlist
        peer = peer_identity(sock) if sock is not None else None
        if peer is not None and (peer.uid in self._allowed_uids
                                 or not peer.gids.isdisjoint(self._allowed_gids)):
            return
        who = f"uid {peer.uid} groups {sorted(peer.gids)}" if peer else "an unknown peer"
        raise Forbidden(f"{who} is not allowed on this socket")

    # -- server ------------------------------------------------------------------------------
    async def server_metadata(self, _request: Request) -> Response:
        return json_response({"name": "edged", "version": __version__,
                                  "extensions": EXTENSIONS})

    async def live(self, _request: Request) -> Response:
        """200 while the daemon makes progress; 503 with what is stuck (restart me)."""
        live, problems = self.is_live()
        body: dict[str, Any] = {"live": live}
        if problems:
            body["problems"] = problems
        return json_response(body, status=200 if live else 503)

    async def daemon_status(self, _request: Request) -> Response:
        """edged's own extension: the summary `edged status` prints."""
        if self.status is None:
            raise ModelNotFound("this server has no status report")
        return json_response(await asyncio.to_thread(self.status))

    async def ready(self, _request: Request) -> Response:
        ready = self.is_ready()
        return json_response({"ready": ready}, status=200 if ready else 503)

    async def prometheus(self, _request: Request) -> Response:
        body = await asyncio.to_thread(self.metrics.render)
        return Response(body, content_type=CONTENT_TYPE)

    # -- models ------------------------------------------------------------------------------
    async def model_metadata(self, request: Request) -> Response:
        name, version = _model_ref(request)

        def read() -> dict[str, Any]:
            model = self.cache.describe(name, version)
            versions = self.cache.repository.served_versions(name)
            return describe.model_metadata(model, versions)

        return json_response(await asyncio.to_thread(read))

    async def logging(self, request: Request) -> Response:
        """Triton's logging extension: read, or set, the daemon's log level."""
        if request.method == "GET":
            return json_response(logsettings.current())
        body = await json_body(request)
        return json_response(logsettings.apply(body))

    async def statistics(self, request: Request) -> Response:
        """Triton's statistics extension: every served version of every model, of one model,
        or one version (404 for a model or version that is not served)."""
        name = request.match_info.get("model")
        _, version = _model_ref(request) if name is not None else (None, None)
        keys = await asyncio.to_thread(self._served, name, version)
        return json_response(describe.statistics(keys, self.scheduler.statistics()))

    def _served(self, name: str | None, version: int | None) -> list[tuple[str, int]]:
        """(model, version) served now: of `name` (ModelNotFound when it is not), or of every
        model in the repository whose versions can be read."""
        if name is not None:
            self.cache.describe(name, version)
            versions = [version] if version is not None else \
                self.cache.repository.served_versions(name)
            return [(name, v) for v in versions]
        keys = []
        for model in self.cache.repository.names():
            try:
                keys += [(model, v) for v in self.cache.repository.served_versions(model)]
            except EdgedError:  # a broken model in the listing has no statistics
                continue
        return keys

    async def model_ready(self, request: Request) -> Response:
        name, version = _model_ref(request)
        await asyncio.to_thread(self.cache.describe, name, version)  # 404 for unknown models
        ready = self.cache.ready(name, version)
        return json_response({"name": name, "ready": ready}, status=200 if ready else 503)

    async def model_config(self, request: Request) -> Response:
        name, version = _model_ref(request)
        model = await asyncio.to_thread(self.cache.describe, name, version)
        instances = instance_count(model.config.instances, options_for(model, self.cache.options))
        return json_response(describe.model_config(model, instances))

    async def infer(self, request: Request) -> Response:
        """The request's body is charged to the body budget, and the shared memory regions it
        names are its own, until it has answered: an unregister meanwhile takes effect after
        it (as in Triton)."""
        name, version = _model_ref(request)
        if not self.scheduler.has_batcher(name, version):  # an unknown model: 404, body unread
            await asyncio.to_thread(self.scheduler.prepare, name, version)
        charge = self.bodies.charge()
        # The asking peer is looked up at a first region; inputs copied in are charged.
        asker = Asker(request)
        lease = self.shm.lease(asker, charge.add)
        try:
            return await self._infer(request, name, version, charge, lease, asker)
        finally:
            lease.release()
            charge.release()  # answered (or failed): its body is no longer held

    async def _infer(self, request: Request, name: str, version: int | None,
                     charge: Charge, lease: Lease, asker: Asker) -> Response:
        json_length = _json_length(request)
        body = await read_body(request, self.config.max_request_mb * 1024 * 1024, charge,
                               json_length)
        head = len(body) if json_length is None else min(max(json_length, 0), len(body))
        charge.add(head * (JSON_WEIGHT - 1))  # what parsing it will make of it, before it does
        reader, charger = lease.read, charge.add
        # The text hint where the decode may run on the loop (a large body is decoded on a
        # thread, which may look the peer up itself): scanning it would copy it here.
        names_shm = len(body) <= DECODE_ON_THREAD_BYTES and _names_shared_memory(body, head)
        if names_shm:
            await asker.resolve()  # off the loop over TCP; the decode below may run on it
        if json_length == 0:  # a raw binary request: the body is the one input's bytes
            model = self.scheduler.model(name, version)
            if len(body) > DECODE_ON_THREAD_BYTES and copies_body(model):  # not on the loop
                parsed = await asyncio.to_thread(decode_raw, model, body, charger)
            else:
                parsed = decode_raw(model, body, charger)
        elif _slow_to_decode(body, names_shm, lease):  # not on the loop
            parsed = await asyncio.to_thread(decode_request, body, json_length, read_shm=reader,
                                             charge=charger)
        else:
            parsed = decode_request(body, json_length, read_shm=reader, charge=charger)
        if parsed.outputs:  # most requests name none: every output comes back
            _check_outputs(self.scheduler.model(name, version), parsed)
            if any(out.shm is not None for out in parsed.outputs):
                await asker.resolve()  # before holding them here, on the loop
            for out in parsed.outputs:  # held from now: an unregister cannot take them mid-run
                if out.shm is not None:
                    lease.hold(out.shm)
        # Alone: no other request is being handled or arrived in this turn of the loop. A quick
        # model then runs right here, with no hop to a worker thread and back (tiny_cls at c=1
        # cost ~20% less server CPU per request, and the answer comes sooner). Requests that
        # overlap for a model whose rows are cheap batch here at the end of the turn
        # (`Turns`); for any other they go to the workers, where they batch and run beside
        # each other while the loop keeps reading and answering.
        scheduler = self.scheduler
        if self.connections.handling == 1 and scheduler.quick(name, version):
            future = scheduler.submit_or_run(name, parsed.inputs, version=version,
                                             priority=parsed.priority,
                                             timeout_s=parsed.timeout_s)
        elif scheduler.cheap(name, version):
            admitted = scheduler.admit(name, parsed.inputs, version=version,
                                       priority=parsed.priority, timeout_s=parsed.timeout_s)
            await self.turns.join(admitted)
            future = admitted.future
        else:
            future = scheduler.submit(name, parsed.inputs, version=version,
                                      priority=parsed.priority, timeout_s=parsed.timeout_s)
        parsed.inputs = {}  # the batch owns them now; nothing here needs them
        outputs = future.result() if future.done() else await asyncio.wrap_future(future)
        served = future.version if future.version is not None else \
            self.cache.default_version(name)
        parts, json_length = encode_response(name, served, parsed.id, outputs, parsed.outputs,
                                             parsed.binary_default,
                                             write_shm=lease.write)
        if json_length is None:
            return Response(parts[0], content_type="application/json")
        headers = {HEADER_LENGTH: str(json_length)}
        if sum(map(len, parts)) <= JOIN_BYTES:  # one buffer: one send
            return Response(b"".join(parts), headers=headers)
        # Large tensor bytes go out as they are: joining them to the JSON would copy them again.
        return Response(parts=list(parts), headers=headers)

    # -- repository --------------------------------------------------------------------------
    async def repository_index(self, request: Request) -> Response:
        body = await json_body(request, default={})
        ready_only = body.get("ready", False)
        if not isinstance(ready_only, bool):
            raise InvalidInput("ready must be true or false")
        rows = await asyncio.to_thread(self.cache.status)
        return json_response([describe.index_entry(r) for r in rows
                                  if not ready_only or r.state is ModelState.READY])

    async def load(self, request: Request) -> Response:
        name = request.match_info["model"]
        body = await json_body(request, default={})
        if body.get("parameters"):
            raise InvalidInput("load with an overriding config or files is not supported: "
                               "install versions into the repository (or push them by OTA)")
        await asyncio.to_thread(self.cache.load, name)
        return json_response({})

    async def unload(self, request: Request) -> Response:
        name = request.match_info["model"]
        await json_body(request, default={})

        def unload_all() -> None:
            if name not in self.cache.repository.names():
                raise ModelNotFound(f"no model named {name!r}")
            for row in self.cache.status():
                if row.name == name and row.state is ModelState.READY:
                    self.cache.unload(name, row.version)

        await asyncio.to_thread(unload_all)
        return json_response({})


def _slow_to_decode(body: memoryview, names_shm: bool, lease: Lease) -> bool:
    """Whether decoding may take a while: a large body (a Python object per JSON number, or
    a Python loop per binary BYTES element), or inputs copied in from shared memory (a pread
    of up to the whole region). The text test is a hint only; a key spelled with escapes is
    taken to be that key."""
    if len(body) > DECODE_ON_THREAD_BYTES:
        return True
    return names_shm and lease.copies()


def _names_shared_memory(body: memoryview, head: int) -> bool:
    """Whether the JSON part may name a region (a key spelled with escapes is taken to)."""
    text = bytes(body[:head])
    return b"shared_memory_region" in text or b"\\u" in text


def _check_outputs(model: ModelVersion, parsed: InferRequest) -> None:
    """Unknown requested outputs fail before the model runs, not after."""
    known = {spec.name for spec in model.outputs}
    for out in parsed.outputs:
        if out.name not in known:
            raise InvalidInput(f"model {model.name} has no output {out.name!r} "
                               f"(outputs: {', '.join(sorted(known))})")


def _model_ref(request: Request) -> tuple[str, int | None]:
    name = request.match_info["model"]
    raw = request.match_info.get("version")
    if raw is None or raw == "":
        return name, None
    if not _VERSION.match(raw) or int(raw) < 1:
        raise InvalidInput(f"model version must be a positive integer, got {raw[:32]!r}")
    version = int(raw)
    return name, version


def _json_length(request: Request) -> int | None:
    raw = request.headers.get(HEADER_LENGTH)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{HEADER_LENGTH} must be an integer, got {raw!r}") from None
