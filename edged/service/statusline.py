"""The daemon's streams on its own terminal: a compact line per stream (state, fps, objects or
the last answer, the last event) redrawn in place under the log when stderr is a terminal, or
one summary line per interval in a log that is not (a file, a pipe, the journal). Per-frame
results are DEBUG lines (`edged.streams.pipeline`), so that at INFO the log says what changed.

Rows are the status report's stream rows (`StreamSet.describe()`): what `edged status` and the
status page show, read from memory."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

Rows = Mapping[str, Mapping[str, Any]]
ERASE_LINE = "\x1b[1A\x1b[2K"  # up one line, clear it
REFRESH_S = 1.0  # how often the lines are redrawn in place


def stream_line(name: str, row: Mapping[str, Any], now: float) -> str:
    """`crossing  streaming  4.0 fps  red 1  last: new blue #3 (right) 2 s ago`"""
    parts = [name, str(row.get("state", "?"))]
    fps = row.get("fps")
    parts.append("– fps" if fps is None else f"{fps:.1f} fps")
    objects = row.get("objects")
    if objects is not None:
        present = [f"{label} {n}" for label, n in sorted(objects.items()) if n]
        parts.append(", ".join(present) if present else "no objects")
    elif row.get("last_result"):
        parts.append(str(row["last_result"]))
    event = row.get("last_event")
    if event:
        zones = f" ({', '.join(event['zones'])})" if event.get("zones") else ""
        parts.append(f"last: {event['type']} {event['label']} {event.get('short_id', '')}"
                     .rstrip() + f"{zones} {_ago(now - event['time'])}")
    trouble = [f"{row[k]} {k}" for k in ("dropped", "failed") if row.get(k)]
    if trouble:
        parts.append(", ".join(trouble))
    return "  ".join(parts)


def summary(rows: Rows, now: float) -> str:
    """Every stream on one line, for a log that is not a terminal."""
    if not rows:
        return "streams: none"
    return "streams: " + " | ".join(stream_line(name, row, now)
                                    for name, row in sorted(rows.items()))


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.0f} h ago"


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM", "") not in ("", "dumb")
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


class TerminalStatus(logging.Handler):
    """Wraps the stderr log handler of a terminal: each log record is printed above the block
    of stream lines, which is erased first and drawn again after; `refresh()` redraws it with
    new rows. One lock orders records and redraws, so a line is never half-overwritten."""

    def __init__(self, inner: logging.Handler, stream: TextIO = sys.stderr, *,
                 width: Callable[[], int] = lambda: shutil.get_terminal_size().columns) -> None:
        super().__init__(inner.level)
        self.inner = inner
        self.stream = stream
        self.width = width
        self.lines: list[str] = []
        self._drawn = 0
        self._draw_lock = threading.RLock()

    def emit(self, record: logging.LogRecord) -> None:
        with self._draw_lock:
            self._erase()
            self.inner.handle(record)
            self._draw()

    def refresh(self, lines: list[str]) -> None:
        with self._draw_lock:
            self._erase()
            self.lines = lines
            self._draw()

    def close(self) -> None:
        """Leave the terminal as it was: the block erased, the inner handler closed."""
        with self._draw_lock:
            self._erase()
            self.lines = []
        self.inner.close()
        super().close()

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write(ERASE_LINE * self._drawn)
            self.stream.flush()
            self._drawn = 0

    def _draw(self) -> None:
        if not self.lines:
            return
        width = max(20, self.width() - 1)
        self.stream.write("".join(_fit(line, width) + "\n" for line in self.lines))
        self.stream.flush()
        self._drawn = len(self.lines)


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


class StatusLines:
    """What the daemon's status task calls: every REFRESH_S in place on a terminal, or a
    summary at INFO every `interval_s` otherwise (0: never)."""

    def __init__(self, rows: Callable[[], Rows], *, interval_s: float,
                 terminal: TerminalStatus | None, logger: logging.Logger,
                 clock: Callable[[], float] = time.time) -> None:
        self.rows = rows
        self.interval_s = interval_s
        self.terminal = terminal
        self.logger = logger
        self.clock = clock

    @property
    def period_s(self) -> float | None:
        """How often `tick` is due; None: never."""
        if self.terminal is not None:
            return REFRESH_S
        return self.interval_s or None

    def tick(self) -> None:
        rows, now = self.rows(), self.clock()
        if self.terminal is not None:
            self.terminal.refresh([stream_line(name, row, now)
                                   for name, row in sorted(rows.items())])
        elif rows:
            self.logger.info("%s", summary(rows, now))


def install(stream: TextIO = sys.stderr) -> TerminalStatus | None:
    """On a terminal, put a TerminalStatus in place of the root logger's stderr handler and
    return it; None (nothing changed) when stderr is not a terminal or is not logged to."""
    if not is_terminal(stream):
        return None
    root = logging.getLogger()
    for handler in root.handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
            terminal = TerminalStatus(handler, stream)
            root.removeHandler(handler)
            root.addHandler(terminal)
            return terminal
    return None


def uninstall(terminal: TerminalStatus) -> None:
    """Put the plain stderr handler back (the daemon stopped)."""
    root = logging.getLogger()
    with terminal._draw_lock:
        terminal._erase()
        terminal.lines = []
    if terminal in root.handlers:
        root.removeHandler(terminal)
        root.addHandler(terminal.inner)
