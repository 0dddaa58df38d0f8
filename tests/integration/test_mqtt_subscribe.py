"""Subscriptions of the MQTT link against a real mosquitto: one made while the broker's
CONNACK is being handled is not lost, each is confirmed by the broker before the link says
so, and after a broker restart the daemon's OTA topics are subscribed and work again."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer
from support.broker import Broker, Subscriber
from support.daemon import ServeFactory
from support.ota import Pusher, statuses, tiny_cls_bytes
from support.polling import wait_until

from edged.mqtt.config import MqttConfig
from edged.mqtt.link import MqttLink


@pytest.fixture
def link(broker: Broker) -> Iterator[MqttLink]:
    made = MqttLink(MqttConfig(host="127.0.0.1", port=broker.port), prefix="t/race",
                    client_id="edged-race")
    yield made
    made.stop(timeout_s=1)


def test_mqtt_link_when_subscribing_while_the_connack_is_handled_still_subscribes(
        broker: Broker, link: MqttLink) -> None:
    """The start-up race of issue 20 #12, made to happen every time: the subscription comes
    from another thread exactly while paho's thread is inside the link's on-connect."""
    topic = "t/race/ota/in"
    other = Subscriber(broker, "t/race/unused")
    other.client.publish(topic, b"waiting", qos=1, retain=True).wait_for_publish(5)
    inside, go_on = threading.Event(), threading.Event()
    publish = link._client.publish

    def held_in_on_connect(topic: str, payload: Any = None, *args: Any, **kwargs: Any) -> Any:
        if payload == b"online":  # on-connect announces the link: hold it there
            inside.set()
            go_on.wait(10)
        return publish(topic, payload, *args, **kwargs)

    link._client.publish = held_in_on_connect  # type: ignore[method-assign]
    got: list[bytes] = []
    try:
        link.start()
        assert inside.wait(10), "the link never connected"
        link.subscribe(topic, lambda _topic, payload: got.append(payload))
        go_on.set()
        # the retained message arrives once the subscription is made (it was lost before)
        wait_until(lambda: got, timeout=10, what=f"the retained message on {topic}")
        assert got == [b"waiting"]
        assert link.wait_subscribed([topic], 10) and link.subscribed([topic])
    finally:
        go_on.set()
        other.client.publish(topic, b"", qos=1, retain=True).wait_for_publish(5)
        other.close()


def test_ota_when_the_broker_restarts_subscribes_again_and_takes_updates(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    private, public = key
    prefix = "t/restart-ota/dev"
    status = f"{prefix}/ota/tiny_cls/status"
    served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                         ota=f"trusted_keys: [{public}]")
    ota, mqtt = served.daemon.ota, served.daemon.mqtt
    assert ota is not None and mqtt is not None
    assert ota.wait_listening(10)
    assert served.daemon.status_report()["ota"] == {"listening": True, "shadows": {}}
    try:
        broker.stop()
        wait_until(lambda: not ota.listening and not mqtt.connected, timeout=10,
                   what="the daemon noticed the broker is gone")
        assert served.daemon.status_report()["ota"] == {"listening": False, "shadows": {}}
    finally:
        if broker.process is None:
            broker.start()
    assert ota.wait_listening(40)  # paho's reconnect backoff is capped at 30 s
    sub = Subscriber(broker, status)
    try:
        Pusher(sub, artifacts, private).push(f"{prefix}/ota/tiny_cls", 2, tiny_cls_bytes(1))
        assert statuses(sub, status, "active")[-1]["version"] == 2
    finally:
        sub.close()
