"""A TCP relay on 127.0.0.1 that stands for the network between a site broker's bridge and the
fleet broker: both brokers keep running while a test cuts the link (every relayed connection
closed, and each new one closed as it comes, as a dead uplink answers) and restores it. Bytes
pass through untouched (TLS end to end). Its port is the one it bound (no race), its threads
stop by themselves (bounded waits) once it is closed."""

from __future__ import annotations

import contextlib
import select
import socket
import threading

HOST = "127.0.0.1"
WAIT_S = 0.2  # every blocking call of its threads returns within this, to see a stop


class Relay:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._server = socket.create_server((HOST, 0))
        self._server.settimeout(WAIT_S)
        self.port: int = self._server.getsockname()[1]
        self._up = threading.Event()
        self._up.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._links: set[tuple[socket.socket, socket.socket]] = set()
        self.relayed = 0  # connections passed through to the target
        self._threads = [threading.Thread(target=self._accept, name="relay-accept",
                                          daemon=True)]
        self._threads[0].start()

    def cut(self) -> None:
        """The link goes down: what is connected is closed, what connects is refused."""
        self._up.clear()
        with self._lock:
            links, self._links = self._links, set()
        for link in links:
            _close(*link)

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self._closed.set()
        self.cut()
        self._server.close()
        for thread in self._threads:
            thread.join(5)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            if not self._up.is_set():
                _close(client)
                continue
            try:
                upstream = socket.create_connection((HOST, self.target_port), timeout=2)
            except OSError:  # the target is down: as the far end of a link would answer
                _close(client)
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            link = (client, upstream)
            with self._lock:
                self._links.add(link)
                self.relayed += 1
            thread = threading.Thread(target=self._pump, args=link, name="relay-pump",
                                      daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        other = {client: upstream, upstream: client}
        try:
            while not self._closed.is_set():
                readable, _, _ = select.select([client, upstream], [], [], WAIT_S)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    other[sock].sendall(data)
        except (OSError, ValueError):  # cut: the sockets were closed under it
            return
        finally:
            with self._lock:
                self._links.discard((client, upstream))
            _close(client, upstream)


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
