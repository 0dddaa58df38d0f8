"""Sensor streams on MQTT topics (`mqtt://<topic>`): each message is one input tensor, as a
JSON array or as raw little-endian bytes, shaped as the model's input (without the batch dim).
Bad payloads are rejected with a logged reason and counted; the stream goes on."""

from __future__ import annotations

import json
import math
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from edged.sources.base import Source, SourceError

Subscribe = Callable[[str, Callable[[str, bytes], None]], None]
MAX_JSON_BYTES = 1 << 20


class SensorSource(Source):
    kind = "sensor"

    def __init__(self, *args: Any, subscribe: Subscribe | None,
                 unsubscribe: Callable[[str], None] | None = None,
                 shape: tuple[int, ...], dtype: np.dtype,
                 payload: Literal["json", "raw"] = "json", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.topic = self.uri.partition("://")[2]
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.payload = payload
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._subscribed = False
        self._pending: deque[np.ndarray] = deque(maxlen=self.queue.capacity)
        self._arrived = threading.Condition()
        if payload == "raw" and any(d < 0 for d in shape):
            raise SourceError(f"{self.uri}: raw payloads need a fixed input shape, the model "
                              f"says {list(shape)}")

    def open(self) -> None:
        if self._subscribe is None:
            raise SourceError(f"{self.uri}: MQTT is disabled, sensor topics cannot be read")
        if not self._subscribed:  # the link resubscribes by itself after reconnects
            self._subscribe(self.topic, self.on_message)
            self._subscribed = True

    def on_message(self, topic: str, payload: bytes) -> None:
        """On the MQTT thread: decode, or reject with the reason."""
        try:
            tensor = self.decode(payload)
        except ValueError as exc:
            self.reject(f"{topic}: {exc}")
            return
        with self._arrived:
            self._pending.append(tensor)
            self._arrived.notify()

    def decode(self, payload: bytes) -> np.ndarray:
        if self.payload == "raw":
            expected = math.prod(self.shape) * self.dtype.itemsize
            if len(payload) != expected:
                raise ValueError(f"{len(payload)} bytes, expected {expected} "
                                 f"({list(self.shape)} {self.dtype})")
            # Converted (a copy) only on a big-endian host; a view of the payload otherwise.
            wire = np.frombuffer(payload, self.dtype.newbyteorder("<")).reshape(self.shape)
            return wire.astype(self.dtype, copy=False)
        if len(payload) > MAX_JSON_BYTES:
            raise ValueError(f"{len(payload)} bytes of JSON, more than {MAX_JSON_BYTES}")
        try:
            values = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        except RecursionError as exc:
            raise ValueError("not JSON: nested too deeply") from exc
        if not isinstance(values, list):
            raise ValueError(f"expected a JSON array, got {type(values).__name__}")
        try:
            tensor = np.asarray(values, dtype=self.dtype)
        except (TypeError, ValueError, OverflowError) as exc:
            raise ValueError(f"not an array of {self.dtype} numbers: {exc}") from exc
        if tensor.ndim != len(self.shape) or any(
                want >= 0 and got != want
                for got, want in zip(tensor.shape, self.shape, strict=True)):
            raise ValueError(f"shape {list(tensor.shape)}, expected {list(self.shape)}")
        if tensor.dtype.kind == "f" and not np.isfinite(tensor).all():
            raise ValueError("NaN or infinite values")
        return tensor

    def read(self) -> np.ndarray | None:
        with self._arrived:
            if not self._arrived.wait_for(lambda: bool(self._pending), 0.5):
                return None
            return self._pending.popleft()

    def _ended(self) -> bool:
        return False  # a quiet sensor has not ended; the watchdog decides

    def close(self) -> None:
        pass  # subscribed until stopped: the link resubscribes by itself after reconnects

    def stop(self, timeout_s: float = 5.0) -> bool:
        if self._subscribed and self._unsubscribe is not None:
            self._unsubscribe(self.topic)
            self._subscribed = False
        return super().stop(timeout_s)
