"""The API's listening sockets: a Unix socket created with its mode and group before anyone can
connect, stale files from a crashed daemon cleared, and peer credentials read with SO_PEERCRED."""

from __future__ import annotations

import errno
import grp
import logging
import os
import pwd
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from edged.api.shm import Peer
from edged.core.errors import ConfigError, ConfigIssue

logger = logging.getLogger(__name__)

# sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL.
MAX_SOCKET_PATH = 107
_UCRED = struct.Struct("iII")  # pid, uid, gid
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux >= 4.13
_PROC_NET = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


@dataclass(frozen=True)
class UnixListener:
    sock: socket.socket
    path: Path
    inode: int  # removed at shutdown only if the file is still this one

    def remove(self) -> None:
        try:
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        except FileNotFoundError:
            pass


def bind_unix(path: Path, mode: int, group: str | None) -> UnixListener:
    """Bind (not listen) a Unix socket at `path` with `mode` and `group`. Until asyncio calls
    listen(), a connect is refused, so nobody reaches the socket before its mode is set."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ConfigError([ConfigIssue("api.socket", f"{path} is longer than the "
                                       f"{MAX_SOCKET_PATH} bytes a Unix socket path may have")])
    gid = _group_id(group)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError([ConfigIssue("api.socket", f"cannot create {path.parent}: "
                                       f"{exc.strerror}")]) from exc
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        os.chmod(path, mode)
        if gid is not None:
            os.chown(path, -1, gid)
        sock.setblocking(False)
        return UnixListener(sock, path, os.stat(path).st_ino)
    except OSError as exc:
        sock.close()
        raise ConfigError([ConfigIssue("api.socket", f"cannot serve on {path}: "
                                       f"{exc.strerror}")]) from exc


def _group_id(group: str | None) -> int | None:
    if group is None:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise ConfigError([ConfigIssue("api.socket_group",
                                       f"no group named {group!r}")]) from None


def _clear_stale(path: Path) -> None:
    """Remove a socket file left by a daemon that died; refuse to touch anything else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise ConfigError([ConfigIssue("api.socket", f"{path} exists and is not a socket")])
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(os.fspath(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ConfigError([ConfigIssue("api.socket", f"{path}: {exc.strerror}")]) from exc
        logger.info("removing stale socket %s", path)
        path.unlink(missing_ok=True)
    else:
        raise ConfigError([ConfigIssue("api.socket", f"{path} is in use: another edged "
                                       "is serving there")])
    finally:
        probe.close()


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of a Unix socket peer; None for other sockets."""
    if sock.family != socket.AF_UNIX:
        return None
    pid, uid, gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                  _UCRED.size))
    return pid, uid, gid


def peer_identity(sock: socket.socket) -> Peer | None:
    """The uid and every group (primary and supplementary) of the process at the other end:
    SO_PEERCRED/SO_PEERGROUPS on a Unix socket, the kernel's socket table for a loopback TCP
    connection. None when it cannot be told."""
    if sock.family == socket.AF_UNIX:
        creds = peer_credentials(sock)
        if creds is None:
            return None
        _pid, uid, gid = creds
        return Peer(uid, frozenset({gid, *_peer_groups(sock)}))
    try:
        owner = _tcp_peer_uid(sock.getsockname(), sock.getpeername())
    except OSError:
        return None
    return Peer(owner, _groups_of(owner)) if owner is not None else None


def _peer_groups(sock: socket.socket) -> list[int]:
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * 256)
    except OSError:
        return []
    return list(struct.unpack(f"{len(raw) // 4}I", raw[:len(raw) // 4 * 4]))


def _tcp_peer_uid(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The owner of the client's end of a loopback connection, from /proc/net/tcp{,6}: the
    client's socket is the row whose local address is our remote one and vice versa."""
    want_local, want_remote = _proc_addr(remote), _proc_addr(local)
    for table in _PROC_NET:
        try:
            rows = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 7 and (fields[1], fields[2]) in ((want_local[0], want_remote[0]),
                                                             (want_local[1], want_remote[1])):
                return int(fields[7])
    return None


def _proc_addr(address: tuple[str, int] | tuple[str, int, int, int]) -> tuple[str, str]:
    """An address as /proc/net/tcp (IPv4) and /proc/net/tcp6 write it."""
    host, port = address[0], address[1]
    packed = socket.inet_pton(socket.AF_INET6 if ":" in host else socket.AF_INET, host)
    if len(packed) == 4:
        v4 = f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"
        mapped = b"\0" * 10 + b"\xff\xff" + packed  # ::ffff:a.b.c.d in tcp6
    else:
        v4, mapped = "", packed
    words = "".join(f"{int.from_bytes(mapped[i:i + 4], 'little'):08X}" for i in range(0, 16, 4))
    return v4, f"{words}:{port:04X}"


def _groups_of(uid: int) -> frozenset[int]:
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    return frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
