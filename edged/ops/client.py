"""A small Python client for edged's socket API (KServe v2 over a Unix socket or loopback TCP),
with binary tensors and system shared memory. One client holds one keep-alive connection:
use one per thread.

    with EdgedClient("/run/edged/edged.sock") as client:
        result = client.infer("ppocr_cls", {"x": batch})
        print(result.outputs["prob"])
"""

from __future__ import annotations

import http.client as httplib
import json
import mmap
import os
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import numpy as np

from edged.api.config import default_socket
from edged.api.protocol import (
    HEADER_LENGTH,
    TRITON_TO_NUMPY,
    InferResponse,
    Parts,
    RequestedOutput,
    ShmRef,
    ShmTensor,
    decode_response,
    encode_request,
    triton_dtype,
)
from edged.core.errors import EdgedError

IDLE_RECONNECT_S = 30.0  # well under aiohttp's 75 s keep-alive timeout
SHM_DIR = Path("/dev/shm")


class ApiError(EdgedError):
    """An error answer from the server: its HTTP status, its code and its message."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.http_status = status


class _UnixConnection(httplib.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            sock.close()
            why = exc.strerror or type(exc).__name__
            raise DaemonNotListening(
                f"no edged daemon listens on {self._path} ({why}): start one with `edged run`, "
                "or name its socket with --socket") from exc
        except OSError:
            sock.close()
            raise
        self.sock = sock


class DaemonNotListening(ConnectionError):
    """Nothing accepts connections on the daemon's socket: no daemon runs there."""


