"""OTA through a real mosquitto and the daemon in-process: a signed manifest on the device's
topic goes live with its status events (the final one retained), a fleet push reaches the
device too, a rejected one says why on the status topic, and a signed rollback command
brings the old version back."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import make_test_models
import numpy as np
import pytest
from artifact_server import ArtifactServer, artifacts  # noqa: F401
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from mosquitto import Broker, Subscriber
from served_daemon import ServeFactory

from edged.ota.manifest import sign_document

X = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)


def statuses(sub: Subscriber, topic: str, until: str, timeout: float = 30) -> list[dict]:
    got: list[dict] = []
    deadline = time.monotonic() + timeout
    while not got or got[-1]["state"] != until:
        message = sub.wait_for(topic, max(0.1, deadline - time.monotonic()))
        got.append(json.loads(message.payload))
    return got


@pytest.fixture
def key(tmp_path: Path) -> tuple[Ed25519PrivateKey, Path]:
    private = Ed25519PrivateKey.generate()
    public = tmp_path / "fleet.pub"
    public.write_bytes(private.public_key().public_bytes(Encoding.PEM,
                                                         PublicFormat.SubjectPublicKeyInfo))
    return private, public


def test_ota_over_mqtt_when_pushed_goes_live_reports_and_rolls_back_on_command(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,  # noqa: F811
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    private, public = key
    prefix, fleet = "t/ota/dev1", "t/ota/fleet"
    status = f"{prefix}/ota/tiny_cls/status"
    sub = Subscriber(broker, status)
    try:
        served = make_served(
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, fleet_prefix: {fleet}",
            ota=f"trusted_keys: [{public}]")
        assert served.daemon.mqtt is not None and served.daemon.mqtt.wait_connected(10)
        with served.client() as client:
            before = client.infer("tiny_cls", {"x": X}).outputs["prob"]

        def push(topic: str, version: int, data: bytes, **extra: object) -> None:
            (artifacts.root / f"v{version}").write_bytes(data)
            doc = sign_document({"model": "tiny_cls", "version": version, "format": "onnx",
                                 "artifact": {"url": artifacts.url(f"v{version}"),
                                              "size": len(data),
                                              "sha256": hashlib.sha256(data).hexdigest()},
                                 **extra}, private)
            sub.client.publish(topic, json.dumps(doc).encode(), qos=1).wait_for_publish(5)

        v2 = make_test_models.make_tiny_cls(1).SerializeToString()
        first = None
        for _ in range(20):  # until the daemon's subscription is in place (a repeat is a no-op)
            push(f"{prefix}/ota/tiny_cls", 2, v2)
            try:
                first = json.loads(sub.wait_for(status, 0.5).payload)
                break
            except Exception:
                continue
        assert first is not None and first["state"] == "received"
        events = [first, *statuses(sub, status, "active")]
        assert [e["state"] for e in events if e["state"] != "downloading"] == [
            "received", "verifying", "installing", "warming", "active"]
        with served.client() as client:
            after = client.infer("tiny_cls", {"x": X}).outputs["prob"]
        assert not np.allclose(before, after)

        push(f"{fleet}/ota/tiny_cls", 3, make_test_models.make_tiny_cls(2).SerializeToString())
        assert statuses(sub, status, "active")[-1]["version"] == 3

        push(f"{prefix}/ota/tiny_cls", 1, b"whatever")  # older than the active one
        failed = statuses(sub, status, "failed")[-1]
        assert failed["reason"] == "downgrade" and failed["version"] == 1

        command = sign_document({"model": "tiny_cls", "action": "rollback"}, private)
        sub.client.publish(f"{prefix}/ota/tiny_cls/command", json.dumps(command).encode(),
                           qos=1).wait_for_publish(5)
        rolled = statuses(sub, status, "rolled_back")[-1]
        assert rolled["version"] == 2
        unsigned = {"model": "tiny_cls", "action": "rollback"}
        sub.client.publish(f"{prefix}/ota/tiny_cls/command", json.dumps(unsigned).encode(),
                           qos=1).wait_for_publish(5)
        assert statuses(sub, status, "failed")[-1]["reason"] == "unsigned"
        with served.client() as client:
            np.testing.assert_allclose(client.infer("tiny_cls", {"x": X}).outputs["prob"],
                                       after, rtol=1e-5)
    finally:
        sub.close()
    late = Subscriber(broker, status)  # the last final state stays retained
    try:
        assert json.loads(late.wait_for(status, 10).payload)["state"] == "rolled_back"
    finally:
        late.close()
