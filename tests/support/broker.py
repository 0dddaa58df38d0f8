"""A private mosquitto for the test session: one plain listener and one with TLS and a
password, on free ports, its own config, certificates made with openssl, persistence on (so a
restart keeps subscribers' sessions). Plus `Subscriber`, a real paho client that collects.

mosquitto takes its ports from its config file, so they are picked before it binds them
(support.ports); if one was taken meanwhile it exits saying so, and the fixture starts it again
on fresh ports, a bounded number of times. A restart within the session (tests stop and start
the broker) keeps its ports, which clients reconnect to: there a taken port is an error."""

from __future__ import annotations

import getpass
import json
import queue
import re
import shutil
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from support.polling import wait_until
from support.ports import free_port

USERNAME, PASSWORD = "edged", "s3cret-pass"


START_TRIES = 3  # fresh ports each time
RUNNING = re.compile(r"mosquitto version \S+ running")  # logged once every listener is open


class PortTaken(RuntimeError):
    """mosquitto could not listen: one of its ports was taken before it bound it."""


def make_certificates(directory: Path) -> None:
    """A throwaway CA and a server certificate for 127.0.0.1 (SAN IP), signed by it."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=edged test CA", "-keyout", "ca.key", "-out", "ca.crt")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt")


@dataclass
class Broker:
    directory: Path
    port: int
    tls_port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def password_file(self) -> Path:
        return self.directory / "client-password"

    def write_config(self) -> None:
        d = self.directory
        subprocess.run(["mosquitto_passwd", "-c", "-b", str(d / "passwd"), USERNAME, PASSWORD],
                       check=True, capture_output=True)
        self.password_file.write_text(PASSWORD + "\n")
        (d / "mosquitto.conf").write_text(f"""per_listener_settings true
