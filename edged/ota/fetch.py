"""Getting an artifact's bytes into the staging area: http(s) with HTTP Range resume and
retries, file://, or indexed chunks over MQTT. The size is enforced while reading; the sha256
is checked afterwards (`fsutil.file_sha256`), over the whole file, resumed parts included."""

from __future__ import annotations

import logging
import shutil
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from http.client import HTTPException
from pathlib import Path
from typing import Protocol

from edged.ota.manifest import Artifact, Rejected

logger = logging.getLogger(__name__)

BLOCK = 256 * 1024
Progress = Callable[[int, int], None]  # (bytes so far, total)
# The default overall deadline of a download: this much, plus the artifact at the minimum rate.
DEADLINE_BASE_S = 300.0
DEADLINE_MIN_RATE = 32 * 1024  # bytes/s


def download_deadline_s(size: int, configured: float | None) -> float:
    """How long one download (all its attempts) may take: `ota.download_timeout_s`, or sized
    from the artifact when that is null."""
    return configured if configured is not None else DEADLINE_BASE_S + size / DEADLINE_MIN_RATE


class Delivery(Protocol):
    """Bytes that come to the device rather than being fetched: MQTT chunks (ChunkAssembler),
    or a file the socket API received with its manifest (edged.ota.local)."""

    def wait(self, dest: Path, progress: Progress, stop: threading.Event) -> None: ...


class Fetcher:
    """Downloads with bounded retries: capped exponential backoff between attempts, and the
    attempt count starts again whenever an attempt made progress (a flaky link that keeps
    moving finishes; a dead one gives up)."""

    def __init__(self, *, max_bytes: int, attempts: int = 6, backoff_initial_s: float = 0.5,
                 backoff_max_s: float = 15.0, timeout_s: float = 30.0,
                 ca_file: Path | None = None, stop: threading.Event | None = None) -> None:
        self.max_bytes = max_bytes
        self.attempts = attempts
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.timeout_s = timeout_s
        self.ca_file = ca_file
        self.stop = stop or threading.Event()

    def check_size(self, artifact: Artifact) -> None:
        if artifact.size > self.max_bytes:
            raise Rejected("oversize", f"artifact is {artifact.size} bytes; ota.max_artifact_mb "
                                       f"allows {self.max_bytes}")

    def fetch(self, artifact: Artifact, dest: Path, progress: Progress, *,
              deadline_s: float | None = None,
              take: Callable[[int], None] = lambda n: None) -> None:
        """`artifact.url` into `dest` (resuming what is already there), all attempts within
        `deadline_s` (default: sized from the artifact) or Rejected('download_timeout'). A
        read in progress at the deadline ends within the socket timeout. `take` is told of
        each block read (a bandwidth budget that downloads share waits there)."""
        self.check_size(artifact)
        assert artifact.url is not None
        parsed = urllib.parse.urlsplit(artifact.url)
        if parsed.scheme == "file":
            self._copy(Path(urllib.parse.unquote(parsed.path)), artifact.size, dest, progress)
            return
        limit = deadline_s if deadline_s is not None else download_deadline_s(artifact.size, None)
        deadline = time.monotonic() + limit
        failures, delay = 0, self.backoff_initial_s
        while True:
            before = dest.stat().st_size if dest.exists() else 0
            try:
                if self._attempt(artifact.url, artifact.size, dest, progress, deadline, limit,
                                 take):
                    return
            except Rejected:
                raise
            except (OSError, HTTPException, ValueError) as exc:
                got = dest.stat().st_size if dest.exists() else 0
                failures = 1 if got > before else failures + 1
                if failures >= self.attempts:
                    raise Rejected("download_failed", f"{_redact(artifact.url)}: {exc} "
                                                      f"({failures} attempts)") from None
                if got > before:
                    delay = self.backoff_initial_s
                logger.warning("OTA download of %s stopped at %d/%d bytes (%s); retrying in "
                               "%.1f s", _redact(artifact.url), got, artifact.size, exc, delay)
                if delay >= deadline - time.monotonic():
                    raise Rejected("download_timeout", f"{_redact(artifact.url)}: not "
                                   f"downloaded within {limit:g} s ({exc})") from None
                if self.stop.wait(delay):
                    raise Rejected("download_failed", "the daemon is stopping") from None
                delay = min(delay * 2, self.backoff_max_s)

    def _attempt(self, url: str, size: int, dest: Path, progress: Progress, deadline: float,
                 limit: float, take: Callable[[int], None]) -> bool:
        have = dest.stat().st_size if dest.exists() else 0
        if have > size:  # not what the manifest describes: start again
            dest.unlink()
            have = 0
        if have == size:
            return True
        request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
        try:
            # Each blocking socket call ends by the deadline or the socket timeout, whichever
            # is first; the deadline is checked between reads.
            left = deadline - time.monotonic()
            if left <= 0:
                raise Rejected("download_timeout", f"{_redact(url)}: not downloaded within "
                                                   f"{limit:g} s")
            response = urllib.request.urlopen(request, timeout=min(self.timeout_s, left),
                                              context=self._ssl_context(url))
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code == 416 and have:  # our range starts past its end: start again
                dest.unlink()
                raise OSError("server refused the resume range; restarting") from None
            if exc.code in (408, 429) or exc.code >= 500:
                raise OSError(f"HTTP {exc.code}") from None
            raise Rejected("download_failed", f"{_redact(url)}: HTTP {exc.code} "
                                              f"{exc.reason}") from None
        with response:
            if have and response.status == 206:
                start = _range_start(response.headers.get("Content-Range", ""))
                if start != have:
                    raise OSError(f"server answered range {start}, asked {have}")
                mode = "ab"
            else:  # 200: the server ignores Range; the whole body comes again
                have, mode = 0, "wb"
            with dest.open(mode) as out:
                # read1: one socket read at most, so a trickle of bytes cannot keep a call
                # (waiting for a full block) going past the deadline.
                while block := response.read1(BLOCK):
                    have += len(block)
                    if have > size:
                        raise Rejected("size_mismatch", f"the artifact is larger than the "
                                                        f"manifest's {size} bytes")
                    out.write(block)
                    progress(have, size)
                    take(len(block))
                    if self.stop.is_set():
                        raise Rejected("download_failed", "the daemon is stopping")
                    if time.monotonic() > deadline:
                        raise Rejected("download_timeout", f"{_redact(url)}: {have} of {size} "
                                                           f"bytes in {limit:g} s; giving up")
        if have < size:
            raise OSError(f"connection closed at {have} of {size} bytes")
        return True

    def _ssl_context(self, url: str) -> ssl.SSLContext | None:
        if not url.startswith("https://"):
            return None
        return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)

    def _copy(self, source: Path, size: int, dest: Path, progress: Progress) -> None:
        try:
            actual = source.stat().st_size
        except OSError as exc:
            raise Rejected("download_failed", f"cannot read {source}: {exc}") from None
        if actual != size:
            raise Rejected("size_mismatch", f"{source} is {actual} bytes; the manifest says "
                                            f"{size}")
        with source.open("rb") as src, dest.open("wb") as out:
            shutil.copyfileobj(src, out, BLOCK)
        progress(size, size)


