"""`edged run` as a real subprocess: it comes up with its models warm (a broken one reported,
the others served), and SIGTERM gives an ordered, bounded shutdown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from edged.cli import main
from edged.hardware import host
from edged.ops.client import EdgedClient


class LogReader:
    """Collects a subprocess's stderr lines on a thread so waits can have deadlines. `lines`
    holds those read so far by `wait_for`."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._arrived = threading.Condition()
        self._unread: deque[str] = deque()
        self._ended = False
        assert proc.stderr is not None
        self._stream = stream = proc.stderr

        def pump() -> None:
            for line in stream:
                with self._arrived:
                    self._unread.append(line.rstrip("\n"))
                    self._arrived.notify_all()
            with self._arrived:
                self._ended = True
                self._arrived.notify_all()

        self._thread = threading.Thread(target=pump, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """After the process has exited: the pump reaches EOF, then the pipe is closed."""
        self._thread.join(10)
        self._stream.close()

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        """The next line with `text` in it; AssertionError if the process ends first or none
        comes within `timeout`."""
        found: list[str] = []

        def seen() -> bool:
            while self._unread:
                line = self._unread.popleft()
                self.lines.append(line)
                if text in line:
                    found.append(line)
                    return True
            return self._ended

        with self._arrived:
            self._arrived.wait_for(seen, timeout)
            ended = self._ended
        if found:
            return found[0]
        if ended:
            raise AssertionError(f"process ended before {text!r}:\n" + "\n".join(self.lines))
        raise AssertionError(f"no line with {text!r} in {timeout}s:\n" + "\n".join(self.lines))


@pytest.fixture
def daemon_config(tmp_path: Path, repo_dir: Path, short_dir: Path) -> Path:
    broken = repo_dir / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"\x0a\x03not onnx")
    config = tmp_path / "edged.yaml"
    config.write_text(f"""device_id: test-01
models_dir: {repo_dir}
cache: {{dir: {tmp_path / 'cache'}, preload: [tiny_cls, broken, tiny_cnn]}}
backends: {{onnxruntime: {{providers: [cuda, cpu], intra_op_threads: 1}}}}
api: {{socket: {short_dir / 'edged.sock'}}}
mqtt: {{enabled: false}}
logging: {{level: info}}
""")
    return config


@contextmanager
def daemon(args: list[str], env: dict[str, str] | None = None, *, stopped: str = ""
           ) -> Iterator[tuple[subprocess.Popen[str], LogReader]]:
    """`edged run ARGS` as a subprocess with its log read; SIGTERM at the end of the block
    must stop it with 0 (killed if it did not), its log read up to `stopped` first."""
    proc = subprocess.Popen([sys.executable, "-m", "edged.cli", "run", *args],
                            stderr=subprocess.PIPE, text=True, env=env)
    log = LogReader(proc)
    try:
        yield proc, log
        proc.send_signal(signal.SIGTERM)
        if stopped:
            log.wait_for(stopped, timeout=20)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


def test_daemon_when_started_warms_models_and_stops_in_order_on_sigterm(
        daemon_config: Path) -> None:
    with daemon(["--config", str(daemon_config)], stopped="stopped") as (_proc, log):
        log.wait_for("edged test-01 running")
    text = "\n".join(log.lines)
    assert "tiny_cls:1 ready on onnxruntime (CPUExecutionProvider)" in text
    assert "tiny_cnn:1 ready on onnxruntime" in text
    assert "preload of broken failed" in text and "broken/1/model.onnx: not a valid ONNX" in text
    order = [i for i, line in enumerate(log.lines)
             for key in ("shutting down", "unloaded tiny_cls:1", "stopped") if key in line]
    assert order == sorted(order) and len(order) == 3


def test_daemon_when_config_invalid_exits_one_naming_the_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "edged.yaml"
    config.write_text("device_id: x\nstreams:\n  - {name: a, source: 'rtmp://x', model: m}\n")
    assert main(["run", "--config", str(config)]) == 1
    assert "streams[0].source: unsupported scheme 'rtmp' (line 3)" in capsys.readouterr().err


def test_daemon_when_no_config_file_exists_serves_the_models_dir_on_builtin_defaults(
        repo_dir: Path, short_dir: Path, tmp_path: Path) -> None:
    assert not Path("/etc/edged/edged.yaml").exists()  # this test is about its absence
    sock = short_dir / "d.sock"
    with daemon(["--models-dir", str(repo_dir), "--socket", str(sock), "--cache-dir",
                 str(tmp_path / "cache")]) as (_proc, log):
        line = log.wait_for("no config file")
        assert f"built-in defaults, models in {repo_dir}, the API on {sock}, MQTT off" in line
        log.wait_for("running with 5 model(s)")
        with EdgedClient(sock) as client:
            assert client.ready()
            assert {row["name"] for row in client.models()} >= {"tiny_cls", "colors"}


def test_status_when_no_daemon_listens_names_the_socket_and_says_so(
        short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sock = short_dir / "absent.sock"
    assert main(["status", "--socket", str(sock)]) == 1
    assert capsys.readouterr().err == (
        f"edged: no edged daemon listens on {sock} (No such file or directory): start one "
        "with `edged run`, or name its socket with --socket\n")


@pytest.mark.parametrize("choice", ["auto", "jemalloc", "glibc", None])
def test_daemon_when_jemalloc_is_installed_runs_on_it_unless_glibc_is_asked_for(
        daemon_config: Path, choice: str | None) -> None:
    if host.jemalloc_path() is None:
        pytest.skip("libjemalloc2 is not installed (.ci/run installs it)")
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "MALLOC_CONF", "EDGED_ALLOCATOR", "EDGED_ALLOCATOR_EXEC")}
    with daemon(["--config", str(daemon_config)],
                env={**env, "EDGED_ALLOCATOR": choice} if choice else env) as (proc, log):
        log.wait_for("edged test-01 running")
        # The same process (re-executed in place, as systemd's Type=notify needs), its heap
        # jemalloc's with edged's settings; or glibc's, untouched.
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    text = "\n".join(log.lines)
    if choice != "glibc":  # auto, the default, takes jemalloc where it is installed
        assert "/libjemalloc.so" in maps
        assert f"MALLOC_CONF={host.JEMALLOC_CONF}".encode() in environ
        assert f"C heap: jemalloc ({host.JEMALLOC_CONF})" in text
    else:
        assert "/libjemalloc.so" not in maps and "C heap: glibc" in text
    assert "tiny_cls:1 ready on onnxruntime" in text  # and it serves as before


def test_daemon_when_the_allocator_override_is_unknown_exits_one_saying_which(
        daemon_config: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EDGED_ALLOCATOR", "tcmalloc")
    assert main(["run", "--config", str(daemon_config)]) == 1
    assert "EDGED_ALLOCATOR='tcmalloc': expected one of glibc, jemalloc, auto" in \
        capsys.readouterr().err
