"""A real browser for the page tests: Debian's Chromium, headless, driven over the Chrome
DevTools Protocol on a pipe (`--remote-debugging-pipe`: JSON messages ending in NUL on fds 3
and 4), so no port, no driver binary and nothing downloaded. `Browser.page(url)` opens a tab;
a `Page` evaluates JavaScript, waits for what it shows, clicks, and takes screenshots; it also
records every URL the tab asked for (`requests`)."""

from __future__ import annotations

import base64
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from support.polling import wait_until

BINARIES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", "--disable-default-apps", "--no-default-browser-check",
         "--mute-audio", "--hide-scrollbars", "--remote-debugging-pipe")
CALL_TIMEOUT_S = 30.0


def chromium() -> str | None:
    """The Chromium binary (Debian's launcher script is skipped: it is the binary that takes
    the pipe's fds); None when none is installed."""
    for name in BINARIES:
        found = shutil.which(name) if "/" not in name else (name if os.access(name, os.X_OK)
                                                           else None)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    """Chromium answered a call with an error, or went away."""


class Browser:
    def __init__(self, binary: str, profile: Path, *, width: int = 1280,
                 height: int = 1500, flags: Sequence[str] = ()) -> None:
        """`flags`: more Chromium switches (`--host-resolver-rules=...` gives a page a host
        name of another site while it is served on loopback)."""
        to_child, from_parent = os.pipe()  # we write, it reads (its fd 3)
        from_child, to_parent = os.pipe()  # it writes (its fd 4), we read
        # Above 10, so that moving them to 3 and 4 in the child cannot close one another.
        child_in = fcntl.fcntl(to_child, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(to_parent, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child)
        os.close(to_parent)
        script = (f'exec 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-; '
                  'exec "$0" "$@"')
        self.log = profile / "chromium.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", script, binary, *FLAGS, f"--user-data-dir={profile / 'user'}",
                 f"--window-size={width},{height}", *flags, "about:blank"],
                pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL,
                stdout=log, stderr=log)
        os.close(child_in)
        os.close(child_out)
        self._out = from_parent
        self._in = from_child
        self._ids = itertools.count(1)
        self._calls: dict[int, Future[dict[str, Any]]] = {}
        self._listeners: dict[str, list[Any]] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name="cdp-reader", daemon=True)
        self._reader.start()

    # -- the protocol ------------------------------------------------------------------------
    def call(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None, timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        message: dict[str, Any] = {"id": next(self._ids), "method": method,
                                   "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._calls[message["id"]] = future
        with self._write_lock:
            os.write(self._out, json.dumps(message).encode() + b"\0")
        return future.result(timeout)

    def listen(self, session: str, method: str, sink: list[Any]) -> None:
        """Append the params of every `method` event of `session` to `sink`."""
        with self._lock:
            self._listeners.setdefault(f"{session}/{method}", []).append(sink)

    def _read(self) -> None:
        buffer = b""
        try:
            while True:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    break
                buffer += chunk
                *messages, buffer = buffer.split(b"\0")
                for raw in messages:
                    self._dispatch(json.loads(raw))
        except OSError:
            pass
        with self._lock:
            calls, self._calls = self._calls, {}
        for future in calls.values():
            future.set_exception(BrowserError(f"Chromium went away (see {self.log})"))

    def _dispatch(self, message: dict[str, Any]) -> None:
        if "id" in message:
            with self._lock:
                future = self._calls.pop(message["id"], None)
            if future is None:
                return
            if "error" in message:
                future.set_exception(BrowserError(str(message["error"])))
            else:
                future.set_result(message.get("result", {}))
            return
        key = f"{message.get('sessionId')}/{message.get('method')}"
        with self._lock:
            sinks = list(self._listeners.get(key, ()))
        for sink in sinks:
            sink.append(message.get("params", {}))

    # -- tabs --------------------------------------------------------------------------------
    def page(self, url: str) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target,
                                                      "flatten": True})["sessionId"]
        page = Page(self, session)
        page.navigate(url)
        return page

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=10)
        except Exception:  # already gone, or not answering: it is killed below
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for fd in (self._out, self._in):
            try:
                os.close(fd)
            except OSError:
                pass
        self._reader.join(10)


class Page:
    """One tab. `requests` holds every URL it asked for, in order, `responses` every answer's
    head as it came."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session
        self.requests: list[dict[str, Any]] = []
        self.responses: list[dict[str, Any]] = []  # what DevTools saw answered (opaque ones too)
        self.loads: list[dict[str, Any]] = []
        self.console: list[dict[str, Any]] = []
        browser.listen(session, "Network.requestWillBeSent", self.requests)
        browser.listen(session, "Network.responseReceived", self.responses)
        browser.listen(session, "Page.loadEventFired", self.loads)
        browser.listen(session, "Runtime.exceptionThrown", self.console)
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable")

    def call(self, method: str, params: dict[str, Any] | None = None, **kwargs: Any
             ) -> dict[str, Any]:
        return self.browser.call(method, params, session=self.session, **kwargs)

    def navigate(self, url: str, timeout: float = 30.0) -> None:
        before = len(self.loads)
        answer = self.call("Page.navigate", {"url": url})
        if answer.get("errorText"):
            raise BrowserError(f"{url}: {answer['errorText']}")
        wait_until(lambda: len(self.loads) > before, timeout=timeout, what=f"{url} to load")

    def evaluate(self, expression: str) -> Any:
        answer = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in answer:
            raise BrowserError(f"{expression[:80]}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 30.0, what: str = "") -> Any:
        """The value of `expression` once it is truthy (asked every 0.1 s, within `timeout`)."""
        return wait_until(lambda: self.evaluate(expression), timeout=timeout, interval=0.1,
                          what=what or expression)

    def click(self, x: float, y: float) -> None:
        """A left click at viewport CSS pixels (x, y)."""
        for kind in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y,
                                                   "button": "left", "clickCount": 1})

    def screenshot(self, path: Path | None = None, *, full_page: bool = True) -> bytes:
        """A PNG of the tab (the whole page, not only the window); also written to `path`."""
        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": full_page}
        png = base64.b64decode(self.call("Page.captureScreenshot", params)["data"])
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(png)
        return png


@contextmanager
def running_browser(flags: Sequence[str] = ()) -> Iterator[Browser]:
    """Headless Chromium with a fresh profile (and `flags`), closed after the block; the test
    is skipped, saying why, where none is installed (`.ci/run` installs Debian's)."""
    binary = chromium()
    if binary is None:
        if os.environ.get("CI"):  # CI installs it (.ci/run): its absence is a failure there
            pytest.fail("no Chromium: .ci/run should have installed Debian's chromium")
        pytest.skip("no Chromium here: apt-get install chromium (.ci/run does)")
    profile = Path(tempfile.mkdtemp(prefix="edged-chromium-"))
    running = Browser(binary, profile, flags=flags)
    try:
        yield running
    finally:
        running.close()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Headless Chromium with a fresh profile (see `running_browser`)."""
    with running_browser() as running:
        yield running
