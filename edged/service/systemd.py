"""Being a good systemd service: sd_notify (READY, STATUS, WATCHDOG, RELOADING, STOPPING),
socket activation (LISTEN_FDS), and logging to the journal with fields operators can filter
on (MODEL=, STREAM=, CODE=).

Each part speaks the documented protocol itself, so nothing here needs libsystemd; the
notify messages go through systemd-python when it is installed. Outside systemd every part
is a no-op: no NOTIFY_SOCKET, no LISTEN_FDS, stderr instead of the journal."""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3
JOURNAL_SOCKET = Path("/run/systemd/journal/socket")
# Record attributes (logging's `extra=`) that become journal fields.
FIELDS = {"model": "MODEL", "version": "MODEL_VERSION", "stream": "STREAM", "code": "CODE"}
# Python levels → syslog priorities (journalctl -p).
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
              (logging.INFO, 6), (logging.DEBUG, 7))
MAX_MESSAGE = 48 * 1024  # a datagram must fit the socket's buffer; longer messages are cut


# -- sd_notify -------------------------------------------------------------------------------
class Notifier:
    """Sends state changes to the service manager at $NOTIFY_SOCKET; does nothing without one.

    Thread-safe (one datagram per call). A failed send is logged once and never raised: the
    service must not die because its manager went away."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = env.get("NOTIFY_SOCKET") or None
        self.watchdog_s = _watchdog_interval(env)
        self._warned = False
        self._sock: socket.socket | None = None
        self._native = _systemd_python_notify() if self.address and environ is None else None

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, *assignments: str) -> bool:
        """Send `KEY=value` assignments in one message; True when it was delivered."""
        if self.address is None:
            return False
        message = "\n".join(assignments)
        try:
            if self._native is not None:
                return bool(self._native(message))
            self._datagram(message.encode())
            return True
        except OSError as exc:
            if not self._warned:
                self._warned = True
                logger.warning("cannot notify the service manager at %s: %s", self.address,
                               exc.strerror or exc)
            return False

    def _datagram(self, payload: bytes) -> None:
        address = self.address
        assert address is not None
        if not (address.startswith("/") or address.startswith("@")):
            raise OSError(f"unsupported NOTIFY_SOCKET address {address!r}")
        target = "\0" + address[1:] if address.startswith("@") else address  # abstract name
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sock.sendto(payload, target)

    # The messages edged sends, in the order a run sends them.
    def ready(self, status: str) -> bool:
        return self.send("READY=1", _status(status))

    def status(self, status: str) -> bool:
        return self.send(_status(status))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def reloading(self) -> bool:
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", _status("reloading config"))

    def stopping(self, status: str = "stopping") -> bool:
        return self.send("STOPPING=1", _status(status))

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for more time to start or stop (a TensorRT engine build can take minutes)."""
        return self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1e6)}")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status(text: str) -> str:
    return "STATUS=" + " ".join(text.split())  # one line: systemctl status shows one


def _watchdog_interval(env: Mapping[str, str]) -> float | None:
    """Seconds between pings systemd expects (WATCHDOG_USEC), or None when there is no
    watchdog for this process (unset, or WATCHDOG_PID names another process)."""
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec or not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1e6


def _systemd_python_notify() -> Callable[[str], bool] | None:
    try:
        from systemd import daemon
    except ImportError:
        return None
    notify: Callable[[str], bool] = daemon.notify
    return notify


# -- socket activation -----------------------------------------------------------------------
def listen_fds(environ: dict[str, str] | None = None, *,
               unset: bool = True) -> dict[str, list[socket.socket]]:
    """Sockets systemd passed to this process (LISTEN_FDS from fd 3 on), by their
    FileDescriptorName (`unknown` when unnamed). Empty when none were passed to *this*
    process. The variables are removed so that children do not take the sockets as theirs."""
    env: dict[str, str] = os.environ if environ is None else environ  # type: ignore[assignment]
    pid, count = env.get("LISTEN_PID", ""), env.get("LISTEN_FDS", "")
    names = env.get("LISTEN_FDNAMES", "").split(":")
    if unset:
        for key in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
            env.pop(key, None)
    if not (pid.isdigit() and int(pid) == os.getpid() and count.isdigit()):
        return {}
    found: dict[str, list[socket.socket]] = {}
    for i in range(int(count)):
        fd = SD_LISTEN_FDS_START + i
        try:
            os.set_inheritable(fd, False)
            sock = socket.socket(fileno=fd)
        except OSError as exc:
            logger.warning("socket activation: fd %d is not a usable socket: %s", fd, exc)
            continue
        name = names[i] if i < len(names) and names[i] else "unknown"
        found.setdefault(name, []).append(sock)
    return found


