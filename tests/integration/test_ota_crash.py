"""Power cuts during an update: `edged run` as a subprocess SIGKILLs itself as it enters each
install step (the Updater's step hook, set by a launcher this test owns), is started again,
and must serve the old version with no staging leftovers and no half-installed version on
disk."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer
from support.broker import Broker, Subscriber
from support.ota import Pusher, X, expected, statuses, tiny_cls_bytes
from support.polling import wait_until

from edged.model.repository import ModelRepository
from edged.ops.client import EdgedClient
from edged.ota.journal import PENDING

# `edged run`, whose Updater SIGKILLs the process as an install reaches the step in argv[1]
# (a power cut there). The hook is injected here; the daemon itself has no such switch.
CRASHING_EDGED = """
import os, signal, sys
import edged.daemon
from edged.cli import main

def crash_at(step):
    if step == STEP:
        print("test launcher: killing edged at", step, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

class CrashingDaemon(edged.daemon.Daemon):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.updater.step_hook = crash_at

STEP = sys.argv.pop(1)
edged.daemon.Daemon = CrashingDaemon
sys.exit(main(sys.argv[1:]))
"""


def start(config: Path, log: Path, crash_at: str | None = None) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "edged.cli"] if crash_at is None else \
        [sys.executable, "-c", CRASHING_EDGED, crash_at]
    with log.open("ab") as out:
        return subprocess.Popen([*command, "run", "--config", str(config)], stdout=out,
                                stderr=out)


def wait_ready(client: EdgedClient, proc: subprocess.Popen[bytes], log: Path) -> None:
    def ready() -> bool:
        try:
            return client.ready()
        except OSError:  # not listening yet
            return False

    def report() -> str:
        code = proc.poll()
        return ("edged runs" if code is None else f"edged exited {code}") + f":\n{log.read_text()}"

    wait_until(ready, timeout=60, interval=0.1, what="edged ready",
               alive=lambda: proc.poll() is None, details=report)


@pytest.mark.parametrize("step", ["downloading", "verifying", "installing", "warming",
                                  "switched"])
def test_ota_when_killed_at_a_step_serves_the_old_version_after_restart(
        step: str, broker: Broker, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path], repo_dir: Path,
        short_dir: Path, tmp_path: Path) -> None:
    private, public = key
    prefix = f"t/crash/{step}"
    status = f"{prefix}/ota/tiny_cls/status"
    sock = short_dir / "c.sock"
    config = tmp_path / "edged.yaml"
    config.write_text(f"""device_id: crash-{step}
models_dir: {repo_dir}
cache: {{dir: {tmp_path / 'cache'}, preload: [tiny_cls]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {sock}}}
mqtt: {{host: 127.0.0.1, port: {broker.port}, prefix: {prefix}}}
ota: {{trusted_keys: [{public}]}}
""")
    log = tmp_path / "edged.log"
    sub = Subscriber(broker, status)
    client = EdgedClient(sock, timeout_s=10)
    proc = start(config, log, crash_at=step)
    try:
        wait_ready(client, proc, log)
        pusher = Pusher(sub, artifacts, private)

        def pushed_and_gone() -> bool:
            pusher.push(f"{prefix}/ota/tiny_cls", 2, tiny_cls_bytes(1))
            try:
                proc.wait(0.5)
            except subprocess.TimeoutExpired:
                return False
            return True

        # Until its subscription is in place and the update starts; the kill may come before
        # its `received` status leaves, as in a real power cut. Each try waits half a second.
        wait_until(pushed_and_gone, timeout=50, interval=0, what=f"edged killed at {step}",
                   details=log.read_text)
        assert proc.wait(30) == -9, log.read_text()  # the power cut
        client.close()
        proc = start(config, log)
        wait_ready(client, proc, log)
        np.testing.assert_allclose(client.infer("tiny_cls", {"x": X}).outputs["prob"],
                                   expected(0), rtol=1e-5)
        repo = ModelRepository(repo_dir)
        assert repo.versions_on_disk("tiny_cls") == [1]
        assert repo.default_version("tiny_cls") == 1
        assert not list(repo.staging_dir().iterdir())
        assert not (repo_dir / "tiny_cls" / PENDING).exists()
        if step in ("warming", "switched"):  # a version was on disk: recovery says so
            event = statuses(sub, status, "rolled_back")[-1]
            assert event["reason"] == "interrupted" and event["version"] == 2
        # and the same update, pushed again, now goes through
        pusher.push_until_received(f"{prefix}/ota/tiny_cls", status, 2, tiny_cls_bytes(1))
        assert statuses(sub, status, "active")[-1]["version"] == 2
        np.testing.assert_allclose(client.infer("tiny_cls", {"x": X}).outputs["prob"],
                                   expected(1), rtol=1e-5)
    finally:
        client.close()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        sub.close()
