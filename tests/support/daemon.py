"""The daemon served in-process on a thread, on a short Unix socket path and a loopback port,
over the generated tiny model repository: `make_served` starts one per call (config extras as
YAML snippets), `served` is one with the defaults.

The loopback port is picked before the daemon binds it (support.ports); a daemon that finds it
taken is started again on a fresh one, a bounded number of times."""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from edged.config import DaemonConfig, parse_config
from edged.daemon import Daemon
from edged.ops.client import EdgedClient
from support.ports import free_port, in_use

START_TRIES = 3  # fresh loopback ports each time
LOOP_THREAD = "edged-test-daemon"  # the thread serve() runs the daemon's event loop on


@dataclass
class Served:
    daemon: Daemon
    socket: Path
    http: str  # HOST:PORT of the loopback listener

    def client(self) -> EdgedClient:
        return EdgedClient(self.socket, timeout_s=30)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must fit 107 bytes; pytest's tmp_path may not."""
    path = Path(tempfile.mkdtemp(prefix="ed-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def serve(config: DaemonConfig, **daemon_args: Any) -> Iterator[Daemon]:
    """Run a Daemon on a thread until the block ends; fails if it is not ready in 30 s."""
    daemon = Daemon(config, **daemon_args)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(daemon.main(handle_signals=False))
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)
            daemon.ready_event.set()

    thread = threading.Thread(target=run, name=LOOP_THREAD, daemon=True)
    thread.start()
    try:
        assert daemon.ready_event.wait(30), "daemon not ready in 30 s"
        if errors:
            raise errors[0]
        yield daemon
    finally:
        daemon.request_stop()
        thread.join(30)
        assert not thread.is_alive(), "daemon did not stop in 30 s"


ServeFactory = Callable[..., Served]


@pytest.fixture
def make_served(repo_dir: Path, short_dir: Path, tmp_path: Path) -> Iterator[ServeFactory]:
    """Start a daemon with extra YAML for `api:`, `cache:`, `mqtt:` (off unless given),
    `streams:`, `ota:`, `health:`, `recording:`, `faces:` and `describer:`, optionally its own
    device id and models folder, and Daemon arguments (a Notifier); stopped after the test."""
    stack: list[Iterator[Daemon]] = []

    def start(api: str = "", cache: str = "preload: [tiny_cls]",
              sock_name: str | None = None, mqtt: str = "enabled: false",
              streams: str = "[]", ota: str = "", device_id: str = "test",
              models_dir: Path | None = None, health: str = "", recording: str = "",
              faces: str = "", describer: str = "", **daemon_args: Any) -> Served:
        sock = short_dir / (sock_name or f"s{len(stack)}.sock")
        for attempt in range(1, START_TRIES + 1):
            port = free_port()
            config = parse_config(f"""device_id: {device_id}
models_dir: {models_dir or repo_dir}
cache: {{dir: {tmp_path / f'cache-{len(stack)}'}, {cache}}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {sock}, http: "127.0.0.1:{port}", {api}}}
mqtt: {{{mqtt}}}
streams: {streams}
ota: {{{ota}}}
health: {{{health}}}
recording: {{dir: {tmp_path / f'recordings-{len(stack)}'}, {recording}}}
faces: {{{faces}}}
describer: {{{describer}}}
""")
            running = serve(config, **daemon_args)
            try:
                daemon = next(running)
            except OSError as exc:
                if in_use(exc) and attempt < START_TRIES:
                    continue  # the port was taken between picking and binding
                raise
            stack.append(running)
            return Served(daemon, sock, f"127.0.0.1:{port}")
        raise AssertionError("unreachable: the last try returns or raises")

    try:
        yield start
    finally:
        for running in reversed(stack):
            next(running, None)


@pytest.fixture
def restore_log_level() -> Iterator[None]:
    """The daemon runs in the test's process: a log level a request set is undone after."""
    root = logging.getLogger()
    level = root.level
    yield
    root.setLevel(level)


@pytest.fixture
def served(make_served: ServeFactory) -> Served:
    return make_served()




def decode_threads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the threads the API decodes each infer request on, as they come (to tell
    a decode on the event loop, LOOP_THREAD, from one handed to a worker)."""
    from edged.api import kserve as kserve_module

    return record_threads(monkeypatch, kserve_module, "decode_request")


def record_threads(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[str]:
    """The names of the threads `module.name` is called on, as they come."""
    real = getattr(module, name)
    threads: list[str] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, recording)
    return threads
