"""edged's own extension of the socket API: model installs handed to the daemon's verified OTA
installer (edged/ota/local.py), as the Mender update module does (deploy/mender/edged-model).
Served on the Unix socket only: the loopback TCP listener refuses them.

- `POST /v2/edged/ota/install[?hold=true&tag=T]`: the body is the manifest (JSON), then, when
  its artifact has neither url nor chunks, the artifact's bytes; `Edged-Manifest-Length`
  says where the manifest ends (without it the body is the manifest alone). 202 with the
  install (`id`, `state`, ...); the install runs on; `hold`: once active it waits for a commit.
- `GET /v2/edged/ota/installs`, `GET /v2/edged/ota/installs/{id}`: installs and their state
  (received ... active | failed | rolled_back, `committed`, `reason`, the status events).
- `POST /v2/edged/ota/installs/{id}/commit` | `/rollback`: a held install is kept, or undone
  (the version before it serves again).

A refusal is `{"error", "code": "update_rejected", "reason"}` with the OTA reason codes: 404
for an unknown install, 409 for one that conflicts (busy, uncommitted, not_active, committed),
400 otherwise; nothing has changed."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from edged.api.http.messages import BrokenBody, Handler, Request, Response, json_response
from edged.core.errors import Forbidden, InvalidInput, TooLarge, UpdateRejected
from edged.core.numbers import ascii_int

MANIFEST_LENGTH = "Edged-Manifest-Length"
MAX_MANIFEST_BYTES = 64 * 1024
CONFLICTS = frozenset({"busy", "uncommitted", "not_active", "committed"})
WRITE_ON_THREAD = 1 << 20  # bytes gathered before a write goes to a thread


class Installs(Protocol):
    """What the daemon lends these routes (edged.ota.local.LocalInstalls)."""

    @property
    def max_bytes(self) -> int: ...  # the largest artifact taken (ota.max_artifact_mb)

    def staging(self) -> Path: ...

    def begin(self, payload: bytes, artifact: Path | None, *, hold: bool,
              tag: str | None = None) -> dict[str, Any]: ...

    def get(self, install_id: str) -> dict[str, Any]: ...

    def listing(self) -> list[dict[str, Any]]: ...

    def commit(self, install_id: str) -> dict[str, Any]: ...

    def rollback(self, install_id: str) -> dict[str, Any]: ...


class OtaRoutes:
    def __init__(self, installs: Callable[[], Installs | None]) -> None:
        """`installs` gives the daemon's installer (None: it takes no installs)."""
        self.installs = installs

    def routes(self) -> list[tuple[str, str, Handler]]:
        base = "/v2/edged/ota"
        return [("POST", base + "/install", self.install),
                ("GET", base + "/installs", self.index),
                ("GET", base + "/installs/{id}", self.show),
                ("POST", base + "/installs/{id}/commit", self.commit),
                ("POST", base + "/installs/{id}/rollback", self.rollback)]

    def _installs(self, request: Request) -> Installs:
        if not request.is_unix:
            raise Forbidden("model installs are taken on the Unix socket only")
        installs = self.installs()
        if installs is None:
            raise Forbidden("this daemon takes no installs through its socket")
        return installs

    async def install(self, request: Request) -> Response:
        installs = self._installs(request)
        hold = _flag(request.query.get("hold", "false"), "hold")
        tag = request.query.get("tag")
        raw = request.headers.get(MANIFEST_LENGTH)
        length = ascii_int(raw)
        if raw is not None and (length is None or not 0 < length <= MAX_MANIFEST_BYTES):
            raise InvalidInput(f"{MANIFEST_LENGTH} must be 1 to {MAX_MANIFEST_BYTES}, got "
                               f"{raw[:20]!r}")
        head = length if length is not None else MAX_MANIFEST_BYTES
        manifest, rest = await _read_manifest(request, head, exact=raw is not None)
        artifact = None
        if raw is not None:
            try:
                folder = installs.staging()
            except UpdateRejected as exc:  # starting: the body stays unread
                return await self._answer(_raise(exc))
            artifact = folder / f"upload-{uuid.uuid4().hex[:12]}"
            try:
                await _write_rest(request, rest, artifact, installs.max_bytes)
            except BaseException:
                artifact.unlink(missing_ok=True)
                raise
            if artifact.stat().st_size == 0:
                artifact.unlink()
                artifact = None
        return await self._answer(asyncio.to_thread(installs.begin, manifest, artifact,
                                                    hold=hold, tag=tag), status=202)

    async def index(self, request: Request) -> Response:
        installs = self._installs(request)
        return json_response({"installs": await asyncio.to_thread(installs.listing)})

    async def show(self, request: Request) -> Response:
        installs = self._installs(request)
        return await self._answer(asyncio.to_thread(installs.get, request.match_info["id"]))

    async def commit(self, request: Request) -> Response:
        installs = self._installs(request)
        return await self._answer(asyncio.to_thread(installs.commit, request.match_info["id"]))

    async def rollback(self, request: Request) -> Response:
        installs = self._installs(request)
        return await self._answer(asyncio.to_thread(installs.rollback,
                                                    request.match_info["id"]))

    @staticmethod
    async def _answer(call: Any, status: int = 200) -> Response:
        try:
            return json_response(await call, status=status)
        except UpdateRejected as exc:
            reason = getattr(exc, "reason", exc.code)
            code = 404 if reason == "unknown_install" else 409 if reason in CONFLICTS else 400
            return json_response({"error": str(exc), "code": exc.code, "reason": reason},
                                 status=code)


