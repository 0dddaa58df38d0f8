"""One uid's side of the differential test: its keep-alive connections to the daemons (Unix
socket or TCP), the raw requests sent on them (one at a time or pipelined, a head and body in
one write or two) and the answers read back, and its POSIX shared memory objects.

`LocalPeer` runs in the test's own process (root, or whoever runs it). Another uid's peer is
this module run as a subprocess under that uid (`python -m tools.differential.peer`): the
test sends it pickled calls on its stdin and reads pickled results from its stdout
(`RemotePeer`). Only the standard library here, so that the subprocess starts quickly."""

from __future__ import annotations

import mmap
import os
import pickle
import socket
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHM_DIR = Path("/dev/shm")
TIMEOUT_S = 20.0  # an answer later than this is none: reported as TIMED_OUT
# What of an answer's headers is compared (Date and Server are not the answer).
COMPARED_HEADERS = ("content-type", "content-length", "inference-header-content-length",
                    "connection", "content-encoding", "transfer-encoding", "retry-after")
CLOSED = (0, (), b"")  # no answer: the connection was closed before one came
TIMED_OUT = (-1, (), b"")  # no answer within TIMEOUT_S (the connection is dropped)


@dataclass(frozen=True)
class Target:
    """Where a daemon listens: a Unix socket path, or a loopback TCP port."""

    unix: str | None = None
    port: int = 0

    def connect(self) -> socket.socket:
        if self.unix is not None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(TIMEOUT_S)
            sock.connect(self.unix)
        else:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT_S)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


Answer = tuple[int, tuple[tuple[str, str], ...], bytes]  # status, compared headers, body


