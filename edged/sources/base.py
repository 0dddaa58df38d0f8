"""What every source shares: frames with sequence numbers and capture times, the bounded frame
queue with its back-pressure policy, and the state machine (connecting → streaming →
reconnecting → stopped) with a no-frames watchdog and capped exponential backoff, run on the
source's own capture thread."""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from edged.core.errors import EdgedError
from edged.core.states import SourceState

logger = logging.getLogger(__name__)

Backpressure = Literal["drop_oldest", "drop_newest", "block"]


def worth_logging(count: int) -> bool:
    """The first ten of a repeated warning, then every hundredth: a flood of bad frames or
    payloads must not flood the journal."""
    return count <= 10 or count % 100 == 0


class SourceError(EdgedError):
    """A source cannot be opened or read (it will be retried), or cannot work here at all."""

    code = "source_failed"


class SourceUnavailable(SourceError):
    """This machine cannot read this kind of source (e.g. OpenCV without GStreamer): retrying
    will not help; the message says what would."""

    code = "source_unavailable"


ALLOWED: dict[SourceState, frozenset[SourceState]] = {
    SourceState.CONNECTING: frozenset({SourceState.STREAMING, SourceState.RECONNECTING,
                                       SourceState.STOPPED}),
    SourceState.STREAMING: frozenset({SourceState.RECONNECTING, SourceState.STOPPED}),
    SourceState.RECONNECTING: frozenset({SourceState.CONNECTING, SourceState.STOPPED}),
    SourceState.STOPPED: frozenset(),
}


@dataclass
class Frame:
    stream: str
    seq: int  # 1, 2, ... per source, counting every frame captured (dropped ones too)
    captured: float  # wall clock (time.time()) at capture, for subscribers
    captured_mono: float  # monotonic, for latencies inside edged
    data: np.ndarray  # H x W x 3 BGR uint8 for cameras; a tensor for sensors


@dataclass
class Backoff:
    """Capped exponential: initial, 2x, 4x, ... up to max_s; reset once frames flow."""

    initial_s: float
    max_s: float
    attempt: int = 0

    def next_delay(self) -> float:
        delay = min(self.max_s, self.initial_s * (2 ** self.attempt))
        self.attempt += 1
        return delay

    def reset(self) -> None:
        self.attempt = 0


@dataclass
class SourceCounters:
    frames_in: int = 0  # captured and offered to the queue
    dropped: int = 0  # pushed out of (or refused by) the full queue
    skipped: int = 0  # read but not offered: over the fps limit
    rejected: int = 0  # payloads that were not valid frames (sensors)
    reconnects: int = 0
    errors: int = 0
    last_error: str | None = None
    state: SourceState = SourceState.CONNECTING
    transitions: list[tuple[float, SourceState]] = field(default_factory=list)


@dataclass(frozen=True)
class SourceStats:
    """A source's counters and state as read at one moment (`Source.read_stats`)."""

    state: SourceState
    frames_in: int
    dropped: int
    skipped: int
    rejected: int
    reconnects: int
    errors: int
    last_error: str | None
    queue_depth: int


