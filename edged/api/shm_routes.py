"""The system shared-memory extension's routes (Triton's `/v2/systemsharedmemory`), and
who is asking: regions belong to the user who registered them (`edged/api/shm.py`), so every
use names the asking peer, looked up only when a request names shared memory."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from edged.api.bodies import integer, json_body
from edged.api.listeners import peer_identity
from edged.api.shm import Peer, ShmRegistry
from edged.errors import Forbidden, InvalidInput


class ShmRoutes:
    def __init__(self, shm: ShmRegistry) -> None:
        self.shm = shm

    def routes(self) -> list[web.RouteDef]:
        get, post, base = web.get, web.post, "/v2/systemsharedmemory"
        return [get(base + "/status", self.shm_status),
                get(base + "/region/{region}/status", self.shm_status),
                post(base + "/region/{region}/register", self.shm_register),
                post(base + "/region/{region}/unregister", self.shm_unregister),
                post(base + "/unregister", self.shm_unregister),
                web.route("*", "/v2/cudasharedmemory{tail:.*}", self.cuda_shm)]

    async def shm_status(self, request: web.Request) -> web.Response:
        return web.json_response(self.shm.status(request.match_info.get("region"),
                                                 await asking(request)))

    async def shm_register(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        key = body.get("key")
        if not isinstance(key, str):
            raise InvalidInput("key must be a string")
        offset, size = integer(body, "offset", 0), integer(body, "byte_size")
        await asyncio.to_thread(self.shm.register, request.match_info["region"], key,
                                offset, size, await asking(request))
        return web.json_response({})

    async def shm_unregister(self, request: web.Request) -> web.Response:
        self.shm.unregister(request.match_info.get("region"), await asking(request))
        return web.json_response({})

    async def cuda_shm(self, request: web.Request) -> web.Response:
        """No CUDA regions here: status is empty and unregister has nothing to do (Triton's own
        shm examples unregister CUDA regions first); registering one is refused."""
        if request.path.endswith("/status"):
            return web.json_response([])
        if request.path.endswith("/unregister"):
            return web.json_response({})
        raise InvalidInput("CUDA shared memory is not supported; use system shared memory")


async def asking(request: web.Request) -> Peer:
    """The user at the other end; shared memory is theirs alone (Forbidden when it cannot be
    told). Over TCP that reads the kernel's socket table (`/proc/net/tcp`, a row per socket
    on the box): on a thread, not the event loop."""
    sock = _socket_of(request)
    if sock is not None and sock.family != socket.AF_UNIX:
        return _known(await asyncio.to_thread(peer_identity, sock))
    return _known(peer_identity(sock) if sock is not None else None)  # one getsockopt


def _socket_of(request: web.Request) -> socket.socket | None:
    transport = request.transport
    return transport.get_extra_info("socket") if transport is not None else None


def _known(peer: Peer | None) -> Peer:
    if peer is None:
        raise Forbidden("cannot tell which user is asking, so no shared memory for it")
    return peer


class Asker:
    """The asking peer, looked up once and only when a request names shared memory (over TCP
    that reads the kernel's socket table: not for every request)."""

    def __init__(self, request: web.Request) -> None:
        self._request = request
        self._peer: Peer | None = None

    async def resolve(self) -> None:
        """Look the peer up now, before a decode that may run on the loop needs it."""
        if self._peer is None:
            try:
                self._peer = await asking(self._request)
            except Forbidden:  # told only if a region is used (the text test is a hint)
                pass

    def __call__(self) -> Peer:
        if self._peer is None:  # not resolved first: a Unix socket's getsockopt, or a thread
            sock = _socket_of(self._request)
            self._peer = _known(peer_identity(sock) if sock is not None else None)
        return self._peer