class EdgedClient:
    def __init__(self, socket_path: Path | str | None = None, *, http: str | None = None,
                 timeout_s: float = 60.0) -> None:
        """Talk to the Unix socket at `socket_path` (default: where `edged run` listens
        without a config file), or to `http` (HOST:PORT) when given."""
        if http is not None:
            host, _, port = http.rpartition(":")
            self._conn: httplib.HTTPConnection = httplib.HTTPConnection(
                host.strip("[]"), int(port), timeout=timeout_s)
        else:
            path = default_socket() if socket_path is None else socket_path
            self._conn = _UnixConnection(os.fspath(path), timeout_s)
        self._last_used = 0.0

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> EdgedClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- transport ---------------------------------------------------------------------------
    def request(self, method: str, path: str, body: bytes | Parts | None = None,
              headers: Mapping[str, str] | None = None) -> tuple[int, Mapping[str, str], bytes]:
        hdrs = dict(headers or {})
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
            # Parts are sent one after the other (no joined copy of the tensors).
            hdrs["Content-Length"] = str(len(body) if isinstance(body, bytes)
                                         else sum(len(part) for part in body))
        if time.monotonic() - self._last_used > IDLE_RECONNECT_S:
            self._conn.close()  # the server may have dropped it: start afresh, not mid-request
        # Only a GET is repeated after a dropped connection: a POST may already have run.
        attempts = (0, 1) if method == "GET" else (1,)
        for attempt in attempts:
            try:
                self._conn.request(method, path, body=body, headers=hdrs)
                response = self._conn.getresponse()
                status, headers, raw = response.status, dict(response.headers), response.read()
                self._last_used = time.monotonic()
                return status, headers, raw
            except (httplib.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self._conn.close()
                if attempt:
                    raise
            except (OSError, httplib.HTTPException):
                self._conn.close()  # refused, timed out, half-read: the next call starts clean
                raise
        raise AssertionError("unreachable")

    def download(self, path: str, out: BinaryIO, *, chunk: int = 2**20,
                 ) -> tuple[int, Mapping[str, str], bytes]:
        """GET `path`, a 200 answer's body written into `out` as it comes (never whole in
        memory); another answer's body is returned instead. A body cut short (a chunked
        answer without its end, fewer bytes than its length) raises IncompleteRead."""
        self._conn.close()  # (a fresh connection: a streamed answer closes it at its end)
        try:
            self._conn.request("GET", path)
            response = self._conn.getresponse()
            if response.status != 200:
                return response.status, dict(response.headers), response.read()
            while True:
                data = response.read(chunk)
                if not data:
                    break
                out.write(data)
            return response.status, dict(response.headers), b""
        finally:
            self._conn.close()

    def _json(self, method: str, path: str, payload: Any = None, *,
              ok: tuple[int, ...] = (200,)) -> Any:
        body = None if payload is None else json.dumps(payload).encode()
        status, _headers, raw = self.request(method, path, body)
        if status not in ok:
            raise _error(status, raw)
        return json.loads(raw) if raw else None

    def _status(self, path: str) -> bool:
        status, _headers, _raw = self.request("GET", path)
        return status == 200

    # -- server and models -------------------------------------------------------------------
    def live(self) -> bool:
        return self._status("/v2/health/live")

    def ready(self) -> bool:
        return self._status("/v2/health/ready")

    def status(self) -> dict[str, Any]:
        """The daemon's own summary (`edged status`)."""
        result: dict[str, Any] = self._json("GET", "/v2/edged/status")
        return result

    def server_metadata(self) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", "/v2")
        return result

    def models(self, *, ready_only: bool = False) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._json("POST", "/v2/repository/index",
                                                  {"ready": ready_only})
        return result

    def model_metadata(self, model: str, version: int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", _model_path(model, version))
        return result

    def model_config(self, model: str, version: int | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self._json("GET", _model_path(model, version) + "/config")
        return result

    def model_ready(self, model: str, version: int | None = None) -> bool:
        return self._status(_model_path(model, version) + "/ready")

    def load(self, model: str) -> None:
        self._json("POST", f"/v2/repository/models/{model}/load", {})

    def unload(self, model: str) -> None:
        self._json("POST", f"/v2/repository/models/{model}/unload", {})

    def metrics(self) -> str:
        status, _headers, raw = self.request("GET", "/metrics")
        if status != 200:
            raise _error(status, raw)
        return raw.decode()

    # -- inference ---------------------------------------------------------------------------
    def infer(self, model: str, inputs: Mapping[str, np.ndarray | ShmTensor], *,
              outputs: Sequence[str | RequestedOutput] = (), version: int | None = None,
              binary: bool = True, priority: int | None = None, timeout_us: int | None = None,
              request_id: str | None = None) -> InferResponse:
        """Run one request. `binary=False` sends and asks for JSON `data` instead of bytes."""
        params: dict[str, Any] = {}
        if priority is not None:
            params["priority"] = priority
        if timeout_us is not None:
            params["timeout"] = timeout_us
        wanted = [o if isinstance(o, RequestedOutput) else RequestedOutput(o) for o in outputs]
        parts, json_length = encode_request(inputs, wanted, binary=binary,
                                            request_id=request_id, parameters=params)
        headers = {} if json_length is None else {
            HEADER_LENGTH: str(json_length), "Content-Type": "application/octet-stream"}
        status, response_headers, raw = self.request("POST", _model_path(model, version) +
                                                    "/infer", parts, headers)
        if status != 200:
            raise _error(status, raw)
        length = response_headers.get(HEADER_LENGTH)
        return decode_response(raw, int(length) if length is not None else None)

    # -- system shared memory ----------------------------------------------------------------
    def register_shm(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        self._json("POST", f"/v2/systemsharedmemory/region/{name}/register",
                   {"key": key, "offset": offset, "byte_size": byte_size})

    def unregister_shm(self, name: str | None = None) -> None:
        path = "/v2/systemsharedmemory" + (f"/region/{name}" if name else "") + "/unregister"
        self._json("POST", path, {})

    def shm_status(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._json("GET", "/v2/systemsharedmemory/status")
        return result


class SharedRegion:
    """A POSIX shared memory object this process creates (`/dev/shm/<key>`), for tensors that
    should not cross the socket. Mode 0660 so that a daemon in the same group can map it."""

    def __init__(self, key: str, byte_size: int, *, mode: int = 0o660) -> None:
        self.key = key.lstrip("/")
        self.byte_size = byte_size
        self.path = SHM_DIR / self.key
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # the umask must not narrow it
            os.ftruncate(fd, byte_size)
            self._map = mmap.mmap(fd, byte_size)
        except BaseException:  # undo, then re-raise (Ctrl-C too): no stray /dev/shm file
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)

    def tensor(self, region: str, array: np.ndarray, offset: int = 0) -> ShmTensor:
        """Copy `array` in at `offset`; return the reference an infer request carries."""
        data = np.ascontiguousarray(array)
        self.write(data, offset)
        return ShmTensor(ShmRef(region, offset, data.nbytes), triton_dtype(data.dtype),
                         tuple(data.shape))

    def write(self, array: np.ndarray, offset: int = 0) -> None:
        data = np.ascontiguousarray(array)
        if offset + data.nbytes > self.byte_size:
            raise ValueError(f"{data.nbytes} bytes at {offset} do not fit {self.byte_size}")
        self._map[offset:offset + data.nbytes] = data.reshape(-1).view(np.uint8).data

    def read(self, datatype: str, shape: Sequence[int], offset: int = 0) -> np.ndarray:
        """A copy of a tensor the server wrote here."""
        dtype = np.dtype(TRITON_TO_NUMPY[datatype])
        count = int(np.prod(shape))
        return np.frombuffer(self._map, dtype, count, offset).reshape(shape).copy()

    def close(self) -> None:
        self._map.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> SharedRegion:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _model_path(model: str, version: int | None) -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version is not None else "")


def _error(status: int, raw: bytes) -> ApiError:
    try:
        body = json.loads(raw)
        return ApiError(status, str(body.get("code", "http")), str(body.get("error", body)))
    except (ValueError, AttributeError):
        return ApiError(status, "http", raw.decode(errors="replace")[:500] or f"HTTP {status}")
