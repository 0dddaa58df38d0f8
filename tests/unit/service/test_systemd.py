"""sd_notify, socket activation and journald logging, each against a test-owned socket that
plays systemd's part."""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.notify import NotifyReceiver, has

from edged.service import systemd
from edged.service.systemd import JournalHandler, Notifier, encode_fields, listen_fds, setup_logging


@pytest.fixture
def receiver(short_dir: Path) -> Iterator[NotifyReceiver]:
    r = NotifyReceiver(short_dir / "notify")
    yield r
    r.close()


def test_notifier_when_no_notify_socket_does_nothing() -> None:
    notifier = Notifier({})
    assert not notifier.enabled
    assert notifier.ready("x") is False and notifier.watchdog() is False
    assert notifier.watchdog_s is None


def test_notifier_when_systemd_listens_sends_each_state_in_order(
        receiver: NotifyReceiver) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": receiver.address})
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert notifier.status("starting:\n loading  models")
    assert notifier.ready("2 model(s) ready")
    assert notifier.watchdog()
    assert notifier.reloading()
    assert notifier.stopping()
    assert notifier.extend_timeout(90)
    assert receiver.wait_for(has("EXTEND_TIMEOUT_USEC"), 5) is not None
    status, ready, ping, reloading, stopping, extend = receiver.messages
    assert status == {"STATUS": "starting: loading models"}  # one line for systemctl status
    assert ready == {"READY": "1", "STATUS": "2 model(s) ready"}
    assert ping == {"WATCHDOG": "1"}
    assert reloading["RELOADING"] == "1"
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    assert before <= int(reloading["MONOTONIC_USEC"]) <= after  # CLOCK_MONOTONIC, as systemd
    assert stopping["STOPPING"] == "1"
    assert extend == {"EXTEND_TIMEOUT_USEC": "90000000"}
    notifier.close()


def test_notifier_when_the_socket_is_abstract_sends_to_the_abstract_name() -> None:
    name = f"edged-test-{os.getpid()}-{time.monotonic_ns()}"
    receiver = NotifyReceiver(abstract=name)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.ready("ok")
        assert receiver.wait_for(has("READY", "1"), 5) is not None
        notifier.close()
    finally:
        receiver.close()


def test_notifier_when_systemd_is_gone_warns_once_and_never_raises(
        short_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(short_dir / "nobody")})
    with caplog.at_level(logging.WARNING, "edged.service.systemd"):
        assert notifier.watchdog() is False
        assert notifier.watchdog() is False
    notifier.close()
    assert len([r for r in caplog.records if "cannot notify" in r.message]) == 1
    assert Notifier({"NOTIFY_SOCKET": "vsock:2:1234"}).ready("x") is False


@pytest.mark.parametrize(("env", "expected"), [
    ({"WATCHDOG_USEC": "30000000"}, 30.0),
    ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": str(os.getpid())}, 0.5),
    ({"WATCHDOG_USEC": "500000", "WATCHDOG_PID": "1"}, None),  # meant for another process
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "soon"}, None),
    ({}, None),
])
def test_notifier_watchdog_interval_when_set_by_systemd_is_read_for_this_process_only(
        env: dict[str, str], expected: float | None) -> None:
    assert Notifier(env).watchdog_s == expected


# -- socket activation -----------------------------------------------------------------------
ACTIVATED = """
import json, os, socket
from edged.service.systemd import listen_fds
found = listen_fds()
print(json.dumps({name: [[s.fileno(), s.family == socket.AF_UNIX, s.getsockname()]
                         for s in socks] for name, socks in found.items()}))
print(json.dumps({k: os.environ.get(k) for k in ("LISTEN_PID", "LISTEN_FDS")}))
"""


def _activated_child(fds: list[int], names: str, pid: str = "$$") -> list[str]:
    """Run ACTIVATED as systemd would start it: the sockets at fd 3, 4, ... and LISTEN_*."""
    moves = " ".join(f"{3 + i}<&{fd}" for i, fd in enumerate(fds))
    script = (f"exec {moves}; export LISTEN_PID={pid} LISTEN_FDS={len(fds)} "
              f"LISTEN_FDNAMES={names}; exec {sys.executable} -c \"$0\"")
    out = subprocess.run(["bash", "-c", script, ACTIVATED], pass_fds=fds, capture_output=True,
                         text=True, timeout=60, check=True)
    return out.stdout.splitlines()


def test_listen_fds_when_systemd_passes_sockets_finds_them_by_name(short_dir: Path) -> None:
    import json

    api = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    api.bind(str(short_dir / "api.sock"))
    api.listen()
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    with api, tcp:
        found, env = map(json.loads, _activated_child([api.fileno(), tcp.fileno()], "api:http"))
    assert found["api"] == [[3, True, str(short_dir / "api.sock")]]
    assert found["http"][0][:2] == [4, False]
    assert env == {"LISTEN_PID": None, "LISTEN_FDS": None}  # not passed on to children


def test_listen_fds_when_meant_for_another_process_takes_none(short_dir: Path) -> None:
    import json

    api = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    api.bind(str(short_dir / "api.sock"))
    api.listen()
    with api:
        found, _env = map(json.loads, _activated_child([api.fileno()], "api", pid="1"))
    assert found == {}


def test_listen_fds_when_nothing_was_passed_is_empty() -> None:
    env = {"LISTEN_FDS": "1"}  # no LISTEN_PID: not from systemd
    assert listen_fds(env) == {}
    assert env == {}