def activated_unix_socket(sockets: dict[str, list[socket.socket]],
                          name: str) -> socket.socket | None:
    """The listening Unix stream socket named `name` (or the only one, unnamed)."""
    candidates = sockets.get(name) or sockets.get("unknown") or []
    for sock in candidates:
        if sock.family == socket.AF_UNIX and sock.type == socket.SOCK_STREAM:
            return sock
    return None


# -- journald --------------------------------------------------------------------------------
class JournalHandler(logging.Handler):
    """Writes records to journald's native socket: MESSAGE, PRIORITY, the code location, the
    logger and thread, and MODEL= / MODEL_VERSION= / STREAM= / CODE= from a record's `extra`.
    A record the journal refuses goes to stderr instead of being lost."""

    def __init__(self, path: Path = JOURNAL_SOCKET, identifier: str = "edged") -> None:
        super().__init__()
        self.path = path
        self.identifier = identifier
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            payload = encode_fields(self.fields(record))
            try:
                self._sock.sendto(payload, os.fspath(self.path))
            except OSError as exc:
                if exc.errno != 90:  # EMSGSIZE: cut the message and try once more
                    raise
                fields = self.fields(record)
                fields["MESSAGE"] = fields["MESSAGE"][:MAX_MESSAGE] + " [cut]"
                self._sock.sendto(encode_fields(fields), os.fspath(self.path))
        except Exception:  # the journal is gone: say it where a person can still see it
            sys.stderr.write(f"{record.levelname} {record.name}: {record.getMessage()}\n")

    def fields(self, record: logging.LogRecord) -> dict[str, str]:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        fields = {
            "MESSAGE": message,
            "PRIORITY": str(next(p for level, p in PRIORITIES if record.levelno >= level)
                            if record.levelno >= logging.DEBUG else 7),
            "SYSLOG_IDENTIFIER": self.identifier,
            "LOGGER": record.name,
            "THREAD_NAME": record.threadName or "",
            "CODE_FILE": record.pathname or "",
            "CODE_LINE": str(record.lineno),
            "CODE_FUNC": record.funcName or "",
        }
        for attribute, field in FIELDS.items():
            value = getattr(record, attribute, None)
            if value is not None:
                fields[field] = str(value)
        return fields

    def close(self) -> None:
        self._sock.close()
        super().close()


def encode_fields(fields: Mapping[str, str]) -> bytes:
    """journald's native format: `KEY=value\\n`, or for values with a newline
    `KEY\\n<64-bit little-endian length><value>\\n`."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


def stderr_is_journal(environ: Mapping[str, str] | None = None) -> bool:
    """True when systemd connected stderr to the journal (JOURNAL_STREAM names its device and
    inode): the documented signal to switch to the native protocol."""
    env = os.environ if environ is None else environ
    device, _sep, inode = env.get("JOURNAL_STREAM", "").partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        info = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return (info.st_dev, info.st_ino) == (int(device), int(inode))


def setup_logging(level: str, target: str = "auto", *,
                  journal_socket: Path = JOURNAL_SOCKET) -> str:
    """Route the root logger to the journal or stderr; returns which one was chosen.
    `auto` picks the journal when systemd connected stderr to it."""
    use_journal = target == "journal" or (target == "auto" and stderr_is_journal())
    handler: logging.Handler
    if use_journal and journal_socket.exists():
        handler = JournalHandler(journal_socket)
        chosen = "journal"
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
        chosen = "stderr"
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    return chosen
