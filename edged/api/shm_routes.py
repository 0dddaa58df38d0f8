"""The system shared-memory extension's routes (Triton's `/v2/systemsharedmemory`), and
who is asking: regions belong to the user who registered them (`edged/api/shm.py`), so every
use names the asking peer, looked up only when a request names shared memory."""

from __future__ import annotations

import asyncio
import socket

from edged.api.http.bodies import integer, json_body
from edged.api.http.listeners import peer_identity
from edged.api.http.messages import Handler, Request, Response, json_response
from edged.api.shm import Peer, ShmRegistry
from edged.core.errors import Forbidden, InvalidInput


class ShmRoutes:
    def __init__(self, shm: ShmRegistry) -> None:
        self.shm = shm

    def routes(self) -> list[tuple[str, str, Handler]]:
        base = "/v2/systemsharedmemory"
        return [("GET", base + "/status", self.shm_status),
                ("GET", base + "/region/{region}/status", self.shm_status),
                ("POST", base + "/region/{region}/register", self.shm_register),
                ("POST", base + "/region/{region}/unregister", self.shm_unregister),
                ("POST", base + "/unregister", self.shm_unregister),
                ("*", "/v2/cudasharedmemory{tail:.*}", self.cuda_shm)]

    async def shm_status(self, request: Request) -> Response:
        return json_response(self.shm.status(request.match_info.get("region"),
                                                 await asking(request)))

    async def shm_register(self, request: Request) -> Response:
        body = await json_body(request)
        key = body.get("key")
        if not isinstance(key, str):
            raise InvalidInput("key must be a string")
        offset, size = integer(body, "offset", 0), integer(body, "byte_size")
        await asyncio.to_thread(self.shm.register, request.match_info["region"], key,
                                offset, size, await asking(request))
        return json_response({})

    async def shm_unregister(self, request: Request) -> Response:
        self.shm.unregister(request.match_info.get("region"), await asking(request))
        return json_response({})

    async def cuda_shm(self, request: Request) -> Response:
        """No CUDA regions here: status is empty and unregister has nothing to do (Triton's own
        shm examples unregister CUDA regions first); registering one is refused."""
        if request.path.endswith("/status"):
            return json_response([])
        if request.path.endswith("/unregister"):
            return json_response({})
        raise InvalidInput("CUDA shared memory is not supported; use system shared memory")


async def asking(request: Request) -> Peer:
    """The user at the other end; shared memory is theirs alone (Forbidden when it cannot be
    told). Over TCP that reads the kernel's socket table (`/proc/net/tcp`, a row per socket
    on the box): on a thread, not the event loop."""
    sock = request.sock
    if sock is not None and sock.family != socket.AF_UNIX:
        return _known(await asyncio.to_thread(peer_identity, sock))
    return _known(peer_identity(sock) if sock is not None else None)  # one getsockopt


def _known(peer: Peer | None) -> Peer:
    if peer is None:
        raise Forbidden("cannot tell which user is asking, so no shared memory for it")
    return peer


class Asker:
    """The asking peer, looked up once and only when a request names shared memory (over TCP
    that reads the kernel's socket table: not for every request)."""

    def __init__(self, request: Request) -> None:
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
            sock = self._request.sock
            self._peer = _known(peer_identity(sock) if sock is not None else None)
        return self._peer

