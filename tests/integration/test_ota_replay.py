"""Replays of signed OTA messages, sent the way an attacker on the broker would, through a
real mosquitto to the daemon in-process: an old manifest republished after a rollback, a
rollback command sent again, a device's message moved to the fleet topic, an expired or an
unfresh one. Each is refused with its reason on the status topic and nothing on disk
changes (edged/ota/freshness.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer
from support.broker import Broker, Subscriber
from support.daemon import Served, ServeFactory
from support.ota import Pusher, X, active, command, statuses, tiny_cls_bytes

from edged.ota.manifest import sign_document

PREFIX, FLEET = "t/replay/dev", "t/replay/fleet"
STATUS = f"{PREFIX}/ota/tiny_cls/status"
MANIFESTS, COMMANDS = f"{PREFIX}/ota/tiny_cls", f"{PREFIX}/ota/tiny_cls/command"


def snapshot(models: Path) -> dict[str, bytes]:
    """Every file of the repository (staging aside) with its content."""
    return {str(p.relative_to(models)): p.read_bytes() for p in sorted(models.rglob("*"))
            if p.is_file() and ".staging" not in p.parts}


def serving(served: Served) -> str:
    with served.client() as client:
        return client.infer("tiny_cls", {"x": X}).version


class Device:
    def __init__(self, served: Served, sub: Subscriber, pusher: Pusher, models: Path) -> None:
        self.served, self.sub, self.pusher, self.models = served, sub, pusher, models

    def update(self, version: int) -> bytes:
        """Push `version` of tiny_cls to the device until active; returns the manifest sent."""
        payload = self.pusher.signed(MANIFESTS, version, tiny_cls_bytes(version - 1))
        self.pusher.publish(MANIFESTS, payload)
        active(self.sub, STATUS, version)
        return payload

    def refuses(self, topic: str, payload: bytes, reason: str) -> None:
        """`payload` on `topic` is refused with `reason`, and the repository stays as it was."""
        before = snapshot(self.models)
        version = serving(self.served)
        self.pusher.publish(topic, payload)
        refused = statuses(self.sub, STATUS, "failed")[-1]
        assert refused["reason"] == reason, refused
        assert snapshot(self.models) == before
        assert serving(self.served) == version


@pytest.fixture
def device(broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
           key: tuple[Ed25519PrivateKey, Path], repo_dir: Path) -> Device:
    private, public = key
    sub = Subscriber(broker, STATUS)
    served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {PREFIX}, "
                              f"fleet_prefix: {FLEET}", ota=f"trusted_keys: [{public}]")
    pusher = Pusher(sub, artifacts, private)
    first = pusher.push_until_received(MANIFESTS, STATUS, 2, tiny_cls_bytes(1))
    assert first["version"] == 2 and statuses(sub, STATUS, "active")[-1]["version"] == 2
    try:
        yield Device(served, sub, pusher, repo_dir)
    finally:
        sub.close()


def test_ota_when_an_old_manifest_is_replayed_after_a_rollback_refuses_it(
        device: Device, key: tuple[Ed25519PrivateKey, Path]) -> None:
    v3 = device.update(3)
    device.pusher.publish(COMMANDS, json.dumps(command(key[0], PREFIX)).encode())
    assert statuses(device.sub, STATUS, "rolled_back")[-1]["version"] == 2
    assert serving(device.served) == "2"
    device.refuses(MANIFESTS, v3, "replayed")  # it used to reinstall version 3


def test_ota_when_a_rollback_command_is_replayed_refuses_it(
        device: Device, key: tuple[Ed25519PrivateKey, Path]) -> None:
    device.update(3)
    rollback = json.dumps(command(key[0], PREFIX)).encode()  # no from_version
    device.pusher.publish(COMMANDS, rollback)
    assert statuses(device.sub, STATUS, "rolled_back")[-1]["version"] == 2
    # it used to walk the device back to 1 and delete version 2
    device.refuses(COMMANDS, rollback, "replayed")
    assert device.served.daemon.cache.repository.versions_on_disk("tiny_cls") == [1, 2]


def test_ota_when_a_device_message_comes_on_the_fleet_topic_refuses_it(
        device: Device, key: tuple[Ed25519PrivateKey, Path]) -> None:
    for_device = device.pusher.signed(MANIFESTS, 3, tiny_cls_bytes(2))
    device.refuses(f"{FLEET}/ota/tiny_cls", for_device, "wrong_target")
    rollback = json.dumps(command(key[0], PREFIX)).encode()
    device.refuses(f"{FLEET}/ota/tiny_cls/command", rollback, "wrong_target")
    device.update(3)  # and the device's own topic still works


def test_ota_when_a_manifest_has_expired_or_lacks_freshness_refuses_it(
        device: Device, key: tuple[Ed25519PrivateKey, Path]) -> None:
    expired = device.pusher.signed(MANIFESTS, 3, tiny_cls_bytes(2),
                                   expires=int(time.time()) - 1)
    device.refuses(MANIFESTS, expired, "expired")
    forever = device.pusher.signed(MANIFESTS, 3, tiny_cls_bytes(2),
                                   expires=int(time.time()) + 365 * 86400)
    device.refuses(MANIFESTS, forever, "expired")
    old_style = json.loads(device.pusher.signed(MANIFESTS, 3, tiny_cls_bytes(2)))
    for field in ("target", "seq", "expires", "key_id", "signature"):
        del old_style[field]
    device.refuses(MANIFESTS, json.dumps(sign_document(old_style, key[0])).encode(), "stale")
    device.update(3)
