"""An MQTT broker for benchmarks: a private mosquitto on a free loopback port when the binary
is installed, else the one at 127.0.0.1:1883 when something listens there."""

from __future__ import annotations

import getpass
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SHARED = ("127.0.0.1", 1883)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


@contextmanager
def loopback_broker(workdir: Path) -> Iterator[tuple[int, str]]:
    """Yields (port, what it is); raises RuntimeError when there is no broker to be had."""
    if shutil.which("mosquitto") is None:
        if _listening(SHARED[1]):
            yield SHARED[1], "mosquitto at 127.0.0.1:1883"
            return
        raise RuntimeError("no MQTT broker: install mosquitto (apt-get install mosquitto)")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = workdir / "mosquitto.conf"
    # `user`: started as root, mosquitto would otherwise switch to its own user.
    config.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                      f"user {getpass.getuser()}\nmax_queued_messages 10000\n")
    with (workdir / "mosquitto.log").open("wb") as log:
        process = subprocess.Popen(["mosquitto", "-c", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 10
        while not _listening(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("private mosquitto did not start: "
                                   + (workdir / "mosquitto.log").read_text())
            time.sleep(0.05)
        yield port, "private mosquitto"
    finally:
        stop_process(process, 10)


def stop_process(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `timeout_s`."""
    process.terminate()
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


class RestartableBroker:
    """A private mosquitto on one loopback port that can be stopped and started again (the
    soak's broker outage); a context manager that stops it at the end."""

    def __init__(self, workdir: Path) -> None:
        if shutil.which("mosquitto") is None:
            raise RuntimeError("no MQTT broker: install mosquitto (apt-get install mosquitto)")
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.port = free_port()
        self.config = workdir / "mosquitto.conf"
        self.config.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                               f"persistence false\nuser {getpass.getuser()}\n"
                               "max_queued_messages 10000\n")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.workdir / "mosquitto.log").open("ab") as log:
            self.process = subprocess.Popen(["mosquitto", "-c", str(self.config)],
                                            stdout=log, stderr=log)
        deadline = time.monotonic() + 10
        while not _listening(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("private mosquitto did not start: "
                                   + (self.workdir / "mosquitto.log").read_text()[-2000:])
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process, 10)
            self.process = None

    def __enter__(self) -> RestartableBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