def _range_start(content_range: str) -> int:
    """The first byte of `bytes START-END/TOTAL`; -1 when unreadable."""
    try:
        unit, _, spec = content_range.partition(" ")
        return int(spec.split("-", 1)[0]) if unit == "bytes" else -1
    except ValueError:
        return -1


def _redact(url: str) -> str:
    """A URL fit for logs and status messages: no credentials, no query string."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit((parts.scheme, host, parts.path, "", ""))


class ChunkAssembler:
    """Inline artifacts: `chunks` indexed pieces arriving on MQTT in any order (duplicates
    ignored), written out in order once all are here. Bounded by the manifest's size."""

    def __init__(self, artifact: Artifact, timeout_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        assert artifact.chunks is not None
        self.artifact = artifact
        self.timeout_s = timeout_s
        self.clock = clock
        self._parts: dict[int, bytes] = {}
        self._bytes = 0
        self._done = threading.Condition()
        self._error: Rejected | None = None

    def add(self, index: int, data: bytes) -> None:
        """Called from the MQTT thread for each chunk message."""
        with self._done:
            count = self.artifact.chunks or 0
            if self._error is not None or index in self._parts:
                return
            if not 0 <= index < count:
                self._error = Rejected("bad_manifest", f"chunk {index} is outside 0..{count - 1}")
            elif self._bytes + len(data) > self.artifact.size:
                self._error = Rejected("size_mismatch", f"chunks add up to more than the "
                                                        f"manifest's {self.artifact.size} bytes")
            else:
                self._parts[index] = data
                self._bytes += len(data)
            self._done.notify_all()

    def wait(self, dest: Path, progress: Progress, stop: threading.Event) -> None:
        count = self.artifact.chunks or 0
        deadline = self.clock() + self.timeout_s
        with self._done:
            while self._error is None and len(self._parts) < count:
                left = deadline - self.clock()
                if left <= 0 or stop.is_set():
                    missing = sorted(set(range(count)) - set(self._parts))
                    raise Rejected("download_failed", f"{len(missing)} of {count} chunks did "
                                                      f"not arrive in {self.timeout_s:g} s "
                                                      f"(first missing: {missing[:5]})")
                self._done.wait(min(left, 0.5))
                progress(self._bytes, self.artifact.size)
            if self._error is not None:
                raise self._error
            parts = [self._parts[i] for i in range(count)]
        with dest.open("wb") as out:
            for part in parts:
                out.write(part)
        progress(self._bytes, self.artifact.size)