async def _next(request: Request) -> bytes | bytearray:
    """The next bytes of the body; a client silent for api.body_timeout_s is cut off."""
    try:
        return await asyncio.wait_for(request.content.readany(), request.body_timeout_s)
    except asyncio.TimeoutError:
        raise InvalidInput(f"the body stalled for {request.body_timeout_s:g} s "
                           "(api.body_timeout_s)") from None
    except (ConnectionError, BrokenBody) as exc:
        raise InvalidInput(f"the body cannot be read: {exc}") from exc


async def _read_manifest(request: Request, length: int, *, exact: bool) -> tuple[bytes, bytes]:
    """The manifest's bytes, and whatever of the artifact came in the same reads."""
    got = bytearray()
    while len(got) < length:
        chunk = await _next(request)
        if not chunk:
            break
        got += chunk
        if not exact and len(got) > length:
            raise TooLarge(f"a manifest is at most {MAX_MANIFEST_BYTES} bytes")
    if exact and len(got) < length:
        raise InvalidInput(f"the body ended inside the manifest ({len(got)} of {length} bytes)")
    return bytes(got[:length]), bytes(got[length:])


async def _write_rest(request: Request, first: bytes, path: Path, limit: int) -> None:
    """The rest of the body (the artifact) into `path`, at most `limit` bytes; big writes on a
    thread, so a slow disk does not stall the loop."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        size = 0
        pending: list[bytes | bytearray] = [first]
        held = len(first)
        while True:
            chunk = await _next(request)
            if chunk:
                pending.append(chunk)
                held += len(chunk)
            size += len(chunk)
            if size + len(first) > limit:
                raise TooLarge(f"the artifact exceeds ota.max_artifact_mb ({limit >> 20} MiB)")
            if held >= WRITE_ON_THREAD or not chunk:
                data, pending, held = b"".join(pending), [], 0
                await asyncio.to_thread(out.write, data)
            if not chunk:
                return


async def _raise(exc: Exception) -> Any:
    raise exc


def _flag(value: str, name: str) -> bool:
    if value.lower() in ("1", "true", "yes"):
        return True
    if value.lower() in ("0", "false", "no", ""):
        return False
    raise InvalidInput(f"{name} must be true or false, got {value[:16]!r}")