class _Reader:
    """HTTP/1.1 answers read off one connection."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(1 << 16)
        self.buffer += chunk
        return bool(chunk)

    def answer(self) -> tuple[Answer, bool]:
        """The next answer and whether the connection stays open after it."""
        while b"\r\n\r\n" not in self.buffer:
            if not self._fill():
                return CLOSED, False
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = self._chunked()
        else:
            length = int(headers.get("content-length", "0"))
            while len(self.buffer) < length:
                if not self._fill():
                    return CLOSED, False
            body, self.buffer = self.buffer[:length], self.buffer[length:]
        kept = tuple((k, headers[k]) for k in COMPARED_HEADERS if k in headers)
        keep = headers.get("connection", "").lower() != "close"
        return (status, kept, body), keep

    def _chunked(self) -> bytes:
        body = b""
        while True:
            while b"\r\n" not in self.buffer:
                if not self._fill():
                    return body
            size_line, self.buffer = self.buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(self.buffer) < size + 2:
                if not self._fill():
                    return body
            body += self.buffer[:size]
            self.buffer = self.buffer[size + 2:]
            if size == 0:
                return body


class LocalPeer:
    """Connections and shared memory objects of the uid this process runs as."""

    def __init__(self) -> None:
        self._conns: dict[str, tuple[socket.socket, _Reader]] = {}
        self._maps: dict[str, mmap.mmap] = {}
        self._lock = threading.Lock()

    # -- requests ----------------------------------------------------------------------------
    def burst(self, conn: str, target: Target, requests: list[tuple[bytes, int | None]],
              pipelined: bool) -> list[Answer]:
        """Send `requests` (bytes, and where to split them into two writes) on connection
        `conn` (opened to `target` when it is not open); their answers, in order. Pipelined:
        all are written before the first answer is read."""
        answers: list[Answer] = []
        if pipelined:
            sock, reader = self._open(conn, target)
            try:
                for raw, split in requests:
                    _send(sock, raw, split)
            except OSError:
                pass  # the daemon closed it early (a refused request): what it answered counts
            for _ in requests:
                answer, keep = self._read(conn, reader)
                answers.append(answer)
                if not keep:
                    self.close(conn)
                    break
            return answers + [CLOSED] * (len(requests) - len(answers))
        for raw, split in requests:
            sock, reader = self._open(conn, target)
            try:
                _send(sock, raw, split)
            except OSError:
                pass
            answer, keep = self._read(conn, reader)
            answers.append(answer)
            if not keep:
                self.close(conn)
        return answers

    def _read(self, conn: str, reader: _Reader) -> tuple[Answer, bool]:
        try:
            return reader.answer()
        except TimeoutError:
            self.close(conn)
            return TIMED_OUT, False
        except OSError:  # reset: the daemon dropped it
            self.close(conn)
            return CLOSED, False

    def _open(self, conn: str, target: Target) -> tuple[socket.socket, _Reader]:
        with self._lock:
            found = self._conns.get(conn)
            if found is None:
                sock = target.connect()
                found = self._conns[conn] = (sock, _Reader(sock))
            return found

    def close(self, conn: str) -> None:
        with self._lock:
            found = self._conns.pop(conn, None)
        if found is not None:
            found[0].close()

    def close_all(self) -> None:
        for conn in list(self._conns):
            self.close(conn)
        for key in list(self._maps):
            self.shm_unlink(key)

    # -- shared memory -----------------------------------------------------------------------
    def shm_create(self, key: str, size: int) -> None:
        path = SHM_DIR / key
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, size)
            self._maps[key] = mmap.mmap(fd, size)
        finally:
            os.close(fd)

    def shm_write(self, key: str, offset: int, data: bytes) -> None:
        self._maps[key][offset:offset + len(data)] = data

    def shm_read(self, key: str, offset: int, size: int) -> bytes:
        return bytes(self._maps[key][offset:offset + size])

    def shm_unlink(self, key: str) -> None:
        mapping = self._maps.pop(key, None)
        if mapping is not None:
            mapping.close()
        (SHM_DIR / key).unlink(missing_ok=True)


def _send(sock: socket.socket, raw: bytes, split: int | None) -> None:
    if split is None or not 0 < split < len(raw):
        sock.sendall(raw)
    else:  # as perf_analyzer and http.client send a head and its body: two writes
        sock.sendall(raw[:split])
        sock.sendall(raw[split:])


class RemotePeer:
    """A LocalPeer in a subprocess running as another uid (the caller must be root)."""

    def __init__(self, uid: int, gid: int, cwd: Path) -> None:
        self.uid = uid
        self._proc = subprocess.Popen([python_for_others(), "-m", "tools.differential.peer"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      user=uid, group=gid, extra_groups=[], cwd=cwd,
                                      env={**os.environ, "PYTHONPATH": str(cwd)})
        self._lock = threading.Lock()

    def _call(self, name: str, *args: Any) -> Any:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            message = pickle.dumps((name, args))
            self._proc.stdin.write(struct.pack("<I", len(message)) + message)
            self._proc.stdin.flush()
            size = struct.unpack("<I", _exactly(self._proc.stdout, 4))[0]
            ok, value = pickle.loads(_exactly(self._proc.stdout, size))
        if not ok:
            raise RuntimeError(f"peer uid {self.uid}: {name}: {value}")
        return value

    def burst(self, conn: str, target: Target, requests: list[tuple[bytes, int | None]],
              pipelined: bool) -> list[Answer]:
        answers: list[Answer] = self._call("burst", conn, target, requests, pipelined)
        return answers

    def close(self, conn: str) -> None:
        self._call("close", conn)

    def shm_create(self, key: str, size: int) -> None:
        self._call("shm_create", key, size)

    def shm_write(self, key: str, offset: int, data: bytes) -> None:
        self._call("shm_write", key, offset, data)

    def shm_read(self, key: str, offset: int, size: int) -> bytes:
        data: bytes = self._call("shm_read", key, offset, size)
        return data

    def shm_unlink(self, key: str) -> None:
        self._call("shm_unlink", key)

    def close_all(self) -> None:
        try:
            self._call("close_all")
        finally:
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.close()
            self._proc.wait(10)
            self._proc.stdout.close()


def python_for_others() -> str:
    """A Python that another uid may run: this one where every folder on its way lets others
    in (a pyenv under /root does not), else the system's (the peer needs only the standard
    library)."""
    if _open_to_others(Path(sys.executable)):
        return sys.executable
    system = Path("/usr/bin/python3")
    if _open_to_others(system):
        return str(system)
    raise RuntimeError(f"no Python another uid may run: {sys.executable} is not, and "
                       f"{system} is missing (apt-get install python3)")


def _open_to_others(path: Path) -> bool:
    try:
        real = path.resolve(strict=True)
    except OSError:
        return False
    folders_open = all(p.stat().st_mode & 0o001 for p in real.parents)
    return folders_open and bool(real.stat().st_mode & 0o001)


def _exactly(stream: Any, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise RuntimeError("the peer process ended")
    return bytes(data)


def main() -> None:
    """Serve a LocalPeer's calls on stdin/stdout until stdin closes."""
    peer = LocalPeer()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while header := stdin.read(4):
        name, args = pickle.loads(_exactly(stdin, struct.unpack("<I", header)[0]))
        try:
            result = (True, getattr(peer, name)(*args))
        except Exception as exc:  # reported to the test, which fails on it
            result = (False, f"{type(exc).__name__}: {exc}")
        message = pickle.dumps(result)
        stdout.write(struct.pack("<I", len(message)) + message)
        stdout.flush()


if __name__ == "__main__":
    main()