def test_activated_unix_socket_when_several_picks_the_named_unix_stream() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with a, b, dgram:
        assert systemd.activated_unix_socket({"api": [dgram, a]}, "api") is a
        assert systemd.activated_unix_socket({"unknown": [b]}, "api") is b  # unnamed: the one
        assert systemd.activated_unix_socket({"other": [a]}, "api") is None


# -- journald ---------------------------------------------------------------------------------
def parse_journal(data: bytes) -> dict[str, str]:
    """journald's native datagram format, both the plain and the length-prefixed form."""
    fields: dict[str, str] = {}
    i = 0
    while i < len(data):
        end = data.index(b"\n", i)
        line = data[i:end]
        if b"=" in line:
            key, _sep, value = line.partition(b"=")
            fields[key.decode()] = value.decode()
            i = end + 1
        else:
            (size,) = struct.unpack("<Q", data[end + 1:end + 9])
            fields[line.decode()] = data[end + 9:end + 9 + size].decode()
            assert data[end + 9 + size:end + 10 + size] == b"\n"
            i = end + 10 + size
    return fields


@pytest.fixture
def journal(short_dir: Path) -> Iterator[tuple[Path, socket.socket]]:
    path = short_dir / "journal"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield path, sock
    sock.close()


def test_journal_handler_when_a_record_has_fields_sends_them_structured(
        journal: tuple[Path, socket.socket]) -> None:
    path, sock = journal
    handler = JournalHandler(path)
    log = logging.getLogger("edged.test.journal")
    log.addHandler(handler)
    log.propagate = False
    try:
        log.warning("stream %s: frame %d failed", "cam", 7,
                    extra={"stream": "cam", "model": "colors", "code": "inference_failed"})
        try:
            raise ValueError("bad\nframe")
        except ValueError:
            log.exception("model %s failed", "colors", extra={"model": "colors"})
        first = parse_journal(sock.recv(65536))
        second = parse_journal(sock.recv(65536))
    finally:
        log.removeHandler(handler)
        log.propagate = True
        handler.close()
    assert first["MESSAGE"] == "stream cam: frame 7 failed"
    assert (first["PRIORITY"], first["SYSLOG_IDENTIFIER"], first["LOGGER"]) == \
        ("4", "edged", "edged.test.journal")
    assert (first["STREAM"], first["MODEL"], first["CODE"]) == ("cam", "colors",
                                                              "inference_failed")
    assert first["CODE_FILE"].endswith("test_systemd.py") and int(first["CODE_LINE"]) > 0
    assert second["PRIORITY"] == "3"
    assert second["MESSAGE"].startswith("model colors failed\nTraceback")  # multi-line form
    assert "ValueError: bad\nframe" in second["MESSAGE"]
    assert "STREAM" not in second


def test_journal_handler_when_the_message_is_huge_cuts_it_rather_than_losing_it(
        journal: tuple[Path, socket.socket]) -> None:
    path, sock = journal
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    handler = JournalHandler(path)
    handler._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    record = logging.LogRecord("edged.x", logging.ERROR, __file__, 1, "x" * 400_000, None, None)
    handler.emit(record)
    fields = parse_journal(sock.recv(1 << 20))
    handler.close()
    assert fields["MESSAGE"].endswith(" [cut]") and len(fields["MESSAGE"]) < 60_000


def test_journal_handler_when_the_journal_is_gone_writes_to_stderr(
        short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    handler = JournalHandler(short_dir / "no-journal")
    handler.emit(logging.LogRecord("edged.x", logging.ERROR, __file__, 1, "still seen", None,
                                   None))
    handler.close()
    assert "ERROR edged.x: still seen" in capsys.readouterr().err


def test_encode_fields_when_a_value_has_a_newline_uses_the_length_form() -> None:
    data = encode_fields({"A": "one", "B": "two\nlines", "C": "ünï"})
    assert data.startswith(b"A=one\nB\n" + struct.pack("<Q", 9) + b"two\nlines\nC=")
    assert parse_journal(data) == {"A": "one", "B": "two\nlines", "C": "ünï"}


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
        if handler not in handlers:
            handler.close()
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def test_setup_logging_when_stderr_is_the_journal_logs_natively(
        journal: tuple[Path, socket.socket], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        root_logging: None) -> None:
    path, sock = journal
    stderr = (tmp_path / "stderr").open("w")
    info = os.fstat(stderr.fileno())
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")
    assert systemd.stderr_is_journal()
    assert setup_logging("info", "auto", journal_socket=path) == "journal"
    logging.getLogger("edged.x").info("hello", extra={"stream": "cam"})
    fields = parse_journal(sock.recv(65536))
    stderr.close()
    assert (fields["MESSAGE"], fields["PRIORITY"], fields["STREAM"]) == ("hello", "6", "cam")


def test_setup_logging_when_stderr_is_not_the_journal_uses_stderr(
        journal: tuple[Path, socket.socket], monkeypatch: pytest.MonkeyPatch,
        root_logging: None) -> None:
    path, _sock = journal
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")  # another file: a child of a journaled shell
    assert not systemd.stderr_is_journal()
    assert setup_logging("info", "auto", journal_socket=path) == "stderr"
    monkeypatch.delenv("JOURNAL_STREAM")
    assert setup_logging("info", "stderr", journal_socket=path) == "stderr"
    assert setup_logging("info", "journal", journal_socket=path) == "journal"
    assert setup_logging("info", "journal", journal_socket=path.with_name("none")) == "stderr"
