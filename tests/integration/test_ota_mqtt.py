"""OTA through a real mosquitto and the daemon in-process: a signed manifest on the device's
topic goes live with its status events (the final one retained), a fleet push reaches the
device too, a rejected one says why on the status topic, and a signed rollback command
brings the old version back."""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import queue
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer
from support.broker import Broker, Received, Subscriber
from support.daemon import ServeFactory
from support.ota import Pusher, X, command, expected, fresh, statuses, tiny_cls_bytes
from support.polling import wait_until

from edged.ota.manifest import sign_document


def test_ota_over_mqtt_when_pushed_goes_live_reports_and_rolls_back_on_command(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
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

        pusher = Pusher(sub, artifacts, private)
        first = pusher.push_until_received(f"{prefix}/ota/tiny_cls", status, 2, tiny_cls_bytes(1))
        events = [first, *statuses(sub, status, "active")]
        assert [e["state"] for e in events if e["state"] != "downloading"] == [
            "received", "verifying", "installing", "warming", "active"]
        with served.client() as client:
            after = client.infer("tiny_cls", {"x": X}).outputs["prob"]
        assert not np.allclose(before, after)

        pusher.push(f"{fleet}/ota/tiny_cls", 3, tiny_cls_bytes(2))
        assert statuses(sub, status, "active")[-1]["version"] == 3

        pusher.push(f"{prefix}/ota/tiny_cls", 1, b"whatever")  # older than the active one
        failed = statuses(sub, status, "failed")[-1]
        assert failed["reason"] == "downgrade" and failed["version"] == 1

        rollback = command(private, prefix)  # signed, and fresh (target, seq, expires)
        sub.client.publish(f"{prefix}/ota/tiny_cls/command", json.dumps(rollback).encode(),
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


def test_ota_when_8_clients_keep_calling_switches_each_once_and_fails_none(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    private, public = key
    prefix = "t/ota/busy"
    status = f"{prefix}/ota/tiny_cls/status"
    served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                         ota=f"trusted_keys: [{public}]")
    old, new = expected(0), expected(1)
    stop = threading.Event()
    seen: list[list[tuple[int, str]]] = [[] for _ in range(8)]  # (which outputs, model_version)
    errors: list[BaseException] = []

    def call(i: int) -> None:
        with served.client() as client:
            while not stop.is_set():
                try:
                    response = client.infer("tiny_cls", {"x": X})
                except Exception as exc:  # every failure is the test's failure, counted
                    errors.append(exc)
                    continue
                prob = response.outputs["prob"]
                which = 1 if np.allclose(prob, old, rtol=1e-5) else \
                    2 if np.allclose(prob, new, rtol=1e-5) else 0
                seen[i].append((which, response.version))

    def wait_each(count: list[int], more: int) -> None:
        wait_until(lambda: all(len(s) >= c + more for s, c in zip(seen, count, strict=True)),
                   timeout=30, what=f"{more} more answers for each client",
                   alive=lambda: not errors, details=lambda: repr((errors, [len(s) for s in seen])))

    clients = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    sub = Subscriber(broker, status)
    try:
        for thread in clients:
            thread.start()
        wait_each([0] * 8, 5)
        Pusher(sub, artifacts, private).push_until_received(f"{prefix}/ota/tiny_cls", status, 2,
                                                            tiny_cls_bytes(1))
        assert statuses(sub, status, "active")[-1]["version"] == 2
        wait_each([len(s) for s in seen], 5)
    finally:
        stop.set()
        for thread in clients:
            thread.join(30)
        sub.close()
    assert not errors
    for calls in seen:
        which = [w for w, _ in calls]
        assert 0 not in which
        switches = sum(a != b for a, b in itertools.pairwise(which))
        assert which[0] == 1 and which[-1] == 2 and switches == 1, which
        assert all(str(w) == version for w, version in calls)  # the response names who ran it


def test_ota_when_pushed_to_the_fleet_reaches_every_device(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path], repo_dir: Path,
        tmp_path: Path) -> None:
    private, public = key
    fleet = "t/fleet2/all"
    topics = [f"t/fleet2/{d}/ota/tiny_cls/status" for d in ("d1", "d2")]
    sub = Subscriber(broker, *topics)
    pusher = Pusher(sub, artifacts, private)
    try:
        # Retained: a device that subscribes later (or is offline now) still gets the push.
        pusher.push(f"{fleet}/ota/tiny_cls", 2, tiny_cls_bytes(1), retain=True)
        devices = []
        for device in ("d1", "d2"):
            models = tmp_path / f"models-{device}"
            shutil.copytree(repo_dir, models)
            devices.append(make_served(
                mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/fleet2/{device}, "
                     f"fleet_prefix: {fleet}",
                ota=f"trusted_keys: [{public}]", device_id=device, models_dir=models))
        final: dict[str, dict] = {}  # both update at once: read both topics together

        def both_final(got: list[Received]) -> bool:
            event = json.loads(got[-1].payload)
            if event["state"] in ("active", "failed", "rolled_back"):
                final[got[-1].topic] = event
            return len(final) == len(topics)

        sub.collect(*topics, until=both_final, timeout=30, what="a final state from each device")
        assert all(e["state"] == "active" and e["version"] == 2 for e in final.values()), final
        for served in devices:
            with served.client() as client:
                np.testing.assert_allclose(client.infer("tiny_cls", {"x": X}).outputs["prob"],
                                           expected(1), rtol=1e-5)
            assert served.daemon.cache.repository.active_version("tiny_cls") == 2
    finally:
        sub.client.publish(f"{fleet}/ota/tiny_cls", b"", qos=1, retain=True).wait_for_publish(5)
        sub.close()


def test_ota_when_a_chunk_topic_is_not_numbered_in_ascii_digits_ignores_that_chunk(
        broker: Broker, make_served: ServeFactory, key: tuple[Ed25519PrivateKey, Path],
        caplog: pytest.LogCaptureFixture) -> None:
    """An inline artifact in two chunks, and among them chunks on `chunk/²` (a digit to
    str.isdigit() that int() refuses: a traceback in the MQTT thread, issue 49 #7) and on
    `chunk/٠` (Arabic-Indic zero: int() read it as chunk 0, and its bytes broke the update):
    both are strays, the update goes live from the real ones."""
    private, public = key
    prefix = "t/ota/chunks"
    status = f"{prefix}/ota/tiny_cls/status"
    data = tiny_cls_bytes(1)
    half = len(data) // 2
    doc = sign_document({"model": "tiny_cls", "version": 2, "format": "onnx",
                         "artifact": {"chunks": 2, "size": len(data),
                                      "sha256": hashlib.sha256(data).hexdigest()},
                         **fresh(prefix)}, private)
    caplog.set_level(logging.INFO)
    sub = Subscriber(broker, status)
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                             ota=f"trusted_keys: [{public}]")
        link = served.daemon.mqtt
        assert link is not None and link.wait_connected(10)

        def publish(topic: str, payload: bytes) -> None:
            sub.client.publish(topic, payload, qos=1).wait_for_publish(5)

        def received() -> bool:  # a repeat of the manifest being applied is a no-op
            publish(f"{prefix}/ota/tiny_cls", json.dumps(doc).encode())
            try:
                return json.loads(sub.wait_for(status, 0.5).payload)["state"] == "received"
            except queue.Empty:
                return False

        wait_until(received, timeout=30, interval=0, what="'received' on the status topic")
        for index, payload in (("\u00b2", b"stray"), ("\u0660", b"x" * half),
                               ("0", data[:half]), ("1", data[half:])):
            publish(f"{prefix}/ota/tiny_cls/chunk/{index}", payload)
        assert statuses(sub, status, "active")[-1]["version"] == 2
        with served.client() as client:
            np.testing.assert_allclose(client.infer("tiny_cls", {"x": X}).outputs["prob"],
                                       expected(1), rtol=1e-5)
        assert link.stats()["handler_errors"] == 0
        assert [r.getMessage() for r in caplog.records if r.exc_info] == []
    finally:
        sub.close()


def test_ota_when_an_update_fails_publishes_its_detail_with_no_path_of_the_device(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path], repo_dir: Path) -> None:
    """The status goes to the fleet: an ONNX Runtime error names the staged file, which is
    the device's business (issue 49, item 9); the local log keeps it whole."""
    private, public = key
    prefix = "t/ota/paths"
    status = f"{prefix}/ota/tiny_cls/status"
    sub = Subscriber(broker, status)
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                             ota=f"trusted_keys: [{public}]")
        assert served.daemon.mqtt is not None and served.daemon.mqtt.wait_connected(10)
        corrupt = b"\x08\x07" + bytes(range(256)) * 2  # an ONNX header, then no model
        Pusher(sub, artifacts, private).push_until_received(f"{prefix}/ota/tiny_cls", status,
                                                            2, corrupt)
        failed = statuses(sub, status, "failed")[-1]
        assert failed["reason"] == "corrupt_model", failed
        detail = failed["detail"]
        assert detail and str(repo_dir) not in detail and "/tmp" not in detail, detail
        assert "/" not in detail.replace("tiny_cls/", "").replace("<path>", ""), detail
    finally:
        sub.close()
