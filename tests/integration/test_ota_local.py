"""Installs handed to the daemon on its socket (`POST /v2/edged/ota/install`, what the Mender
module uses): the same verified installer as MQTT manifests, held installs that wait for a
commit or a rollback (and outlive a restart), and every bad request refused with its code,
nothing changed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer
from support.broker import Broker, Subscriber
from support.daemon import Served, ServeFactory
from support.ota import Pusher, X, expected, fresh, statuses, tiny_cls_bytes
from support.polling import wait_until

from edged.ops.client import EdgedClient
from edged.ota.manifest import sign_document


def manifest(private: Ed25519PrivateKey | None, version: int, data: bytes, *,
             target: str = "local", **extra: Any) -> bytes:
    doc = {"model": "tiny_cls", "version": version, "format": "onnx",
           "artifact": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
           **fresh(target), **extra}
    return json.dumps(sign_document(doc, private) if private else doc).encode()


def send(client: EdgedClient, head: bytes, data: bytes | None, query: str = "",
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    hdrs = {"Content-Type": "application/octet-stream", **(headers or {})}
    if data is not None:
        hdrs.setdefault("Edged-Manifest-Length", str(len(head)))
    status, _, raw = client.request("POST", f"/v2/edged/ota/install{query}",
                                    head + (data or b""), hdrs)
    return status, json.loads(raw)


def call(client: EdgedClient, method: str, path: str) -> tuple[int, dict[str, Any]]:
    status, _, raw = client.request(method, path)
    return status, json.loads(raw)


def settled(client: EdgedClient, install_id: str) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        row = call(client, "GET", f"/v2/edged/ota/installs/{install_id}")[1]
        return row if row["state"] in ("active", "failed", "rolled_back") else None

    return wait_until(final, timeout=30, what=f"install {install_id} to finish")


@pytest.fixture
def device(make_served: ServeFactory, key: tuple[Ed25519PrivateKey, Path]) -> Served:
    return make_served(ota=f"trusted_keys: [{key[1]}], max_artifact_mb: 1")


def answer(served: Served) -> tuple[int, np.ndarray]:
    with served.client() as client:
        response = client.infer("tiny_cls", {"x": X})
    return int(response.version), response.outputs["prob"]


def test_install_when_attached_and_signed_goes_live_committed(
        device: Served, key: tuple[Ed25519PrivateKey, Path]) -> None:
    data = tiny_cls_bytes(1)
    with device.client() as client:
        status, started = send(client, manifest(key[0], 2, data), data, "?tag=by-hand")
        assert status == 202, started
        done = settled(client, started["id"])
    assert (done["state"], done["committed"], done["previous"], done["tag"]) == \
        ("active", True, 1, "by-hand")
    assert [e["state"] for e in done["events"]][:2] == ["received", "downloading"]
    version, prob = answer(device)
    assert version == 2
    np.testing.assert_allclose(prob, expected(1), rtol=1e-5)


def test_install_when_held_waits_for_commit_and_refuses_other_updates_meanwhile(
        device: Served, key: tuple[Ed25519PrivateKey, Path]) -> None:
    private = key[0]
    with device.client() as client:
        status, held = send(client, manifest(private, 2, tiny_cls_bytes(1)),
                            tiny_cls_bytes(1), "?hold=true&tag=first")
        assert status == 202
        assert settled(client, held["id"])["committed"] is False
        # Another held install, and any install of the held model, wait for the decision.
        status, refused = send(client, manifest(private, 3, tiny_cls_bytes(2)),
                               tiny_cls_bytes(2), "?hold=true")
        assert (status, refused["reason"]) == (409, "uncommitted")
        assert "first" in refused["error"]
        status, refused = send(client, manifest(private, 3, tiny_cls_bytes(2)),
                               tiny_cls_bytes(2))
        assert (status, refused["reason"]) == (409, "uncommitted")
        assert answer(device)[0] == 2
        status, done = call(client, "POST", f"/v2/edged/ota/installs/{held['id']}/commit")
        assert (status, done["committed"]) == (200, True)
        status, refused = call(client, "POST", f"/v2/edged/ota/installs/{held['id']}/rollback")
        assert (status, refused["reason"]) == (409, "committed")
        status, started = send(client, manifest(private, 3, tiny_cls_bytes(2)),
                               tiny_cls_bytes(2))
        assert status == 202
        assert settled(client, started["id"])["state"] == "active"
    assert answer(device)[0] == 3


def test_install_when_held_survives_a_restart_and_rolls_back_after_it(
        make_served: ServeFactory, repo_dir: Path, key: tuple[Ed25519PrivateKey, Path]) -> None:
    ota = f"trusted_keys: [{key[1]}]"
    first = make_served(ota=ota)
    with first.client() as client:
        _, held = send(client, manifest(key[0], 2, tiny_cls_bytes(1)), tiny_cls_bytes(1),
                       "?hold=1")
        assert settled(client, held["id"])["state"] == "active"
    first.daemon.request_stop()
    assert first.daemon.stopped_event.wait(30)
    second = make_served(ota=ota, models_dir=repo_dir, sock_name="again.sock")
    assert answer(second)[0] == 2
    with second.client() as client:
        status, row = call(client, "GET", f"/v2/edged/ota/installs/{held['id']}")
        assert (status, row["state"], row["committed"]) == (200, "active", False)
        status, row = call(client, "POST", f"/v2/edged/ota/installs/{held['id']}/rollback")
        assert (status, row["state"]) == (200, "rolled_back")
    version, prob = answer(second)
    assert version == 1
    np.testing.assert_allclose(prob, expected(0), rtol=1e-5)


BAD = {
    "unsigned": (lambda k, d: (manifest(None, 2, d), d, {}), 400, "unsigned"),
    "wrong-target": (lambda k, d: (manifest(k, 2, d, target="edged/fleet"), d, {}), 400,
                     "wrong_target"),
    "sha256-mismatch": (lambda k, d: (manifest(k, 2, d), d[:-1] + b"\0", {}), 202,
                        "sha256_mismatch"),
    "size-mismatch": (lambda k, d: (manifest(k, 2, d), d + b"\0", {}), 202, "size_mismatch"),
    "no-bytes": (lambda k, d: (manifest(k, 2, d), None, {}), 400, "bad_manifest"),
    "url-and-bytes": (lambda k, d: (manifest(k, 2, d, artifact={
        "url": "file:///x", "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}), d, {}),
        400, "bad_manifest"),
    "chunks": (lambda k, d: (manifest(k, 2, d, artifact={
        "chunks": 1, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}), None, {}),
        400, "bad_manifest"),
    "not-json": (lambda k, d: (b"{not json", d, {}), 400, "bad_manifest"),
    "oversize": (lambda k, d: (manifest(k, 2, d), bytes(2 << 20), {}), 413, None),
    "bad-length-header": (lambda k, d: (manifest(k, 2, d), d,
                                        {"Edged-Manifest-Length": "-4"}), 400, None),
    # "²" passed str.isdigit() and then failed int(): an internal error (issue 49 #7).
    "superscript-length-header": (lambda k, d: (manifest(k, 2, d), d,
                                                {"Edged-Manifest-Length": "\u00b2"}), 400, None),
    "length-past-the-body": (lambda k, d: (manifest(k, 2, d), b"",
                                           {"Edged-Manifest-Length": "999999"}), 400, None),
    "bad-tag": (lambda k, d: (manifest(k, 2, d), d, {"tag": "a b/c"}), 400, "bad_request"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_install_when_bad_is_refused_with_its_code_and_changes_nothing(
        device: Served, key: tuple[Ed25519PrivateKey, Path], case: str) -> None:
    make, status, reason = BAD[case]
    head, data, headers = make(key[0], tiny_cls_bytes(1))
    query = "?tag=a%20b%2Fc" if headers.pop("tag", None) else ""
    before = sorted(p.name for p in (device.daemon.repository.root / "tiny_cls").iterdir()
                    if p.name != ".ota-crashes")
    with device.client() as client:
        got, body = send(client, head, data, query, headers)
        assert got == status, body
        if status == 202:  # refused by the installer once the bytes were in
            body = settled(client, body["id"])
            assert body["state"] == "failed"
        if reason is not None:
            assert body["reason"] == reason, body
        else:
            assert body["code"] in ("too_large", "invalid_input"), body
    assert answer(device)[0] == 1
    after = sorted(p.name for p in (device.daemon.repository.root / "tiny_cls").iterdir()
                   if p.name != ".ota-crashes")
    assert after == before
    assert not any(p.name.startswith("upload-")
                   for p in device.daemon.repository.staging_dir().iterdir())


def test_install_routes_when_asked_over_tcp_or_for_an_unknown_install_refuse(
        device: Served, key: tuple[Ed25519PrivateKey, Path]) -> None:
    data = tiny_cls_bytes(1)
    with EdgedClient(http=device.http) as tcp:
        status, body = send(tcp, manifest(key[0], 2, data), data)
        assert (status, body["code"]) == (403, "forbidden")
    with device.client() as client:
        status, body = call(client, "GET", "/v2/edged/ota/installs/0123456789ab")
        assert (status, body["reason"]) == (404, "unknown_install")
        status, body = call(client, "POST", "/v2/edged/ota/installs/0123456789ab/commit")
        assert status == 404
        assert call(client, "GET", "/v2/edged/ota/installs") == (200, {"installs": []})
    assert answer(device)[0] == 1


def test_install_when_held_mqtt_updates_of_the_model_are_refused_and_attached_ones_too(
        broker: Broker, make_served: ServeFactory, artifacts: ArtifactServer,
        key: tuple[Ed25519PrivateKey, Path]) -> None:
    private, public = key
    prefix = "t/local/dev"
    status = f"{prefix}/ota/tiny_cls/status"
    sub = Subscriber(broker, status)
    try:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                             ota=f"trusted_keys: [{public}]")
        assert served.daemon.ota is not None and served.daemon.ota.wait_listening(10)
        data = tiny_cls_bytes(1)
        with served.client() as client:  # the socket's installs report on the status topic
            assert send(client, manifest(private, 2, data), data, "?hold=true")[0] == 202
            assert statuses(sub, status, "active")[-1]["version"] == 2
        pusher = Pusher(sub, artifacts, private)
        pusher.push(f"{prefix}/ota/tiny_cls", 3, tiny_cls_bytes(2))
        refused = statuses(sub, status, "failed")[-1]
        assert refused["reason"] == "uncommitted" and refused["version"] == 3
        # A manifest whose artifact is attached has no bytes over MQTT.
        pusher.publish(f"{prefix}/ota/tiny_cls", manifest(private, 3, data, target=prefix))
        refused = statuses(sub, status, "failed")[-1]
        assert refused["reason"] == "bad_manifest" and "url" in refused["detail"]
        assert answer(served)[0] == 2
    finally:
        sub.close()
