"""Oversized MQTT payloads on the OTA topics, sent through a real mosquitto to the daemon
in-process: refused by their size before anything parses them, and with MQTT 5 not even
delivered past the Maximum Packet Size the daemon announces at connect."""

from __future__ import annotations

import json
import queue
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.broker import Broker, Subscriber
from support.daemon import ServeFactory
from support.ota import X, command, statuses
from support.polling import wait_until

from edged.ota.manifest import MAX_COMMAND_BYTES, MAX_MANIFEST_BYTES, sign_document


def listening(sub: Subscriber, prefix: str, status: str) -> None:
    """Until the daemon answers on its command topic (its OTA subscriptions are in place)."""
    def answered() -> bool:
        sub.client.publish(f"{prefix}/ota/tiny_cls/command", b"probe", qos=1).wait_for_publish(5)
        try:
            event = json.loads(sub.wait_for(status, 0.5).payload)
        except queue.Empty:
            return False
        return event.get("reason") == "bad_command"

    wait_until(answered, timeout=30, interval=0, what="the OTA command topic answering")


def padded(document: dict, size: int) -> bytes:
    """`document` as JSON with whitespace after it up to `size` bytes: still valid JSON."""
    raw = json.dumps(document).encode()
    return raw + b" " * (size - len(raw))


def test_ota_when_a_manifest_or_command_is_oversized_refuses_it_unparsed(
        broker: Broker, make_served: ServeFactory,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    private, public = key
    prefix = "t/bounds/dev"
    status = f"{prefix}/ota/tiny_cls/status"
    sub = Subscriber(broker, status)
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                             ota=f"trusted_keys: [{public}]")
        listening(sub, prefix, status)
        manifest = sign_document({"model": "tiny_cls", "version": 7, "format": "onnx",
                                  "artifact": {"url": "http://127.0.0.1:9/m", "size": 10,
                                               "sha256": "0" * 64}}, private)
        sub.client.publish(f"{prefix}/ota/tiny_cls", padded(manifest, MAX_MANIFEST_BYTES + 1),
                           qos=1).wait_for_publish(5)
        refused = statuses(sub, status, "failed")[-1]
        # version 0: the padded manifest was not parsed to find its version
        assert refused["reason"] == "bad_manifest" and refused["version"] == 0
        assert "limit" in refused["detail"]

        # a good, signed rollback command, padded: refused by its size, so nothing rolls back
        rollback = command(private, f"{prefix}", "tiny_cls")
        sub.client.publish(f"{prefix}/ota/tiny_cls/command",
                           padded(rollback, MAX_COMMAND_BYTES + 1), qos=1).wait_for_publish(5)
        refused = statuses(sub, status, "failed")[-1]
        assert refused["reason"] == "bad_command" and "limit" in refused["detail"]
        with served.client() as client:
            assert client.infer("tiny_cls", {"x": X}).version == "1"
    finally:
        sub.close()


def test_mqtt5_link_when_a_packet_exceeds_max_packet_mb_the_broker_never_delivers_it(
        broker: Broker, make_served: ServeFactory,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    _private, public = key
    prefix = "t/bounds/packet"
    status = f"{prefix}/ota/tiny_cls/status"
    sub = Subscriber(broker, status)
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, "
                                  "protocol: '5', max_packet_mb: 1",
                             ota=f"trusted_keys: [{public}]")
        listening(sub, prefix, status)
        assert served.daemon.mqtt is not None
        received = served.daemon.mqtt.stats()["received"]
        # 2 MB on the manifest topic, then a small message on the command topic: the daemon
        # sees only the small one (the broker drops the big one for this client).
        sub.client.publish(f"{prefix}/ota/tiny_cls", b" " * (2 << 20), qos=1).wait_for_publish(10)
        sub.client.publish(f"{prefix}/ota/tiny_cls/command", b"after", qos=1).wait_for_publish(5)
        events = statuses(sub, status, "failed")
        assert [e["reason"] for e in events] == ["bad_command"]
        assert served.daemon.mqtt.stats()["received"] == received + 1
    finally:
        sub.close()
