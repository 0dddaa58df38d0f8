"""A handful of the API's routes served alone by edged's own HTTP layer on a real Unix socket
(a loop on a thread), with the daemon's mapping of typed errors to answers: for tests of one
room's routes without a daemon."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from edged.api.http import messages
from edged.api.http.connection import HttpServer
from edged.api.http.messages import Handler, HttpError, Request, Response
from edged.api.http.routing import Router
from edged.core.errors import EdgedError


@contextmanager
def served_routes(routes: Sequence[tuple[str, str, Handler]], path: Path) -> Iterator[str]:
    """Serve `routes` on a Unix socket at `path` until the block ends; yields the path."""
    router = Router()
    for method, pattern, handler in routes:
        router.add(method, pattern, handler)

    async def handle(request: Request) -> Response:
        try:
            return await router.resolve(request)(request)
        except HttpError as exc:
            return messages.error_response(exc.status, str(exc))
        except EdgedError as exc:
            return messages.error_response(exc.http_status, str(exc), exc.code)

    loop = asyncio.new_event_loop()
    server = HttpServer(handle, max_connections=8, header_timeout_s=5, keepalive_s=5,
                        body_timeout_s=10, linger_s=0.5)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(path))
    unix.listen()
    unix.setblocking(False)
    loop.run_until_complete(server.listen(unix))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield str(path)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(2), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        unix.close()
