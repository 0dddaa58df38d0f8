"""What the OTA tests share: a signing key, the tiny model's expected outputs per version, and
a pusher that publishes signed manifests (their artifacts on the test's HTTP server) and reads
the status events a device answers with."""

from __future__ import annotations

import hashlib
import json
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from edged.ota.manifest import sign_document
from support.artifacts import ArtifactServer
from support.broker import Subscriber
from support.polling import wait_until
from tools.assets import models as test_models

X = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)


def tiny_cls_bytes(seed: int) -> bytes:
    """Version `seed + 1` of tiny_cls, as the repository fixture numbers them (seed 0 = v1)."""
    return test_models.make_tiny_cls(seed).SerializeToString()


def expected(seed: int, x: np.ndarray = X) -> np.ndarray:
    """tiny_cls(seed)'s answer to `x`, straight from ONNX Runtime."""
    import onnxruntime as ort

    session = ort.InferenceSession(tiny_cls_bytes(seed), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


@pytest.fixture
def key(tmp_path: Path) -> tuple[Ed25519PrivateKey, Path]:
    """A fleet key: the private half signs, the public file goes in ota.trusted_keys."""
    private = Ed25519PrivateKey.generate()
    public = tmp_path / "fleet.pub"
    public.write_bytes(private.public_key().public_bytes(Encoding.PEM,
                                                         PublicFormat.SubjectPublicKeyInfo))
    return private, public


_last_seq = 0


def next_seq() -> int:
    """A seq greater than every one this test run signed: the clock in ms, as `edged ota push`
    sets it, bumped when two messages are signed within the same ms."""
    global _last_seq
    _last_seq = max(_last_seq + 1, time.time_ns() // 1_000_000)
    return _last_seq


def fresh(target: str) -> dict[str, Any]:
    """The freshness fields of a message for topic root `target`, signed now, good for an hour
    (what `edged ota push` adds)."""
    return {"target": target, "seq": next_seq(), "expires": int(time.time()) + 3600}


def command(private: Ed25519PrivateKey, target: str, model: str = "tiny_cls",
            **extra: Any) -> dict[str, Any]:
    """A signed rollback command for the devices under topic root `target`, fresh now."""
    return sign_document({"model": model, "action": "rollback", **fresh(target), **extra},
                         private)


def statuses(sub: Subscriber, topic: str, until: str, timeout: float = 30) -> list[dict]:
    """Status events on `topic` up to and including the first in state `until`."""
    messages = sub.collect(topic, until=lambda got: json.loads(got[-1].payload)["state"] == until,
                           timeout=timeout, what=f"status {until!r}")
    return [json.loads(m.payload) for m in messages]



def active(sub: Subscriber, topic: str, version: int, timeout: float = 30) -> list[dict]:
    """Status events on `topic` up to and including `version`'s `active`: a manifest pushed
    twice (push_until_received's retry on a slow machine) says `active` twice, and the second
    can come after a later version was pushed."""
    def done(got: list[Any]) -> bool:
        event = json.loads(got[-1].payload)
        return bool(event["state"] == "active" and event["version"] == version)
    messages = sub.collect(topic, until=done, timeout=timeout, what=f"version {version} active")
    return [json.loads(m.payload) for m in messages]

class Pusher:
    """Publishes signed manifests for tiny_cls through `sub`'s connection, fresh (target: the
    topic's root, the next seq, an hour to expiry) unless `extra` says otherwise."""

    def __init__(self, sub: Subscriber, artifacts: ArtifactServer,
                 private: Ed25519PrivateKey) -> None:
        self.sub, self.artifacts, self.private = sub, artifacts, private

    def signed(self, topic: str, version: int, data: bytes, **extra: Any) -> bytes:
        """The payload push() publishes: `data` served as the artifact, the manifest signed."""
        name = f"v{version}-{hashlib.sha256(data).hexdigest()[:8]}"
        (self.artifacts.root / name).write_bytes(data)
        doc = sign_document({"model": "tiny_cls", "version": version, "format": "onnx",
                             "artifact": {"url": self.artifacts.url(name), "size": len(data),
                                          "sha256": hashlib.sha256(data).hexdigest()},
                             **fresh(topic.rsplit("/ota/", 1)[0]), **extra}, self.private)
        return json.dumps(doc).encode()

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self.sub.client.publish(topic, payload, qos=1, retain=retain).wait_for_publish(5)

    def push(self, topic: str, version: int, data: bytes, *, retain: bool = False,
             **extra: Any) -> None:
        self.publish(topic, self.signed(topic, version, data, **extra), retain=retain)

    def push_until_received(self, topic: str, status: str, version: int, data: bytes) -> dict:
        """Push until the device says `received`: its subscription may not be in place yet
        (a repeat of a manifest being applied is a no-op)."""
        def pushed_and_received() -> dict | None:
            self.push(topic, version, data)
            try:
                event = json.loads(self.sub.wait_for(status, 0.5).payload)
            except queue.Empty:
                return None
            return event if event["state"] == "received" else None

        # Each try waits half a second for the answer, so no pause between them.
        return wait_until(pushed_and_received, timeout=30, interval=0,
                          what=f"'received' on {status}")
