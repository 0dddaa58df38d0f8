"""MQTT 5 request/response inference (mqtt.requests, off by default): a client on any broker
the device reaches publishes a KServe v2 body to `<prefix>/infer/<model>` with a response topic
and correlation data (MQTT 5 properties; the binary form's JSON length as the user property
`Inference-Header-Content-Length`), and the answer comes back on its response topic with the
same correlation data: the body the socket API would answer, or `{"error", "code"}` with the
socket API's codes (its text with no path of the device: the api room's `describe`), and the
HTTP status it would have as the user property `status`.

Who may ask: a request's response topic must match a client's filters in the allowlist
(mqtt.requests.clients); one that matches none gets no answer at all (MQTT carries no sender
identity: the broker's ACL, which lets only that client read its replies, makes the response
topic the client's). Each client has a token-bucket rate; a request body is bounded
(max_request_mb, and mqtt.max_packet_mb at the broker); at most max_in_flight requests are
decoded, queued or run at once. The inference itself is the api room's (edged/api/remote.py):
the scheduler's priorities, so a stream's frames keep theirs.

The MQTT thread only checks and hands over; decoding and encoding run on `workers` threads."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edged.core.errors import (
    EdgedError,
    Forbidden,
    InvalidInput,
    Overloaded,
    RateLimited,
    TooLarge,
)
from edged.core.numbers import ascii_int
from edged.mqtt import topics
from edged.mqtt.config import RequestClient, RequestsConfig
from edged.mqtt.link import MqttLink

logger = logging.getLogger(__name__)

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_WARNED = 64  # response topics refused that are logged (the rest only counted)


class Answer(Protocol):
    @property
    def body(self) -> bytes: ...

    @property
    def json_length(self) -> int | None: ...  # where the JSON ends when binary data follows


class Call(Protocol):
    future: Future[Any]

    def answer(self) -> Answer: ...


class Inference(Protocol):
    """What the api room lends (edged.api.remote.RemoteInference)."""

    def start(self, model: str, body: bytes, json_length: int | None) -> Call: ...

    def describe(self, exc: EdgedError) -> str: ...  # the error's text for a remote caller


class Generate(Protocol):
    """What the api room lends for prompts (edged.api.remote_generate.RemoteGenerate):
    `send(payload, status, final)` is called with each message to publish, on the model's
    worker thread."""

    def start(self, model: str, body: bytes, send: Callable[[bytes, int, bool], None]
              ) -> None: ...


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate_per_s, float(burst), clock
        self.tokens = float(burst)
        self.stamp = clock()
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self.clock()
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now
            if self.tokens < 1:
                return False
            self.tokens -= 1
            return True


@dataclass(frozen=True)
class _Reply:
    topic: str
    correlation: bytes | None
    client: str
    model: str


class RemoteRequests:
    def __init__(self, link: MqttLink, config: RequestsConfig, inference: Inference, *,
                 generate: Generate | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`generate`: prompts to language models on `<prefix>/generate/<model>` (None: no
        such topic is taken)."""
        self.link = link
        self.config = config
        self.inference = inference
        self.generate = generate
        self.filter = link.topic(topics.INFER_FILTER)
        self.generate_filter = link.topic(topics.GENERATE_FILTER)
        self._buckets = {c.name: TokenBucket(config.rate_per_s, config.burst, clock)
                         for c in config.clients}
        self._executor = ThreadPoolExecutor(config.workers, thread_name_prefix="edged-mqtt-req")
        self._lock = threading.Lock()
        self._in_flight = 0
        self._warned: set[str] = set()
        self.counts: dict[str, int] = {"received": 0, "answered": 0, "no_response_topic": 0,
                                       "not_allowed": 0}
        self.errors: dict[str, int] = {}  # answered with an error, by code

    def start(self) -> None:
        self.link.subscribe_messages(self.filter, self._on_request)
        if self.generate is not None:
            self.link.subscribe_messages(self.generate_filter, self._on_request)
        logger.info("MQTT requests: answering on %s for %d client(s)", self.filter,
                    len(self.config.clients))

    def stop(self, timeout_s: float) -> None:
        """Stop taking requests; those being decoded finish (bounded by the caller's drain)."""
        self.link.unsubscribe(self.filter)
        if self.generate is not None:
            self.link.unsubscribe(self.generate_filter)
        self._executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {**self.counts, "in_flight": self._in_flight, "errors": dict(self.errors)}

    # -- paho's thread: check and hand over, never raise -------------------------------------
    def _on_request(self, message: paho.MQTTMessage) -> None:
        props = getattr(message, "properties", None)
        response_topic = getattr(props, "ResponseTopic", None)
        self._count("received")
        if not response_topic:
            self._count("no_response_topic")
            return  # nowhere to answer
        client = self._client_for(response_topic)
        if client is None:
            self._count("not_allowed")
            self._warn_once(response_topic)
            return  # no answer at all: the allowlist is not a service to outsiders
        model = message.topic.rsplit("/", 1)[1]
        correlation = getattr(props, "CorrelationData", None)
        reply = _Reply(response_topic, correlation, client.name, model)
        try:
            self._admit(client, model, len(message.payload))
        except EdgedError as exc:
            self._fail(reply, exc)
            return
        try:  # after the rate: a malformed request costs its token like any other
            json_length = _json_length(props)
        except EdgedError as exc:
            self._release()
            self._fail(reply, exc)
            return
        payload = bytes(message.payload)
        prompt = message.topic.rsplit("/", 2)[-2] == "generate"
        try:
            if prompt:
                self._executor.submit(self._run_prompt, reply, payload)
            else:
                self._executor.submit(self._run, reply, payload, json_length)
        except RuntimeError:  # stopping
            self._release()

    def _client_for(self, response_topic: str) -> RequestClient | None:
        for client in self.config.clients:
            if any(paho.topic_matches_sub(f, response_topic) for f in client.response_topics):
                return client
        return None

    def _admit(self, client: RequestClient, model: str, size: int) -> None:
        """Raises what the request is answered with instead; else counts it in flight."""
        if client.models and model not in client.models:
            raise Forbidden(f"client {client.name} may not call model {model!r}")
        limit = self.config.max_request_mb * 1024 * 1024
        if size > limit:
            raise TooLarge(f"the request's {size} bytes exceed the {limit} taken over MQTT "
                           "(mqtt.requests.max_request_mb)")
        if not self._buckets[client.name].take():
            raise RateLimited(f"client {client.name} asks more than "
                              f"{self.config.rate_per_s:g} requests/s "
                              "(mqtt.requests.rate_per_s)")
        with self._lock:
            if self._in_flight >= self.config.max_in_flight:
                raise Overloaded(f"{self._in_flight} MQTT requests are in flight "
                                 "(mqtt.requests.max_in_flight): retry later")
            self._in_flight += 1

    # -- the workers -------------------------------------------------------------------------
    def _run(self, reply: _Reply, payload: bytes, json_length: int | None) -> None:
        try:
            call = self.inference.start(reply.model, payload, json_length)
        except EdgedError as exc:
            self._release()
            self._fail(reply, exc)
            return
        except Exception as exc:  # a bug: one request fails, the service goes on
            logger.exception("MQTT request for %s failed", reply.model)
            self._release()
            self._fail(reply, EdgedError(f"internal error: {exc}"))
            return

        def done(_future: Future[Any]) -> None:  # on the model's worker: hand back
            try:
                self._executor.submit(self._finish, reply, call)
            except RuntimeError:  # stopping: answer from here
                self._finish(reply, call)

        call.future.add_done_callback(done)

    def _run_prompt(self, reply: _Reply, payload: bytes) -> None:
        """A prompt: its messages are published as the model's worker makes them, each with
        the request's correlation data; the last says `"final": true`."""
        assert self.generate is not None

        def send(body: bytes, status: int, final: bool) -> None:
            props = self._properties(reply, status)
            props.ContentType = "application/json"
            published = self.link.reply(reply.topic, body, props)
            if final:
                self._release()
                if status == 200 and published:
                    self._count("answered")
                elif status != 200:
                    code = json.loads(body).get("code", str(status))
                    with self._lock:
                        self.errors[code] = self.errors.get(code, 0) + 1

        try:
            self.generate.start(reply.model, payload, send)
        except EdgedError as exc:
            self._release()
            self._fail(reply, exc)
        except Exception as exc:  # a bug: one request fails, the service goes on
            logger.exception("MQTT prompt for %s failed", reply.model)
            self._release()
            self._fail(reply, EdgedError(f"internal error: {exc}"))

    def _finish(self, reply: _Reply, call: Call) -> None:
        try:
            answer = call.answer()
        except EdgedError as exc:
            self._fail(reply, exc)
            return
        except Exception as exc:
            logger.exception("MQTT request for %s failed", reply.model)
            self._fail(reply, EdgedError(f"internal error: {exc}"))
            return
        finally:
            self._release()
        props = self._properties(reply, 200)
        if answer.json_length is not None:
            props.UserProperty = [("status", "200"), (HEADER_LENGTH, str(answer.json_length))]
            props.ContentType = "application/octet-stream"
        else:
            props.ContentType = "application/json"
        if self.link.reply(reply.topic, answer.body, props):
            self._count("answered")

    # -- answers -----------------------------------------------------------------------------
    def _fail(self, reply: _Reply, exc: EdgedError) -> None:
        with self._lock:
            self.errors[exc.code] = self.errors.get(exc.code, 0) + 1
        props = self._properties(reply, exc.http_status)
        props.ContentType = "application/json"
        body = json.dumps({"error": self.inference.describe(exc), "code": exc.code}).encode()
        self.link.reply(reply.topic, body, props)

    @staticmethod
    def _properties(reply: _Reply, status: int) -> Properties:
        props = Properties(PacketTypes.PUBLISH)
        if reply.correlation is not None:
            props.CorrelationData = reply.correlation
        props.UserProperty = [("status", str(status))]
        return props

    def _release(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def _count(self, key: str) -> None:
        with self._lock:
            self.counts[key] += 1

    def _warn_once(self, topic: str) -> None:
        with self._lock:
            if topic in self._warned or len(self._warned) >= MAX_WARNED:
                return
            self._warned.add(topic)
        logger.warning("MQTT request with response topic %s: no client in "
                       "mqtt.requests.clients has it; not answered", topic,
                       extra={"code": "mqtt_request_not_allowed"})


def _json_length(props: Any) -> int | None:
    """The binary form's JSON length: ASCII digits (edged.core.numbers), else invalid_input."""
    for key, value in getattr(props, "UserProperty", None) or []:
        if key.lower() == HEADER_LENGTH.lower():
            length = ascii_int(value)
            if length is None:
                raise InvalidInput(f"{HEADER_LENGTH} must be a length in ASCII digits, got "
                                   f"{value[:32]!r}")
            return length
    return None
