"""A test-owned NOTIFY_SOCKET: the datagram socket systemd listens on for sd_notify messages,
recording each message (its KEY=value lines) in arrival order."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path

Message = dict[str, str]


class NotifyReceiver:
    def __init__(self, path: Path | None = None, *, abstract: str | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract is not None:
            self.sock.bind("\0" + abstract)
            self.address = "@" + abstract
        else:
            assert path is not None
            self.sock.bind(str(path))
            self.address = str(path)
        self.sock.settimeout(0.1)
        self.messages: list[Message] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="notify-receiver", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            message = dict(line.split("=", 1) for line in data.decode().splitlines() if line)
            with self._cond:
                self.messages.append(message)
                self._cond.notify_all()

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float,
                 after: int = 0) -> tuple[int, Message] | None:
        """The first message from index `after` on that matches, waiting up to `timeout`."""
        def first() -> tuple[int, Message] | None:
            for i in range(after, len(self.messages)):
                if predicate(self.messages[i]):
                    return i, self.messages[i]
            return None

        with self._cond:
            return self._cond.wait_for(first, timeout)

    def count(self, key: str, after: int = 0) -> int:
        with self._cond:
            return sum(1 for m in self.messages[after:] if key in m)

    def __len__(self) -> int:
        with self._cond:
            return len(self.messages)

    def close(self) -> None:
        self._closed = True
        self._thread.join(2)
        self.sock.close()


def has(key: str, value: str | None = None) -> Callable[[Message], bool]:
    return lambda m: key in m and (value is None or m[key] == value)
