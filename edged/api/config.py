"""The socket API's section of the daemon config (`api:`): where it listens, who may call,
and the bounds every request meets."""

from __future__ import annotations

import ipaddress
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from edged.core.schema import at_least, between, setting

SYSTEM_SOCKET = Path("/run/edged/edged.sock")  # the service's (systemd makes /run/edged)


def default_socket() -> Path:
    """Where the API listens when the config names no socket: the service's path for root or
    where /run/edged is writable, else the user's runtime directory ($XDG_RUNTIME_DIR, as a
    desktop session or `systemd --user` sets it; /tmp/edged-<uid>.sock without one)."""
    if os.geteuid() == 0 or os.access(SYSTEM_SOCKET.parent, os.W_OK):
        return SYSTEM_SOCKET
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "edged.sock"
    return Path(tempfile.gettempdir()) / f"edged-{os.getuid()}.sock"


def _check_mode(value: str) -> str | None:
    return None if re.fullmatch(r"0?[0-7]{3}", value) else "must be an octal mode such as \"0660\""


def split_host_port(value: str) -> tuple[str, int]:
    """`127.0.0.1:8000` or `[::1]:8000` → (host, port); ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def check_loopback(value: str) -> str | None:
    try:
        host, _port = split_host_port(value)
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError as exc:
        return str(exc)
    return None if loopback else f"the HTTP listener is loopback-only, got host {host!r}"


# The shortcuts that skip work because they saw something before (issue 49; DESIGN.md,
# "Shortcuts answer exactly what the full path would"). Turned off, a request takes the full
# path: the differential test's reference (tools/differential), and a user's way to rule one
# out.
Shortcut = Literal["plans", "replays", "response_cache", "shm_views"]
SHORTCUTS: tuple[Shortcut, ...] = ("plans", "replays", "response_cache", "shm_views")


def _check_shortcuts(value: list[str]) -> str | None:
    return "lists a shortcut twice" if len(set(value)) < len(value) else None


@dataclass(frozen=True)
class ApiConfig:
    socket: Path = setting(factory=default_socket, help="Unix socket of the KServe v2 API; "
                           "unset: /run/edged/edged.sock, or $XDG_RUNTIME_DIR/edged.sock for a "
                           "user who cannot write /run/edged")
    socket_mode: str = setting("0660", "socket file mode (octal, quoted)", check=_check_mode)
    socket_group: str | None = setting(None, "group owning the socket; null = unchanged")
    http: str | None = setting(None, "optional loopback TCP listener HOST:PORT",
                               check=check_loopback)
    allowed_uids: list[int] = setting(factory=list, help="Unix socket peers (SO_PEERCRED) "
                                      "whose uid may call, others get 403; empty = any")
    allowed_gids: list[int] = setting(factory=list, help="Unix socket peers whose gid may call, "
                                      "others get 403; empty = any")
    max_request_mb: int = setting(64, "largest request body in MiB, gzip/deflate bodies as "
                                      "inflated; larger: 413", check=at_least(1))
    max_bodies_mb: int = setting(256, "memory all request bodies in flight may hold at once "
                                      "(JSON tensors count 10x their text); past it, 503",
                                 check=at_least(1))
    max_connections: int = setting(512, "connections open at once; more are closed as they "
                                        "arrive (keep it below the unit's LimitNOFILE)",
                                   check=between(1, 60000))
    header_timeout_s: float = setting(10.0, "a request's headers must arrive within this of "
                                            "the connection, or of their first byte",
                                      check=at_least(0.1))
    body_timeout_s: float = setting(30.0, "a request's whole body must arrive within this of "
                                          "its headers (else 408): a stalled body holds its "
                                          "share of max_bodies_mb; a client that takes "
                                          "longer than this to read an answer is cut off",
                                    check=at_least(0.1))
    keepalive_s: float = setting(75.0, "an idle kept-alive connection is closed after this",
                                 check=at_least(0.1))
    max_header_fields: int = setting(100, "header fields a request may carry; more are "
                                          "answered 431", check=between(8, 10000))
    max_header_line_bytes: int = setting(8192, "longest header line (name and value) and "
                                               "request target; longer is answered 431 (a "
                                               "target: 414)", check=between(1024, 65536))
    shortcuts: list[Shortcut] = setting(
        factory=lambda: list(SHORTCUTS),
        help="the shortcuts on: `plans` (a header seen before is not parsed and checked "
        "again), `replays` (its repeats on a connection are answered unparsed; needs plans), "
        "`response_cache` (models that opt in answer repeats from it), `shm_views` (trusted "
        "peers' shm inputs lent to models as views, not copied); [] = every request takes "
        "the full path. Each answers what the full path would (tools/differential checks)",
        check=_check_shortcuts)
    shm_copy_inputs: Literal["auto", "always", "never"] = setting(
        "auto", "copy shm inputs (pread) instead of lending models views of the mapping: "
        "auto copies for peers of another uid than edged's (not root), so that a client "
        "shrinking its object under a queued request cannot crash edged")
    live_fps: float = setting(5.0, "frames a second at most in a live MJPEG view "
                                   "(/v2/edged/streams/<name>/live.mjpeg); each is drawn "
                                   "when sent, never on the stream's own thread",
                              check=between(0.2, 60))
    live_viewers: int = setting(4, "live MJPEG views of one stream open at once; more are "
                                   "answered 503 (latest.jpg still answers)",
                                check=between(1, 100))
