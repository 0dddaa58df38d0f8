"""Updates of different models do not wait on each other's network (issue 41 #2), through a
real mosquitto and the daemon in-process: an artifact server that trickles a byte at a time
keeps tiny_cls downloading, and an update of tiny_cnn pushed meanwhile goes live. Before,
the updates were one queue: the second had not even started 60 s later."""

from __future__ import annotations

import hashlib
import json
import queue
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer, TricklingServer
from support.broker import Broker, Subscriber
from support.daemon import ServeFactory
from support.ota import fresh, statuses, tiny_cls_bytes
from support.polling import wait_until

from edged.ota.manifest import sign_document
from tools.assets import models as test_models


def manifest(private: Ed25519PrivateKey, prefix: str, model: str, version: int, data: bytes,
             url: str) -> bytes:
    return json.dumps(sign_document({
        "model": model, "version": version, "format": "onnx",
        "artifact": {"url": url, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
        **fresh(prefix)}, private)).encode()


def push_until(sub: Subscriber, topic: str, status: str, payload: bytes, state: str) -> None:
    """Publish until the device says `state` on `status` (its subscription may not be in
    place yet; a repeat of a manifest being applied is a no-op)."""
    def answered() -> bool:
        sub.client.publish(topic, payload, qos=1).wait_for_publish(5)
        try:
            return bool(json.loads(sub.wait_for(status, 0.5).payload)["state"] == state)
        except queue.Empty:
            return False

    wait_until(answered, timeout=30, interval=0, what=f"{state!r} on {status}")


def test_ota_when_one_models_download_trickles_another_models_update_goes_live(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    private, public = key
    prefix = "t/parallel/dev"
    cls_status, cnn_status = f"{prefix}/ota/tiny_cls/status", f"{prefix}/ota/tiny_cnn/status"
    cls_sub, cnn_sub = Subscriber(broker, cls_status), Subscriber(broker, cnn_status)
    slow_bytes = tiny_cls_bytes(1)
    trickle = TricklingServer(len(slow_bytes))
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                             ota=f"trusted_keys: [{public}]")
        push_until(cls_sub, f"{prefix}/ota/tiny_cls", cls_status,
                   manifest(private, prefix, "tiny_cls", 2, slow_bytes, trickle.url),
                   "received")
        assert statuses(cls_sub, cls_status, "downloading")[-1]["progress"] == 0.0

        cnn = test_models.make_tiny_cnn(1).SerializeToString()
        (artifacts.root / "cnn-2").write_bytes(cnn)
        push_until(cnn_sub, f"{prefix}/ota/tiny_cnn", cnn_status,
                   manifest(private, prefix, "tiny_cnn", 2, cnn, artifacts.url("cnn-2")),
                   "received")
        events = statuses(cnn_sub, cnn_status, "active")
        assert events[-1]["version"] == 2
        image = np.random.default_rng(1).random((1, 3, 16, 16), dtype=np.float32)
        with served.client() as client:
            assert client.infer("tiny_cnn", {"image": image}).version == "2"
            assert client.infer("tiny_cls", {"x": np.zeros((1, 3, 8, 8), np.float32)}) \
                .version == "1"  # still downloading its update, a byte at a time
        assert trickle.requests == 1 and trickle.sent < len(slow_bytes)  # its first try, live
    finally:
        trickle.close()
        cls_sub.close()
        cnn_sub.close()
