"""The API's listening sockets: a Unix socket created with its mode and group before anyone can
connect, stale files from a crashed daemon cleared, and peer credentials read with SO_PEERCRED."""

from __future__ import annotations

import errno
import grp
import logging
import os
import socket
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from edged.errors import ConfigError, ConfigIssue

logger = logging.getLogger(__name__)

# sockaddr_un.sun_path is 108 bytes on Linux, one of them the terminating NUL.
MAX_SOCKET_PATH = 107
_UCRED = struct.Struct("3i")  # pid, uid, gid


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