persistence true
persistence_location {d}/
autosave_interval 1
user {getpass.getuser()}
log_dest file {d}/mosquitto.log
log_type all
listener {self.port} 127.0.0.1
allow_anonymous true
listener {self.tls_port} 127.0.0.1
allow_anonymous false
password_file {d}/passwd
cafile {d}/ca.crt
certfile {d}/server.crt
keyfile {d}/server.key
""")

    def start(self) -> None:
        """Start mosquitto and wait (bounded) until it says it runs, both listeners open; a
        connection test would not do, it could reach whoever took a port. PortTaken when one
        of its ports was taken."""
        logs = [self.directory / "mosquitto.log", self.directory / "stderr.log"]
        offsets = [path.stat().st_size if path.exists() else 0 for path in logs]

        def output() -> str:  # what this start has written (a restart appends to the logs)
            return "".join(path.read_bytes()[offset:].decode(errors="replace")
                           for path, offset in zip(logs, offsets, strict=True) if path.exists())

        with logs[1].open("ab") as stderr:
            self.process = process = subprocess.Popen(
                ["mosquitto", "-c", str(self.directory / "mosquitto.conf")],
                stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_until(lambda: RUNNING.search(output()), timeout=10, interval=0.05,
                       what="mosquitto running", alive=lambda: process.poll() is None,
                       details=output)
        except AssertionError:
            self.stop()
            if "Address already in use" in output():
                raise PortTaken(f"mosquitto could not listen on port {self.port} or "
                                f"{self.tls_port}:\n{output()}") from None
            raise

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()  # SIGTERM: it saves its persistence file first
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    if shutil.which("mosquitto") is None or shutil.which("mosquitto_passwd") is None:
        pytest.skip("mosquitto is not installed (apt-get install mosquitto)")
    directory = tmp_path_factory.mktemp("mosquitto")
    make_certificates(directory)
    instance = start_on_free_ports(directory)
    try:
        yield instance
    finally:
        instance.stop()


def start_on_free_ports(directory: Path) -> Broker:
    """mosquitto on fresh ports; on others again, up to START_TRIES, when one was taken."""
    for attempt in range(1, START_TRIES + 1):
        instance = Broker(directory, free_port(), free_port())
        instance.write_config()
        try:
            instance.start()
            return instance
        except PortTaken:
            if attempt == START_TRIES:
                raise
    raise AssertionError("unreachable: the last try returns or raises")


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retain: bool
    qos: int


class Subscriber:
    """A real MQTT client that keeps what arrives on `topics`, in order, for the test to read:
    `get` the next message, `wait_for` the next on one topic, `collect` messages until a
    condition over them holds. What a read passes over is gone, as from a queue. Reads wait
    (bounded) on a condition the client's thread signals. `persistent` keeps its session on
    the broker across disconnects (MQTT 5 session expiry)."""

    def __init__(self, broker: Broker, *topics: str, client_id: str | None = None,
                 persistent: bool = False) -> None:
        self._arrived = threading.Condition()
        self._unread: deque[Received] = deque()
        self.client = paho.Client(CallbackAPIVersion.VERSION2,
                                  client_id=client_id or f"sub-{time.monotonic_ns()}",
                                  protocol=paho.MQTTv5)
        self._topics = topics
        self._subscribed = queue.Queue[int]()
        self.client.on_message = self._on_message
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda c, u, mid, codes, p: self._subscribed.put(mid)
        props = Properties(PacketTypes.CONNECT)
        if persistent:
            props.SessionExpiryInterval = 3600
        self.client.connect("127.0.0.1", broker.port, clean_start=not persistent,
                            properties=props)
        self.client.loop_start()
        self._subscribed.get(timeout=10)

    def _on_connect(self, client: paho.Client, userdata: object, flags: object, reason: object,
                    properties: object) -> None:
        client.subscribe([(topic, 1) for topic in self._topics])

    def _on_message(self, client: paho.Client, userdata: object,
                    message: paho.MQTTMessage) -> None:
        with self._arrived:
            self._unread.append(Received(message.topic, message.payload, bool(message.retain),
                                         message.qos))
            self._arrived.notify_all()

    def get(self, timeout: float = 10.0) -> Received:
        """The next message, on any topic; queue.Empty if none comes within `timeout`."""
        done, got = self._read((), lambda got: True, timeout)
        if not done:
            raise queue.Empty
        return got[-1]

    def wait_for(self, topic: str, timeout: float = 10.0) -> Received:
        """The next message on `topic` (others that arrive first are dropped); queue.Empty if
        none comes within `timeout`."""
        done, got = self._read((topic,), lambda got: True, timeout)
        if not done:
            raise queue.Empty
        return got[-1]

    def collect(self, *topics: str, until: Callable[[list[Received]], bool],
                timeout: float = 10.0, what: str = "") -> list[Received]:
        """The messages on `topics` (any topic when none is named) from the next one on, up to
        the first after which `until(those so far)` holds; messages on other topics are
        dropped. `until` is asked once per message, the newest last in the list. Raises
        AssertionError naming `what` and what came if that takes longer than `timeout`."""
        done, got = self._read(topics, until, timeout)
        if not done:
            seen = "; ".join(f"{m.topic} {m.payload[:200]!r}" for m in got[-3:])
            raise AssertionError(f"not within {timeout:g} s: {what or 'messages'} on "
                                 f"{', '.join(topics) or 'any topic'} ({len(got)} came, "
                                 f"the last: {seen or 'none'})")
        return got

    def _read(self, topics: tuple[str, ...], until: Callable[[list[Received]], bool],
              timeout: float) -> tuple[bool, list[Received]]:
        got: list[Received] = []

        def done() -> bool:
            while self._unread:
                message = self._unread.popleft()
                if not topics or message.topic in topics:
                    got.append(message)
                    if until(got):
                        return True
            return False

        with self._arrived:
            return self._arrived.wait_for(done, timeout), got

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def retained_json(broker: Broker, topic: str) -> dict[str, Any]:
    """The JSON the broker keeps on `topic`, as a subscriber that comes later gets it (and it
    came retained)."""
    late = Subscriber(broker, topic)
    try:
        [kept] = late.collect(until=lambda got: len(got) >= 1, timeout=10,
                              what=f"the retained {topic}")
    finally:
        late.close()
    assert kept.retain, f"{topic}: not a retained message"
    return dict(json.loads(kept.payload))

