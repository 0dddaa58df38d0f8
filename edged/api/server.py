"""The socket API: the KServe v2 HTTP/REST protocol with Triton's extensions (binary tensors,
system shared memory, model repository), served by edged's own HTTP layer
(`edged.api.http.connection`) on the daemon's asyncio loop over a Unix socket and, when
configured, a loopback TCP port.

The model routes are `edged.api.kserve`'s; this module owns the listeners, routing, the peer
and browser checks, and the server-wide routes (health, metadata, metrics, logging, status).
Every failure becomes a KServe-style `{"error": ...}` body with the error's HTTP status."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

from edged import __version__
from edged.api import logsettings
from edged.api.clips import ClipRoutes
from edged.api.config import ApiConfig, split_host_port
from edged.api.events import EventRoutes
from edged.api.galleries import Faces, GalleryRoutes
from edged.api.generate import GenerateRoutes
from edged.api.http import browsers
from edged.api.http.bodies import json_body
from edged.api.http.budget import BodyBudget
from edged.api.http.connection import HttpServer
from edged.api.http.listeners import UnixListener, bind_unix, peer_identity
from edged.api.http.messages import (
    Handler,
    HttpError,
    Request,
    Response,
    error_response,
    json_response,
)
from edged.api.http.routing import Router
from edged.api.kserve import KServeRoutes
from edged.api.live import LiveRoutes, Viewable
from edged.api.openai import OpenAiRoutes
from edged.api.ota_routes import Installs, OtaRoutes
from edged.api.page import PageRoutes
from edged.api.shm import ShmRegistry
from edged.api.shm_routes import ShmRoutes
from edged.api.snapshots import SnapshotRoutes
from edged.core.errors import BodyTimeout, EdgedError, Forbidden, ModelNotFound
from edged.events.store import SnapshotStore
from edged.events.tally import RecentEvents
from edged.inference.cache import ModelCache
from edged.inference.generation import Generations
from edged.inference.scheduler import Scheduler
from edged.recording.store import ClipStore
from edged.service.metrics import CONTENT_TYPE, Metrics

logger = logging.getLogger(__name__)

EXTENSIONS = ["binary_tensor_data", "system_shared_memory", "model_repository",
              "model_configuration", "schedule_policy", "statistics", "logging", "generate"]
SHUTDOWN_S = 5.0  # in-flight requests get this long to be answered at stop
Liveness = Callable[[], tuple[bool, list[str]]]


class ApiServer:
    def __init__(self, config: ApiConfig, *, scheduler: Scheduler, cache: ModelCache,
                 shm: ShmRegistry, metrics: Metrics, is_ready: Callable[[], bool],
                 is_live: Liveness | None = None,
                 status: Callable[[], dict[str, Any]] | None = None,
                 snapshots: Callable[[], SnapshotStore | None] = lambda: None,
                 live: Callable[[str], Viewable | None] = lambda name: None,
                 recent: Callable[[], RecentEvents | None] = lambda: None,
                 installs: Callable[[], Installs | None] = lambda: None,
                 generations: Callable[[], Generations | None] = lambda: None,
                 clips: Callable[[], ClipStore | None] = lambda: None,
                 faces: Callable[[], Faces | None] = lambda: None) -> None:
        """`live` gives a running stream's live view by name, `recent` the recent objects of
        the detect streams (the status page and its pictures), `installs` the OTA installer
        that takes models on the socket (the Mender module's path), `generations` the
        language models' queues (Triton's generate and the OpenAI-compatible routes)."""
        self.config = config
        self.shm = shm
        self.metrics = metrics
        self.is_ready = is_ready
        self.is_live: Liveness = is_live or (lambda: (True, []))
        self.status = status
        self.snapshots = SnapshotRoutes(snapshots)
        self.clips = ClipRoutes(clips)
        self.live_views = LiveRoutes(live, max_fps=config.live_fps,
                                     stopping=lambda: self.connections.closing)
        self.events = EventRoutes(recent)
        self.installs = OtaRoutes(installs)
        self.activated = False  # the Unix socket came from systemd (edged.socket)
        self._allowed_uids = frozenset(config.allowed_uids)
        self._allowed_gids = frozenset(config.allowed_gids)
        # Shared by both listeners: the connection cap is on what the process holds open.
        self.connections = HttpServer(self._dispatch, max_connections=config.max_connections,
                                      header_timeout_s=config.header_timeout_s,
                                      keepalive_s=config.keepalive_s,
                                      body_timeout_s=config.body_timeout_s,
                                      max_header_fields=config.max_header_fields,
                                      max_header_line_bytes=config.max_header_line_bytes)
        self.bodies = BodyBudget(config.max_bodies_mb * 1024 * 1024)
        self.galleries = GalleryRoutes(faces, snapshots, self.bodies)
        self._unix: UnixListener | None = None
        self.kserve = KServeRoutes(config, scheduler=scheduler, cache=cache, shm=shm,
                                   bodies=self.bodies,
                                   handling=lambda: self.connections.handling,
                                   failed=self.failed)
        self.generate = GenerateRoutes(generations, self.bodies)
        self.openai = OpenAiRoutes(generations, cache, self.bodies)
        self.router = self._make_router()

    # -- lifecycle ---------------------------------------------------------------------------
    def _make_router(self) -> Router:
        routes: list[tuple[str, str, Handler]] = [
            *self.kserve.routes()[:2],  # inference first: dynamic routes are tried in order
            *self.generate.routes(),
            *self.openai.routes(),
            ("GET", "/v2", self.server_metadata),
            ("GET", "/v2/health/live", self.live),
            ("GET", "/v2/health/ready", self.ready),
            *self.kserve.routes()[2:],
            *ShmRoutes(self.shm).routes(),
            ("GET", "/metrics", self.prometheus),
            ("GET", "/v2/logging", self.logging),
            ("POST", "/v2/logging", self.logging),
            ("GET", "/v2/edged/status", self.daemon_status),
            *self.snapshots.routes(),
            *self.clips.routes(),
            *self.installs.routes(),
            *self.live_views.routes(),
            *self.events.routes(),
            *self.galleries.routes(),
            *PageRoutes().routes(),  # the status page (GET only)
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
        except Exception as exc:
            return self.failed(request, exc)

    def failed(self, request: Request, exc: Exception) -> Response:
        """The JSON error answer to a request that failed with `exc` (a replayed one's too)."""
        if isinstance(exc, BodyTimeout):  # the rest of the body may still come: not on this one
            response = self._error(exc.http_status, exc.code, str(exc))
            response.close = True
            return response
        if isinstance(exc, EdgedError):
            return self._error(exc.http_status, exc.code, str(exc))
        if isinstance(exc, HttpError):
            response = self._error(exc.status, "http", str(exc))
            if exc.allow is not None:
                response.headers = {"Allow": exc.allow}
            return response
        # last resort: one request fails, the server keeps serving
        logger.error("%s %s failed", request.method, request.path, exc_info=exc)
        return self._error(500, "internal", f"internal error: {exc}")

    def _error(self, status: int, code: str, message: str) -> Response:
        self.metrics.api_errors.labels(code).inc()
        return error_response(status, message, code)

    def _check_not_a_browser(self, request: Request) -> None:
        """Refuse what a web page can make a browser send (`edged.api.http.browsers`): on
        the loopback TCP listener, and on the Unix socket for what a proxy may pass on."""
        headers = request.headers
        origin, site = headers.get("origin"), headers.get("sec-fetch-site")
        if request.is_unix:
            if origin is None and site is None:
                return  # an API client's (the hot path: two lookups)
            why = browsers.unix_refusal(request.method, origin, site,
                                        headers.get("sec-fetch-mode"),
                                        headers.get("sec-fetch-dest"))
        else:
            why = browsers.refusal(request.method, headers.get("host"), request.content_type,
                                   origin, site, headers.get("sec-fetch-mode"),
                                   headers.get("sec-fetch-dest"),
                                   None if origin is None else _local_port(request))
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

    async def logging(self, request: Request) -> Response:
        """Triton's logging extension: read, or set, the daemon's log level."""
        if request.method == "GET":
            return json_response(logsettings.current())
        body = await json_body(request)
        return json_response(logsettings.apply(body))


def _local_port(request: Request) -> int | None:
    """The port a TCP request came in on: its listener's (None where it has no socket)."""
    sock = request.sock
    try:
        return int(sock.getsockname()[1]) if sock is not None else None
    except OSError:  # the connection is gone already
        return None
