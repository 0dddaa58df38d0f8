"""`edged run` under a stand-in for systemd: a test-owned NOTIFY_SOCKET receiver sees READY,
STATUS, WATCHDOG, RELOADING and STOPPING in order; SIGHUP reloads streams without touching
the others; a stuck model worker stops the watchdog pings; the API socket can be passed in by
socket activation (LISTEN_FDS)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.daemon import ServeFactory
from support.notify import NotifyReceiver, has
from support.polling import wait_until

from edged.ops.client import EdgedClient
from edged.service.systemd import Notifier
from tools.assets.demo import write_color_video

X = np.zeros((1, 3, 8, 8), np.float32)


def stream(name: str, video: Path) -> str:
    return (f"  - {{name: {name}, source: 'file://{video}', model: colors, loop: true, "
            f"fps: 20}}\n")


def write_config(path: Path, repo_dir: Path, cache: Path, sock: Path, streams: str) -> None:
    path.write_text(f"""device_id: sd-test
models_dir: {repo_dir}
cache: {{dir: {cache}, preload: [colors]}}
backends: {{onnxruntime: {{providers: [cpu], intra_op_threads: 1}}}}
api: {{socket: {sock}}}
mqtt: {{enabled: false}}
logging: {{target: stderr}}
streams:
{streams or "  []"}
""")


class Run:
    """`edged run` as systemd would start it (NOTIFY_SOCKET, WATCHDOG_USEC, maybe LISTEN_*),
    its output in a log file that failures print."""

    def __init__(self, config: Path, log: Path, env: dict[str, str],
                 pass_fd: int | None = None) -> None:
        self.log = log
        full_env = {**os.environ, **env}
        command = [sys.executable, "-m", "edged.cli", "run", "--config", str(config)]
        with log.open("ab") as out:
            if pass_fd is None:
                self.proc = subprocess.Popen(command, stdout=out, stderr=out, env=full_env)
            else:  # as systemd passes a socket: at fd 3, LISTEN_PID naming the daemon itself
                script = (f"exec 3<&{pass_fd} {pass_fd}<&-; export LISTEN_PID=$$ LISTEN_FDS=1 "
                          'LISTEN_FDNAMES=api; exec "$@"')
                self.proc = subprocess.Popen(["bash", "-c", script, "edged", *command],
                                             stdout=out, stderr=out, env=full_env,
                                             pass_fds=[pass_fd])

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def running(self) -> bool:
        return self.proc.poll() is None

    def report(self) -> str:
        """What a failed wait prints: how edged ended, if it did, and its output."""
        code = self.proc.poll()
        return ("edged runs" if code is None else f"edged exited {code}") + f":\n{self.output()}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"edged did not stop on SIGTERM:\n{self.output()}") from None


@pytest.fixture
def receiver(short_dir: Path) -> Iterator[NotifyReceiver]:
    r = NotifyReceiver(short_dir / "notify")
    yield r
    r.close()


def streams_of(client: EdgedClient) -> dict[str, dict[str, Any]]:
    return client.status()["streams"]


def test_run_under_systemd_notifies_in_order_and_reloads_streams_on_sighup(
        receiver: NotifyReceiver, repo_dir: Path, short_dir: Path, tmp_path: Path) -> None:
    videos = {name: write_color_video(tmp_path / f"{name}.avi", fps=20, frames_per_color=5,
                                      cycles=2) for name in ("a", "b", "c")}
    config, sock = tmp_path / "edged.yaml", short_dir / "api.sock"
    write_config(config, repo_dir, tmp_path / "cache", sock,
                 stream("a", videos["a"]) + stream("b", videos["b"]))
    run = Run(config, tmp_path / "edged.log",
              {"NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "400000"})
    try:
        found = receiver.wait_for(has("READY", "1"), 60)
        assert found, f"no READY=1:\n{run.output()}"
        ready_at, ready = found
        assert ready_at > 0 and all("STATUS" in m and "READY" not in m
                                    for m in receiver.messages[:ready_at])
        assert receiver.messages[0]["STATUS"] == "starting: opening the API socket"
        assert "1 model(s) ready (colors:1)" in ready["STATUS"]
        # READY came after the socket listened and the preloaded model was warm.
        with EdgedClient(sock, timeout_s=30) as client:
            assert client.ready()
            assert receiver.wait_for(has("WATCHDOG", "1"), 5, after=ready_at)
            assert receiver.wait_for(lambda m: "streams 2/2 up" in m.get("STATUS", ""), 30,
                                     after=ready_at), f"no streams-up status:\n{run.output()}"
            wait_until(lambda: streams_of(client)["b"]["processed"] >= 10, timeout=30,
                       interval=0.05, what="stream b processed frames", alive=run.running,
                       details=run.report)
            b_before = streams_of(client)["b"]

            # Reload: a goes, c comes, b is not touched.
            write_config(config, repo_dir, tmp_path / "cache", sock,
                         stream("b", videos["b"]) + stream("c", videos["c"]))
            mark = len(receiver)
            run.proc.send_signal(signal.SIGHUP)
            hup_sent = time.monotonic()
            found = receiver.wait_for(has("RELOADING", "1"), 30, after=mark)
            assert found, f"no RELOADING=1:\n{run.output()}"
            reloading_at, reloading = found
            now_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            assert 0 < now_usec - int(reloading["MONOTONIC_USEC"]) < 30_000_000
            assert receiver.wait_for(has("READY", "1"), 30, after=reloading_at), run.output()
            streams = wait_until(lambda: (s := streams_of(client)).get("c", {}).get(
                                     "processed", 0) > 0 and s, timeout=30, interval=0.05,
                                 what="c streaming after the reload", alive=run.running,
                                 details=run.report)
            assert set(streams) == {"b", "c"}
            # Same pipeline, still counting on from before: a restarted one would report a run
            # time shorter than the time since SIGHUP (and count from zero).
            # Frames already queued can be processed with no new capture yet: wait for both.
            b_after = wait_until(lambda: (b := streams_of(client)["b"])["processed"]
                                 > b_before["processed"]
                                 and b["frames_in"] > b_before["frames_in"] and b,
                                 timeout=30, interval=0.05,
                                 what="b still counting after the reload", alive=run.running,
                                 details=run.report)
            assert b_after["running_s"] > time.monotonic() - hup_sent
            assert b_after["frames_in"] > b_before["frames_in"]
            assert b_after["reconnects"] == b_before["reconnects"]

            # A config with an error changes nothing and the daemon goes on.
            config.write_text(config.read_text().replace("fps: 20", "fps: -1", 1))
            mark = len(receiver)
            run.proc.send_signal(signal.SIGHUP)
            found = receiver.wait_for(has("READY", "1"), 30, after=mark)
            assert found and found[1]["STATUS"].startswith("reload failed (")
            assert "streams[0].fps: must be >= 0.01" in found[1]["STATUS"]
            report = client.status()
            assert set(report["streams"]) == {"b", "c"}
            assert report["reloads"] == {"ok": 1, "failed": 1}
            assert client.ready()
        mark = len(receiver)
        assert run.stop() == 0, run.output()
        stopping = receiver.wait_for(has("STOPPING", "1"), 5, after=mark)
        assert stopping, f"no STOPPING=1:\n{run.output()}"
        assert not any("READY" in m for m in receiver.messages[stopping[0]:])
        assert "reload: stream a stopped" in run.output()
    finally:
        run.stop()


def test_daemon_when_a_model_worker_is_stuck_stops_watchdog_pings_until_it_moves(
        gate: Any, receiver: NotifyReceiver, make_served: ServeFactory) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": receiver.address, "WATCHDOG_USEC": "200000"})
    served = make_served(health="stall_after_s: 0.6", notifier=notifier)
    assert receiver.wait_for(has("READY", "1"), 10)
    pinging = receiver.wait_for(has("WATCHDOG", "1"), 5)
    assert pinging is not None
    gate.gate.clear()  # the next inference call hangs in the backend
    result: dict[str, Any] = {}

    def call() -> None:
        with served.client() as client:
            result["outputs"] = client.infer("tiny_cls", {"x": X}).outputs

    caller = threading.Thread(target=call)
    caller.start()
    try:
        gate.wait_calls(1)
        stuck = receiver.wait_for(lambda m: m.get("STATUS", "").startswith("STUCK"), 10)
        assert stuck is not None
        assert "model tiny_cls: 1 request(s) waiting" in stuck[1]["STATUS"]
        # No ping from then on: systemd's watchdog would fire and restart the service.
        assert receiver.wait_for(has("WATCHDOG", "1"), 1.5, after=stuck[0]) is None
        with served.client() as client:
            status, _headers, raw = client.request("GET", "/v2/health/live")
            assert status == 503 and b"no batch finished" in raw
            assert not client.ready()
            report = client.status()
            assert not report["live"] and report["queues"]["tiny_cls"]["pending"] == 1
        mark = len(receiver)
    finally:
        gate.gate.set()
        caller.join(15)
    assert "outputs" in result  # the stuck request itself finished once the worker moved
    assert receiver.wait_for(has("WATCHDOG", "1"), 5, after=mark) is not None
    with served.client() as client:
        assert client.live() and client.ready()


def test_run_when_systemd_passes_the_api_socket_serves_it_and_leaves_it(
        repo_dir: Path, short_dir: Path, tmp_path: Path) -> None:
    activated = short_dir / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(activated))
    listener.listen(16)
    config, configured = tmp_path / "edged.yaml", short_dir / "configured.sock"
    write_config(config, repo_dir, tmp_path / "cache", configured, "")
    # A caller that connects before the daemon runs is queued by the kernel, not refused:
    # socket activation's promise.
    early = EdgedClient(activated, timeout_s=60)
    early_result: dict[str, Any] = {}
    early_call = threading.Thread(
        target=lambda: early_result.update(ready=early.live()), daemon=True)
    early_call.start()
    runs = []
    try:
        for attempt in range(2):  # a restart takes over the same socket
            run = Run(config, tmp_path / f"edged-{attempt}.log", {}, pass_fd=listener.fileno())
            runs.append(run)
            with EdgedClient(activated, timeout_s=60) as client:
                wait_until(client.ready, timeout=60, interval=0.05,
                           what="ready on the passed socket", alive=run.running,
                           details=run.report)
                outputs = client.infer("tiny_cls", {"x": X}).outputs
                assert outputs["prob"].shape == (1, 4)
            assert not configured.exists()  # it never bound its own
            assert "socket activation" in run.output()
            early_call.join(30)
            assert early_result == {"ready": True}
            assert run.stop() == 0, run.output()
            assert activated.exists()  # systemd's file: left in place
    finally:
        early.close()
        for run in runs:
            run.stop()
        listener.close()


def test_cli_status_when_the_daemon_runs_prints_one_screen(
        make_served: ServeFactory, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edged.cli import main

    video = write_color_video(tmp_path / "cam.avi", fps=20, frames_per_color=5)
    served = make_served(cache="preload: [colors]", streams=(
        f"[{{name: cam, source: 'file://{video}', model: colors, loop: true}}]"))
    with served.client() as client:
        wait_until(lambda: streams_of(client)["cam"]["processed"] > 0, timeout=30,
                   interval=0.05, what="cam processed a frame")
    assert main(["status", "--socket", str(served.socket)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert lines[0].startswith("edged ") and ": live, ready, up " in lines[0]
    assert any(line.startswith("colors:1") and "READY" in line for line in lines)
    assert any(line.startswith("cam ") and "colors" in line for line in lines)
    assert "mqtt: disabled" in text and "process: rss " in text
    assert len(lines) < 40  # one screen
    assert main(["status", "--socket", str(served.socket), "--json"]) == 0
    assert '"live": true' in capsys.readouterr().out