class FrameQueue:
    """Between the capture thread and the pipeline: at most `capacity` frames, ever. A full
    queue drops its oldest frame (live view), refuses the new one (keep order), or makes the
    capture thread wait (files, where every frame matters)."""

    def __init__(self, capacity: int, policy: Backpressure) -> None:
        self.capacity = capacity
        self.policy = policy
        self._frames: deque[Frame] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def put(self, frame: Frame) -> int:
        """Offer a frame; returns how many frames were dropped (0 or 1)."""
        with self._cond:
            if self.policy == "block":
                self._cond.wait_for(lambda: len(self._frames) < self.capacity or self._closed)
            if self._closed:
                return 1
            dropped = 0
            if len(self._frames) >= self.capacity:
                if self.policy == "drop_newest":
                    return 1
                self._frames.popleft()
                dropped = 1
            self._frames.append(frame)
            self._cond.notify_all()
            return dropped

    def get(self, timeout_s: float) -> Frame | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._frames or self._closed, timeout_s):
                return None
            if not self._frames:
                return None
            frame = self._frames.popleft()
            self._cond.notify_all()
            return frame

    def close(self) -> None:
        """Wake everyone: a blocked capture thread gives up its frame, get() returns None."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._frames)


class Source(ABC):
    """One stream's reader. Subclasses open, read and close the device; this class runs the
    state machine on a thread of its own and feeds the queue."""

    kind = "source"

    def __init__(self, name: str, uri: str, queue: FrameQueue, *, fps: float | None = None,
                 watchdog_s: float = 10.0, backoff: Backoff | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.uri = uri
        self.queue = queue
        self.min_interval_s = 1.0 / fps if fps else 0.0
        self.watchdog_s = watchdog_s
        self.backoff = backoff or Backoff(0.5, 30.0)
        self.clock = clock
        self.stats = SourceCounters()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self._next_offer = -1e18  # the clock time from which the next frame may be offered
        self._in_call_since: float | None = None  # inside open()/read(): the health tick's view
        self.state_changed = threading.Condition(self._lock)
        # A file's frame rate, kept to as a live camera would (`_pace`): set when it opens.
        self._frame_interval_s = 0.0
        self._next_due = 0.0

    # -- what a device implements ------------------------------------------------------------
    @abstractmethod
    def open(self) -> None:
        """Open the device; raise SourceError when it cannot be (yet)."""

    @abstractmethod
    def read(self) -> np.ndarray | None:
        """The next frame, or None when the stream ended or failed (reconnect). May block for
        at most about the watchdog period."""

    @abstractmethod
    def close(self) -> None:
        """Release the device (called on the capture thread)."""

    def _pace(self) -> None:
        """Hold a file's frames to its frame rate, as a live camera would deliver them."""
        self._next_due += self._frame_interval_s
        wait = self._next_due - self.clock()
        if wait > 0:
            self._stop.wait(wait)
        elif wait < -1.0:  # far behind (the host stalled): do not burst to catch up
            self._next_due = self.clock()

    # -- the state machine -------------------------------------------------------------------
    @property
    def state(self) -> SourceState:
        with self._lock:
            return self.stats.state

    def _enter(self, state: SourceState, reason: str = "") -> None:
        with self._lock:
            current = self.stats.state
            if state == current:
                return
            if state not in ALLOWED[current]:
                raise RuntimeError(f"{self.name}: {current} → {state} is not allowed")
            self.stats.state = state
            self.stats.transitions.append((self.clock(), state))
            del self.stats.transitions[:-32]
            if state == SourceState.RECONNECTING:
                self.stats.reconnects += 1
            self.state_changed.notify_all()
        log = logger.warning if state == SourceState.RECONNECTING else logger.info
        log("stream %s: %s%s", self.name, state, f" ({reason})" if reason else "",
            extra={"stream": self.name, "code": f"stream_{state}"})

    def wait_state(self, state: SourceState, timeout_s: float) -> bool:
        with self._lock:
            return self.state_changed.wait_for(lambda: self.stats.state == state, timeout_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"source-{self.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Stop capturing; True when the thread has ended within `timeout_s`."""
        self._stop.set()
        self.queue.close()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._session()
                if self._stop.is_set():
                    break
                delay = self.backoff.next_delay()
                logger.info("stream %s: next attempt in %.1f s", self.name, delay)
                if self._stop.wait(delay):
                    break
                self._enter(SourceState.CONNECTING)
        finally:
            self._enter(SourceState.STOPPED)

    def _session(self) -> None:
        """One connection: open, stream until it fails or goes quiet, close."""
        try:
            self._in_call_since = self.clock()
            self.open()
        except SourceUnavailable as exc:
            self._error(str(exc))
            self._stop.set()  # retrying cannot help; the state says stopped, the log says why
            return
        except SourceError as exc:
            self._error(str(exc))
            self._enter(SourceState.RECONNECTING, str(exc))
            return
        except Exception as exc:  # the device library failing in some new way: retry later
            logger.exception("stream %s: opening failed", self.name, extra={"stream": self.name})
            self._error(f"opening failed: {exc}")
            self._enter(SourceState.RECONNECTING, f"opening failed: {exc}")
            return
        finally:
            self._in_call_since = None
        try:
            reason = self._stream()
        except Exception as exc:  # a decoder or device library failing in some new way
            logger.exception("stream %s: capture failed", self.name, extra={"stream": self.name})
            reason = f"capture failed: {exc}"
            self._error(reason)
        finally:
            self._in_call_since = None  # read() raised: not stuck in it
            try:
                self.close()
            except Exception:  # closing a broken device must not end the capture thread
                logger.exception("stream %s: close failed", self.name,
                                 extra={"stream": self.name})
        if not self._stop.is_set():
            self._enter(SourceState.RECONNECTING, reason)

    def _stream(self) -> str:
        last_frame = self.clock()
        while not self._stop.is_set():
            self._in_call_since = self.clock()
            data = self.read()
            self._in_call_since = None
            now = self.clock()
            if data is None:
                if now - last_frame > self.watchdog_s:
                    return f"no frames for {self.watchdog_s:g} s"
                if self._ended():
                    return "the stream ended"
                continue
            if self.state != SourceState.STREAMING:
                self._enter(SourceState.STREAMING)
                self.backoff.reset()
            last_frame = now
            self._offer(data, now)
        return "stopped"

    def _ended(self) -> bool:
        """After read() gave None: has the stream ended (reconnect) rather than being slow?"""
        return True

    def _offer(self, data: np.ndarray, now: float) -> None:
        self._seq += 1
        if now < self._next_offer:
            with self._lock:
                self.stats.skipped += 1
            return
        # The next slot is one interval after this one's, not after this frame: a 30 fps
        # source limited to 10 fps then gives every third frame, where "an interval since the
        # last frame" gave every fourth whenever a frame came a hair early (~8 fps). After a
        # stall longer than an interval the schedule starts again from now (no burst).
        on_time = now - self._next_offer < self.min_interval_s
        self._next_offer = (self._next_offer if on_time else now) + self.min_interval_s
        frame = Frame(self.name, self._seq, self.frame_wall(), now, data)
        dropped = self.queue.put(frame)
        with self._lock:
            self.stats.frames_in += 1
            self.stats.dropped += dropped

    def frame_wall(self) -> float:
        """The capture time (Unix s) of the frame read() just gave: now, unless the reader
        knows better (a demuxing reader maps the frame's timestamp, on the clock its packets
        use, so events and recordings agree)."""
        return time.time()

    def reject(self, reason: str) -> None:
        """A payload that is not a valid frame: counted, logged, and the stream goes on."""
        with self._lock:
            self.stats.rejected += 1
            count = self.stats.rejected
        if worth_logging(count):
            logger.warning("stream %s: rejected payload #%d: %s", self.name, count, reason,
                           extra={"stream": self.name, "code": "payload_rejected"})

    def _error(self, message: str) -> None:
        with self._lock:
            self.stats.errors += 1
            self.stats.last_error = message

    def heartbeat(self) -> tuple[str, float | None]:
        """When the capture thread entered the device call it is in now (None: not in one).
        A call that never returns (a driver or an RTSP read hung in C) shows up here."""
        return f"stream {self.name}: capture in open()/read()", self._in_call_since

    def read_stats(self) -> SourceStats:
        with self._lock:
            s = self.stats
            return SourceStats(s.state, s.frames_in, s.dropped, s.skipped, s.rejected,
                               s.reconnects, s.errors, s.last_error, len(self.queue))
