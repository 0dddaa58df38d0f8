"""The MQTT link (paho-mqtt 2.x): one connection to the fleet broker with TLS and a password,
`<prefix>/status` retained (`online` on connect, `offline` as the Last Will and on a clean
stop), publishing with a QoS per topic class, a bounded buffer while the broker is away, and
inbound topics dispatched to handlers (sensor streams, OTA).

Nothing here blocks a caller: `publish()` hands the message to paho, or to the offline buffer
when there is no connection. paho's network thread reconnects with capped backoff by itself.
"""

from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.core.credentials import credential
from edged.core.errors import ConfigError
from edged.mqtt import topics
from edged.mqtt.config import MqttConfig

logger = logging.getLogger(__name__)

TopicClass = Literal["results", "events", "discovery", "state", "stats", "status", "ota"]
Handler = Callable[[str, bytes], None]
MessageHandler = Callable[[paho.MQTTMessage], None]  # the whole message: MQTT 5 properties too
KEEPALIVE_S = 30
RECONNECT_MIN_S, RECONNECT_MAX_S = 1, 30
PAHO_INFLIGHT = 32


@dataclass
class LinkStats:
    connected: bool = False
    published: int = 0  # handed to paho
    dropped: int = 0  # lost to a full buffer (oldest first) or refused by paho's bound
    connects: int = 0
    disconnects: int = 0
    failed_connects: int = 0  # attempts refused, unreachable or failed in TLS
    received: int = 0
    handler_errors: int = 0
    dropped_by_class: dict[str, int] = field(default_factory=dict)
    published_by_class: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Message:
    topic: str
    payload: bytes
    qos: int
    retain: bool
    kind: str


def read_password(path: Path) -> str:
    """The password in `path` (relative: a systemd credential, see systemd.credential)."""
    path = credential(path)
    try:
        return path.read_text().rstrip("\r\n")
    except OSError as exc:
        raise ConfigError(f"mqtt.password_file: cannot read {path}: {exc.strerror}") from exc


