"""MQTT 5 callers of edged's request/response inference: `Requester`, a real paho client that
publishes KServe bodies with a response topic and correlation data and waits for each answer
by its correlation data; and, run as a module, a load of N such clients in a process of its
own (`python -m support.mqtt_requests PORT PREFIX MODEL CLIENTS SECONDS`), as remote callers
are: it prints how many answers each client had, by status."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Answer:
    payload: bytes
    properties: dict[str, str]  # the user properties
    content_type: str | None

    @property
    def status(self) -> int:
        return int(self.properties["status"])

    def json(self) -> Any:
        return json.loads(self.payload)


class Requester:
    """One caller: answers come on `replies/<name>/answers` (what its allowlist entry names)."""

    def __init__(self, port: int, name: str, *, reply_topic: str | None = None) -> None:
        self.reply_topic = reply_topic or f"replies/{name}/answers"
        self._arrived = threading.Condition()
        self._answers: dict[bytes, Answer] = {}
        self.other: list[Answer] = []  # answers without correlation data
        self.all: dict[bytes, list[Answer]] = {}  # every message per correlation (streams)
        self._next = 0
        self.client = paho.Client(CallbackAPIVersion.VERSION2,
                                  client_id=f"req-{name}-{time.monotonic_ns()}",
                                  protocol=paho.MQTTv5)
        subscribed = threading.Event()
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *args: subscribed.set()
        self.client.on_connect = lambda c, *a: c.subscribe(self.reply_topic, qos=1)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        if not subscribed.wait(10):
            raise TimeoutError("the requester's subscription was not confirmed in 10 s")

    def _on_message(self, client: paho.Client, userdata: object,
                    message: paho.MQTTMessage) -> None:
        props = message.properties
        answer = Answer(bytes(message.payload), dict(getattr(props, "UserProperty", []) or []),
                        getattr(props, "ContentType", None))
        correlation = getattr(props, "CorrelationData", None)
        with self._arrived:
            if correlation is None:
                self.other.append(answer)
            else:
                self._answers[bytes(correlation)] = answer
                self.all.setdefault(bytes(correlation), []).append(answer)
            self._arrived.notify_all()

    def ask(self, topic: str, body: bytes, *, json_length: int | str | None = None,
            response_topic: str | None = None, correlation: bytes | None = None) -> bytes:
        """Publish one request; returns its correlation data. `json_length` goes out as the
        user property's text (a str as it is: a test's malformed one)."""
        self._next += 1
        correlation = correlation if correlation is not None else f"c{self._next}".encode()
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = response_topic or self.reply_topic
        props.CorrelationData = correlation
        if json_length is not None:
            props.UserProperty = [(HEADER_LENGTH, str(json_length))]
        self.client.publish(topic, body, qos=1, properties=props).wait_for_publish(10)
        return correlation

    def answer(self, correlation: bytes, timeout: float = 20.0) -> Answer:
        with self._arrived:
            if not self._arrived.wait_for(lambda: correlation in self._answers, timeout):
                raise TimeoutError(f"no answer to {correlation!r} in {timeout:g} s")
            return self._answers.pop(correlation)

    def stream(self, correlation: bytes, done: Any, timeout: float = 20.0) -> list[Answer]:
        """Every message with `correlation` until one satisfies `done` (a final one)."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: any(
                    done(a) for a in self.all.get(correlation, [])), timeout):
                raise TimeoutError(f"no final message for {correlation!r} in {timeout:g} s")
            return self.all.pop(correlation)

    def call(self, topic: str, body: bytes, timeout: float = 20.0, **kwargs: Any) -> Answer:
        return self.answer(self.ask(topic, body, **kwargs), timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def tensor_request(x: np.ndarray, *, binary: bool, name: str = "x",
                   **kwargs: Any) -> tuple[bytes, int | None]:
    """A KServe body as tritonclient builds it (its own request encoder), and its JSON length
    when binary tensors follow."""
    import tritonclient.http as triton

    tensor = triton.InferInput(name, list(x.shape), "FP32" if x.dtype == np.float32 else "UINT8")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = kwargs.pop("outputs", None)
    body, json_size = triton.InferenceServerClient.generate_request_body([tensor], outputs,
                                                                         **kwargs)
    return body, json_size


def load(port: int, prefix: str, model: str, clients: int, seconds: float) -> dict[str, Any]:
    """`clients` callers asking `model` (the demo's colors: one 64x64 RGB image) one request
    after another for `seconds`."""
    x = np.random.default_rng(1).random((1, 3, 64, 64), dtype=np.float32)
    body, json_length = tensor_request(x, binary=True, name="image")
    counts = [Counter[int]() for _ in range(clients)]
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        requester = Requester(port, f"load-{i}")
        try:
            while time.monotonic() < stop:
                try:
                    answer = requester.call(f"{prefix}/infer/{model}", body,
                                            json_length=json_length, timeout=10)
                except TimeoutError:
                    counts[i][0] += 1
                    continue
                counts[i][answer.status] += 1
        finally:
            requester.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(seconds + 30)
    return {"clients": [dict(c) for c in counts]}


if __name__ == "__main__":
    port, prefix, model, clients, seconds = sys.argv[1:6]
    print(json.dumps(load(int(port), prefix, model, int(clients), float(seconds))))
