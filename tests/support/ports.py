"""Free TCP ports on 127.0.0.1 for the servers the tests start (mosquitto, the daemon's HTTP
listener, a camera).

Where a server can take a socket, or bind port 0 and say which port it got, do that: no race
at all (the artifact server and the MJPEG camera do). The others need a number up front, to
write into a config, and binding port 0, closing and returning the number (what each module
did before) leaves a window in which anything else can take it: another test's helper in this
process, a parallel test run, or the kernel handing it out as the ephemeral port of some
outgoing connection.

`free_port()` narrows that window as far as a helper can:

- the port is *reserved*, not probed: a connection is made to it and closed from its side, so
  it sits in TIME_WAIT for about a minute. Meanwhile the kernel will not hand it to a bind(0)
  or to an outgoing connection (in this process or any other), while a server that sets
  SO_REUSEADDR (mosquitto, aiohttp, Python's socketserver all do) can still listen on it;
- it never hands out the same port twice in one process, even after the reservation lapsed
  and a server that used it stopped (a broker being restarted on its port, say).

What remains is a process binding that exact number with SO_REUSEADDR in the same minute, so
consumers that can retry do: the broker fixture starts mosquitto again on fresh ports when it
cannot bind (support.broker), and the daemon fixture does the same for its HTTP listener
(support.daemon)."""

from __future__ import annotations

import errno
import socket
import threading

HOST = "127.0.0.1"
_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, reserved as above, new to this process."""
    with _lock:
        for _ in range(100):
            port = _reserve()
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError("no fresh port in 100 tries")


def _reserve() -> int:
    with socket.socket() as listener:
        # As the server will: the TIME_WAIT left below then lets it bind.
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, 0))
        listener.listen(1)
        port = int(listener.getsockname()[1])
        with socket.create_connection((HOST, port)):
            accepted, _ = listener.accept()
            accepted.close()  # closed first, on the listening port's side: it keeps TIME_WAIT
    return port


def in_use(exc: BaseException) -> bool:
    """Whether a server failed to start because its address was taken."""
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