class MqttLink:
    def __init__(self, config: MqttConfig, *, prefix: str, client_id: str) -> None:
        self.config = config
        self.prefix = prefix.rstrip("/")
        self.status_topic = topics.under(self.prefix, topics.STATUS)
        self._qos: dict[str, int] = {"results": config.qos_results,
                                     "events": config.qos_events, "discovery": 1, "state": 1,
                                     "stats": 0, "status": 1, "ota": 1}
        self._lock = threading.Lock()
        self._buffer: deque[_Message] = deque()
        # While a reconnect sends the offline buffer (paho's thread), new messages queue
        # behind it: sent at once they would overtake older ones for the same topic (a
        # discovery config emptied after a reload, then the config buffered before it).
        self._flushing = False
        self._handlers: dict[str, Handler] = {}
        self._whole: dict[str, MessageHandler] = {}  # filters whose handler takes it all
        # Subscriptions (under _lock): `_session` is set where _on_connect reads the handlers,
        # so a subscribe() racing with it is sent by exactly one of the two; `_confirmed`
        # holds the filters this connection's broker has acknowledged (SUBACK).
        self._session = False
        self._pending: dict[int, list[str]] = {}  # SUBSCRIBE packet id -> its filters
        self._confirmed: set[str] = set()
        self._acked = threading.Condition(self._lock)
        self._on_connected: list[Callable[[], None]] = []
        self._stats = LinkStats()
        self._connected = threading.Event()
        self._stopping = False
        self._failures = 0  # attempts failed since the last connection (paho's backoff)
        self._last_failure: str | None = None
        self._client = self._make_client(client_id)

    # -- setup -------------------------------------------------------------------------------
    def _make_client(self, client_id: str) -> paho.Client:
        cfg = self.config
        protocol = paho.MQTTv5 if cfg.protocol == "5" else paho.MQTTv311
        client = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=protocol, reconnect_on_failure=True)
        if cfg.username is not None:
            password = read_password(cfg.password_file) if cfg.password_file else None
            client.username_pw_set(cfg.username, password)
        if cfg.tls is not None:
            tls = cfg.tls
            try:
                client.tls_set(ca_certs=str(tls.ca), certfile=_opt(tls.cert),
                               keyfile=_opt(tls.key), cert_reqs=ssl.CERT_REQUIRED,
                               tls_version=ssl.PROTOCOL_TLS_CLIENT)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(f"mqtt.tls: {exc}") from exc
            client.tls_insecure_set(tls.insecure)
        client.will_set(self.status_topic, b"offline", qos=1, retain=True)
        # paho holds QoS>0 messages until acked (and while it reconnects): bound that too, with
        # room for its in-flight window on top of a full flush of our buffer.
        client.max_queued_messages_set(cfg.buffer_messages + PAHO_INFLIGHT)
        client.max_inflight_messages_set(PAHO_INFLIGHT)
        client.reconnect_delay_set(RECONNECT_MIN_S, RECONNECT_MAX_S)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        client.on_subscribe = self._on_subscribe
        return client

    def start(self) -> None:
        """Connect in the background; publishing works (into the buffer) right away."""
        self._client.connect_async(self.config.host, self.config.port, keepalive=KEEPALIVE_S,
                                   properties=self._connect_properties())
        self._client.loop_start()
        logger.info("MQTT: connecting to %s:%d (MQTT %s%s)", self.config.host, self.config.port,
                    self.config.protocol, ", TLS" if self.config.tls else "")

    def _connect_properties(self) -> Properties | None:
        """MQTT 5: the Maximum Packet Size, so the broker never sends us a payload (a 40 MB
        "manifest") bigger than we take in; paho sends the same on every reconnect."""
        if self.config.protocol != "5":
            return None
        properties = Properties(PacketTypes.CONNECT)
        properties.MaximumPacketSize = self.config.max_packet_mb * 1024 * 1024
        return properties

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Publish `offline` (retained), give paho `timeout_s` to deliver what it holds, and
        disconnect. A broker that is away gets the Last Will's `offline` instead."""
        with self._lock:
            self._stopping = True
        if self._connected.is_set():
            info = self._client.publish(self.status_topic, b"offline", qos=1, retain=True)
            deadline = time.monotonic() + timeout_s
            while not info.is_published() and time.monotonic() < deadline \
                    and self._connected.is_set():
                time.sleep(0.01)
        self._client.disconnect()
        self._client.loop_stop()

    # -- outbound ----------------------------------------------------------------------------
    def topic(self, suffix: str) -> str:
        return f"{self.prefix}/{suffix}"

    def publish(self, kind: TopicClass, suffix: str, payload: bytes, *,
                retain: bool = False) -> None:
        self.publish_to(kind, self.topic(suffix), payload, retain=retain)

    def publish_to(self, kind: TopicClass, topic: str, payload: bytes, *,
                   retain: bool = False) -> None:
        """`publish` on a whole topic, outside the device's prefix (Home Assistant's
        discovery topics)."""
        message = _Message(topic, payload, self._qos[kind], retain, kind)
        with self._lock:
            if self._stopping:
                return
            if not self._connected.is_set() or (
                    (self._flushing or self._buffer) and self.config.buffer_messages):
                self._keep(message)
                return
        self._send(message)

    def _send(self, message: _Message) -> None:
        info = self._client.publish(message.topic, message.payload, message.qos, message.retain)
        with self._lock:
            if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._published(message.kind)
            elif info.rc == MQTTErrorCode.MQTT_ERR_NO_CONN:
                # The connection went away just now. paho keeps a QoS 1/2 message and sends
                # it after the reconnect (keeping it here as well would send it twice);
                # QoS 0 it forgets, so it goes into the offline buffer.
                if message.qos == 0:
                    self._keep(message)
                else:
                    self._published(message.kind)
            else:  # MQTT_ERR_QUEUE_SIZE: paho already holds as many as the buffer may
                self._drop(message.kind)

    def _keep(self, message: _Message) -> None:
        """Into the offline buffer, under the lock. Full: the oldest message goes."""
        if self.config.buffer_messages == 0:
            self._drop(message.kind)
            return
        if len(self._buffer) >= self.config.buffer_messages:
            self._drop(self._buffer.popleft().kind)
        self._buffer.append(message)

    def _published(self, kind: str) -> None:
        self._stats.published += 1
        self._stats.published_by_class[kind] = self._stats.published_by_class.get(kind, 0) + 1

    def _drop(self, kind: str) -> None:
        self._stats.dropped += 1
        self._stats.dropped_by_class[kind] = self._stats.dropped_by_class.get(kind, 0) + 1

    # -- inbound -----------------------------------------------------------------------------
    def subscribe(self, topic_filter: str, handler: Handler) -> None:
        """Call `handler(topic, payload)` on paho's thread for each message on `topic_filter`
        (kept across reconnects). Handlers must be quick and must not raise on bad input;
        an exception is logged and counted, never fatal."""
        with self._lock:
            self._handlers[topic_filter] = handler
            if self._session:  # else _on_connect subscribes it, now or at the next connect
                self._subscribe_locked([topic_filter])

    def subscribe_messages(self, topic_filter: str, handler: MessageHandler) -> None:
        """subscribe(), the handler taking paho's whole message (MQTT 5 properties: a
        request's response topic and correlation data)."""
        with self._lock:
            self._whole[topic_filter] = handler
        self.subscribe(topic_filter, _whole_message)

    def reply(self, topic: str, payload: bytes, properties: Properties) -> bool:
        """Publish an answer (QoS 1, with its MQTT 5 properties) now; False when there is no
        connection (an answer is not kept for later: the asker has given up by then)."""
        with self._lock:
            if self._stopping or not self._connected.is_set():
                self._drop("replies")
                return False
        info = self._client.publish(topic, payload, 1, False, properties)
        with self._lock:
            if info.rc == MQTTErrorCode.MQTT_ERR_SUCCESS:
                self._published("replies")
                return True
            self._drop("replies")
            return False

    def subscribed(self, filters: list[str]) -> bool:
        """Whether the broker has confirmed (SUBACK) each of `filters` on this connection."""
        with self._lock:
            return set(filters) <= self._confirmed

    def wait_subscribed(self, filters: list[str], timeout_s: float) -> bool:
        """Wait until the broker has confirmed each of `filters` on the current connection."""
        with self._acked:
            return self._acked.wait_for(lambda: set(filters) <= self._confirmed, timeout_s)

    def unsubscribe(self, topic_filter: str) -> None:
        """Stop delivering `topic_filter` (a stream removed by a reload)."""
        with self._lock:
            known = self._handlers.pop(topic_filter, None) is not None
            self._whole.pop(topic_filter, None)
            self._confirmed.discard(topic_filter)
            if known and self._session:
                self._client.unsubscribe(topic_filter)

    def _subscribe_locked(self, filters: list[str]) -> None:
        """SUBSCRIBE, remembering its packet id (under _lock: the SUBACK, handled on paho's
        thread, cannot come before it is remembered)."""
        rc, mid = self._client.subscribe([(f, 1) for f in filters])
        if rc == MQTTErrorCode.MQTT_ERR_SUCCESS and mid is not None:
            self._pending[mid] = filters

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reason_codes: Any,
                      properties: Any) -> None:
        with self._acked:
            filters = self._pending.pop(mid, [])
            for topic_filter, code in zip(filters, reason_codes, strict=False):
                if code.is_failure:
                    logger.warning("MQTT: the broker refused the subscription to %s: %s",
                                   topic_filter, code, extra={"code": "mqtt_subscribe_refused"})
                elif topic_filter in self._handlers:
                    self._confirmed.add(topic_filter)
            self._acked.notify_all()

    def _on_message(self, client: paho.Client, userdata: Any, message: paho.MQTTMessage) -> None:
        with self._lock:
            self._stats.received += 1
            handlers = [(h, self._whole.get(f)) for f, h in self._handlers.items()
                        if paho.topic_matches_sub(f, message.topic)]
        for handler, whole in handlers:
            try:
                if whole is not None:
                    whole(message)
                else:
                    handler(message.topic, bytes(message.payload))
            except Exception:  # a handler's bug must not kill paho's network thread
                with self._lock:
                    self._stats.handler_errors += 1
                logger.exception("MQTT handler for %s failed", message.topic)

    # -- connection events (paho's thread) ---------------------------------------------------
    def on_connected(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after each connection, once the buffered messages went out (to
        publish retained state again: a broker restarted without persistence lost it). It
        runs on paho's thread: it must be quick, and must not raise."""
        with self._lock:
            self._on_connected.append(callback)

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any,
                    properties: Any) -> None:
        if reason.is_failure:
            self._attempt_failed(f"the broker refused it: {reason}")
            return
        with self._lock:
            self._stats.connects += 1
            self._stats.connected = True
            failures, self._failures, self._last_failure = self._failures, 0, None
            # Every connect subscribes every filter again (a restarted broker kept nothing),
            # in the same locked step that opens the session to subscribe() calls.
            self._session, self._confirmed, self._pending = True, set(), {}
            if self._handlers:
                self._subscribe_locked(list(self._handlers))
        logger.info("MQTT: connected to %s:%d%s", self.config.host, self.config.port,
                    f" after {failures} failed attempt(s)" if failures else "")
        client.publish(self.status_topic, b"online", qos=1, retain=True)
        self._connected.set()
        self._flush()
        with self._lock:
            callbacks = list(self._on_connected)
        for callback in callbacks:
            try:
                callback()
            except Exception:  # a callback's bug must not kill paho's network thread
                logger.exception("MQTT: a connection callback failed")

    def _flush(self) -> None:
        """The offline buffer, oldest first; what is published meanwhile joins its end."""
        with self._lock:
            self._flushing = True
        try:
            while self._connected.is_set():
                with self._lock:
                    if not self._buffer:
                        self._flushing = False  # (in the step that saw it empty)
                        return
                    message = self._buffer.popleft()
                self._send(message)
        finally:
            with self._lock:
                self._flushing = False

    def _on_connect_fail(self, client: paho.Client, userdata: Any) -> None:
        """paho calls this inside its `except OSError` around a connection attempt (refused,
        unreachable, name not found, TLS): the exception being handled says why."""
        self._attempt_failed(describe_os_error(sys.exc_info()[1]))

    def _attempt_failed(self, why: str) -> None:
        """One failed attempt: a warning when the reason is new (the first, or a change), the
        same reason again at debug level, with when paho tries next."""
        with self._lock:
            self._stats.failed_connects += 1
            self._failures += 1
            repeated = why == self._last_failure
            self._last_failure = why
            delay = min(RECONNECT_MIN_S * 2 ** (self._failures - 1), RECONNECT_MAX_S)
        (logger.debug if repeated else logger.warning)(
            "MQTT: cannot connect to %s:%d: %s; next attempt in %g s (backing off to every "
            "%g s)", self.config.host, self.config.port, why, delay, RECONNECT_MAX_S,
            extra={"code": "mqtt_connect_failed"})

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason: Any,
                       properties: Any) -> None:
        self._connected.clear()
        with self._lock:
            self._session, self._confirmed, self._pending = False, set(), {}
            was = self._stats.connected
            self._stats.connected = False
            if was:
                self._stats.disconnects += 1
            stopping = self._stopping
        if was and not stopping:  # a refused attempt ends here too: _attempt_failed said so
            logger.warning("MQTT: connection to %s:%d lost (%s); reconnecting",
                           self.config.host, self.config.port, reason)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            s = self._stats
            return {"connected": s.connected, "published": s.published,
                    "published_by_class": dict(s.published_by_class),
                    "buffered": len(self._buffer), "dropped": s.dropped,
                    "dropped_by_class": dict(s.dropped_by_class), "connects": s.connects,
                    "disconnects": s.disconnects, "failed_connects": s.failed_connects,
                    "received": s.received,
                    "handler_errors": s.handler_errors}


def describe_os_error(exc: BaseException | None) -> str:
    """Why a connection attempt failed, in words an operator can act on."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: the broker's certificate is not trusted ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is a broker listening on that port?)"
    if isinstance(exc, socket.gaierror):
        return f"host name not found ({exc.strerror})"
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out (a firewall, or the wrong host?)"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return "unknown reason"


def _opt(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _whole_message(topic: str, payload: bytes) -> None:
    """The handler registered for a filter whose real one takes the whole message."""
