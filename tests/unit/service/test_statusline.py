"""The terminal status line: one compact line per stream, redrawn in place under the log on a
terminal (log records print above it, never through it), a summary line per interval when the
log is not a terminal."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest

from edged.service.statusline import (
    ERASE_LINE,
    REFRESH_S,
    StatusLines,
    TerminalStatus,
    install,
    stream_line,
    summary,
    uninstall,
)

NOW = 1_000_000.0
DETECT = {"state": "streaming", "fps": 4.04, "objects": {"red": 1, "blue": 0, "green": 0},
          "last_event": {"type": "new", "label": "red", "short_id": "#3", "zones": ["right"],
                         "time": NOW - 2.2}, "dropped": 0, "failed": 0}
CLASSIFY = {"state": "streaming", "fps": 10.0, "last_result": "green 1.00", "dropped": 3,
            "failed": 0}


def test_stream_line_when_a_detect_stream_has_objects_shows_them_and_the_last_event() -> None:
    assert stream_line("crossing", DETECT, NOW) == (
        "crossing  streaming  4.0 fps  red 1  last: new red #3 (right) 2 s ago")


def test_stream_line_when_a_classifier_shows_its_last_answer_and_what_it_dropped() -> None:
    assert stream_line("demo", CLASSIFY, NOW) == "demo  streaming  10.0 fps  green 1.00  3 dropped"


def test_stream_line_when_nothing_is_known_yet_says_so() -> None:
    row: dict[str, Any] = {"state": "connecting", "fps": None, "objects": {}}
    assert stream_line("door", row, NOW) == "door  connecting  – fps  no objects"


def test_summary_when_several_streams_puts_them_on_one_line() -> None:
    line = summary({"demo": CLASSIFY, "crossing": DETECT}, NOW)
    assert line.startswith("streams: crossing  streaming")
    assert " | demo  streaming  10.0 fps" in line
    assert "\n" not in line


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_terminal_status_when_a_record_is_logged_prints_it_above_the_redrawn_lines() -> None:
    out = Tty()
    inner = logging.StreamHandler(out)
    inner.setFormatter(logging.Formatter("%(message)s"))
    terminal = TerminalStatus(inner, out, width=lambda: 80)
    terminal.refresh(["demo  10.0 fps", "crossing  4.0 fps"])
    record = logging.LogRecord("edged", logging.INFO, __file__, 1, "model colors ready", (),
                               None)
    terminal.handle(record)
    assert out.getvalue() == ("demo  10.0 fps\ncrossing  4.0 fps\n" + ERASE_LINE * 2
                              + "model colors ready\n" + "demo  10.0 fps\ncrossing  4.0 fps\n")
    terminal.refresh(["demo  9.0 fps"])
    assert out.getvalue().endswith(ERASE_LINE * 2 + "demo  9.0 fps\n")


def test_terminal_status_when_a_line_is_too_wide_cuts_it_to_the_terminal() -> None:
    out = Tty()
    terminal = TerminalStatus(logging.StreamHandler(out), out, width=lambda: 30)
    terminal.refresh(["x" * 100])
    assert out.getvalue() == "x" * 28 + "…\n"


def test_status_lines_when_not_a_terminal_logs_a_summary_each_interval(
        caplog: pytest.LogCaptureFixture) -> None:
    lines = StatusLines(lambda: {"demo": CLASSIFY}, interval_s=30, terminal=None,
                        logger=logging.getLogger("edged.test.status"), clock=lambda: NOW)
    assert lines.period_s == 30
    with caplog.at_level(logging.INFO, "edged.test.status"):
        lines.tick()
    assert [r.getMessage() for r in caplog.records] == [
        "streams: demo  streaming  10.0 fps  green 1.00  3 dropped"]


def test_status_lines_when_the_interval_is_zero_and_no_terminal_never_run() -> None:
    lines = StatusLines(dict, interval_s=0, terminal=None, logger=logging.getLogger("x"))
    assert lines.period_s is None


def test_status_lines_when_on_a_terminal_redraw_every_refresh() -> None:
    out = Tty()
    terminal = TerminalStatus(logging.StreamHandler(out), out, width=lambda: 120)
    lines = StatusLines(lambda: {"demo": CLASSIFY}, interval_s=0, terminal=terminal,
                        logger=logging.getLogger("x"), clock=lambda: NOW)
    assert lines.period_s == REFRESH_S
    lines.tick()
    assert out.getvalue() == "demo  streaming  10.0 fps  green 1.00  3 dropped\n"


def test_install_when_stderr_is_a_terminal_wraps_its_handler_and_uninstall_restores_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TERM", "xterm")
    out = Tty()
    plain = logging.StreamHandler(out)
    root = logging.getLogger()
    root.addHandler(plain)
    try:
        terminal = install(out)
        assert terminal is not None and terminal in root.handlers and plain not in root.handlers
        terminal.refresh(["demo"])
        uninstall(terminal)
        assert plain in root.handlers and terminal not in root.handlers
        assert out.getvalue() == "demo\n" + ERASE_LINE
    finally:
        for handler in (plain, *[h for h in root.handlers if isinstance(h, TerminalStatus)]):
            root.removeHandler(handler)


def test_install_when_stderr_is_not_a_terminal_changes_nothing() -> None:
    assert install(io.StringIO()) is None
