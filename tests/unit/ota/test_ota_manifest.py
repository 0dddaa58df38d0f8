"""OTA manifests: every malformed field is a typed rejection; Ed25519 signatures over the
canonical form verify, and every way of getting them wrong is told apart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from edged.core.errors import ConfigError
from edged.ota.manifest import (
    MAX_MANIFEST_BYTES,
    Rejected,
    TrustStore,
    canonical_bytes,
    key_id_of,
    parse_manifest,
    sign_document,
)

SHA = "ab" * 32


def doc(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "cls", "version": 2, "format": "onnx",
                            "artifact": {"url": "http://127.0.0.1:1/m.onnx", "size": 10,
                                         "sha256": SHA}}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def raw(document: Any) -> bytes:
    return json.dumps(document).encode()


def reason_of(payload: bytes) -> str:
    with pytest.raises(Rejected) as info:
        parse_manifest(payload)
    return info.value.reason


def test_manifest_when_well_formed_parses_every_field() -> None:
    m = parse_manifest(raw(doc(precision="int8", force=True, group="line-1", io={
        "inputs": [{"name": "x", "dtype": "float32", "shape": [3, -1, -1]}], "outputs": []})))
    assert (m.model, m.version, m.format, m.precision, m.force, m.group) == \
        ("cls", 2, "onnx", "int8", True, "line-1")
    assert m.artifact.size == 10 and m.artifact.url is not None and m.artifact.chunks is None
    assert m.io is not None and m.io[0][0].shape == (3, -1, -1)


@pytest.mark.parametrize(("payload", "reason"), [
    (b"not json", "bad_manifest"),
    (b"[1, 2]", "bad_manifest"),
    (b"\xff\xfe", "bad_manifest"),
    (b'{"model": "cls", "version": NaN}', "bad_manifest"),
    (b"[" * 100000 + b"]" * 100000, "bad_manifest"),  # too big, before any parsing
    (raw(doc(extra=1)), "bad_manifest"),
    (raw(doc(model=None)), "bad_manifest"),
    (raw(doc(model="../etc")), "bad_name"),
    (raw(doc(model="a/b")), "bad_name"),
    (raw(doc(model=".hidden")), "bad_name"),
    (raw(doc(version=0)), "bad_manifest"),
    (raw(doc(version=True)), "bad_manifest"),
    (raw(doc(version="3")), "bad_manifest"),
    (raw(doc(format="zip")), "bad_manifest"),
    (raw(doc(precision="int4")), "bad_manifest"),
    (raw(doc(artifact={"url": "http://x/m", "size": 10})), "bad_manifest"),
    (raw(doc(artifact={"url": "http://x/m", "size": 0, "sha256": SHA})), "bad_manifest"),
    (raw(doc(artifact={"url": "http://x/m", "size": 1, "sha256": "AB" * 32})), "bad_manifest"),
    (raw(doc(artifact={"url": "ftp://x/m", "size": 1, "sha256": SHA})), "bad_manifest"),
    (raw(doc(artifact={"url": "http://x/m", "chunks": 2, "size": 1, "sha256": SHA})),
     "bad_manifest"),
    (raw(doc(artifact={"chunks": 0, "size": 1, "sha256": SHA})), "bad_manifest"),
    (raw(doc(io={"inputs": [{"name": "x", "dtype": "float99", "shape": [1]}]})),
     "bad_manifest"),
    (raw(doc(key_id="XYZ")), "bad_manifest"),
])
def test_manifest_when_malformed_is_rejected_with_a_reason(payload: bytes, reason: str) -> None:
    assert reason_of(payload) == reason


def test_manifest_when_too_large_is_rejected_before_parsing() -> None:
    payload = raw(doc(note="x" * MAX_MANIFEST_BYTES))
    with pytest.raises(Rejected, match="limit"):
        parse_manifest(payload)


def test_canonical_bytes_ignore_order_whitespace_and_the_signature() -> None:
    a = json.loads('{"b": 1, "a": {"y": 2, "x": 1}, "signature": "zz"}')
    b = json.loads('{ "a": {"x": 1, "y": 2}, "b": 1 }')
    assert canonical_bytes(a) == canonical_bytes(b) == b'{"a":{"x":1,"y":2},"b":1}'


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def store_with(*keys: Ed25519PrivateKey) -> TrustStore:
    return TrustStore({key_id_of(k.public_key()): k.public_key() for k in keys})


def test_signature_when_made_by_a_trusted_key_verifies(key: Ed25519PrivateKey) -> None:
    manifest = parse_manifest(raw(sign_document(doc(), key)))
    assert store_with(key).verify(manifest, allow_unsigned=False) == manifest.key_id
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    import hashlib
    assert manifest.key_id == hashlib.sha256(public).hexdigest()[:16]


def test_signature_when_the_manifest_was_reordered_in_transit_still_verifies(
        key: Ed25519PrivateKey) -> None:
    signed = sign_document(doc(), key)
    reordered = json.dumps(dict(reversed(list(signed.items()))), indent=2).encode()
    assert store_with(key).verify(parse_manifest(reordered), allow_unsigned=False)


@pytest.mark.parametrize(("tamper", "reason"), [
    (lambda d: d.update(version=3), "bad_signature"),
    (lambda d: d["artifact"].update(sha256="cd" * 32), "bad_signature"),
    (lambda d: d.update(signature="!!not base64!!"), "bad_signature"),
    (lambda d: d.update(signature="QUJD"), "bad_signature"),
    (lambda d: d.update(key_id="0123456789abcdef"), "unknown_key"),
    (lambda d: d.pop("key_id"), "bad_manifest"),
    (lambda d: (d.pop("signature"), d.pop("key_id")), "unsigned"),
])
def test_signature_when_wrong_is_rejected_with_its_reason(
        key: Ed25519PrivateKey, tamper: Any, reason: str) -> None:
    signed = sign_document(doc(), key)
    tamper(signed)
    with pytest.raises(Rejected) as info:
        store_with(key).verify(parse_manifest(raw(signed)), allow_unsigned=False)
    assert info.value.reason == reason


def test_signature_when_by_another_key_with_a_forged_key_id_is_bad(
        key: Ed25519PrivateKey) -> None:
    forged = sign_document(doc(), Ed25519PrivateKey.generate())
    forged["key_id"] = key_id_of(key.public_key())
    with pytest.raises(Rejected, match="bad_signature"):
        store_with(key).verify(parse_manifest(raw(forged)), allow_unsigned=False)


def test_unsigned_manifest_when_allowed_by_config_passes(key: Ed25519PrivateKey) -> None:
    assert store_with(key).verify(parse_manifest(raw(doc())), allow_unsigned=True) is None


def test_trust_store_when_loading_keys_reads_pem_and_refuses_others(
        key: Ed25519PrivateKey, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

    good = tmp_path / "fleet.pub"
    good.write_bytes(key.public_key().public_bytes(Encoding.PEM,
                                                   PublicFormat.SubjectPublicKeyInfo))
    store = TrustStore.load([good])
    assert list(store.keys) == [key_id_of(key.public_key())]
    ec = tmp_path / "ec.pub"
    ec.write_bytes(generate_private_key(SECP256R1()).public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(ConfigError, match="not an Ed25519"):
        TrustStore.load([ec])
    with pytest.raises(ConfigError, match="cannot read"):
        TrustStore.load([tmp_path / "absent.pub"])


def test_trust_store_when_a_key_is_a_systemd_credential_reads_it_from_there(
        key: Ed25519PrivateKey, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    credentials = tmp_path / "credentials"  # what LoadCredential=ota-release.pub:... makes
    credentials.mkdir()
    (credentials / "ota-release.pub").write_bytes(key.public_key().public_bytes(
        Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    store = TrustStore.load([Path("ota-release.pub")])  # relative in the config
    assert list(store.keys) == [key_id_of(key.public_key())]
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError, match=r"cannot read ota-release\.pub"):
        TrustStore.load([Path("ota-release.pub")])


def test_cli_ota_keygen_and_sign_make_a_manifest_a_device_accepts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edged.cli import main

    key = tmp_path / "fleet.key"
    assert main(["ota", "keygen", str(key)]) == 0
    assert (key.stat().st_mode & 0o777) == 0o600
    assert main(["ota", "keygen", str(key)]) == 1  # never overwrites a key
    assert "exists" in capsys.readouterr().err
    artifact = tmp_path / "model.onnx"
    artifact.write_bytes(b"model bytes")
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"model": "cls", "version": 3, "format": "onnx",
                                    "artifact": {"url": "http://127.0.0.1:1/m.onnx"}}))
    out = tmp_path / "signed.json"
    assert main(["ota", "sign", str(manifest), "--key", str(key), "--artifact", str(artifact),
                 "-o", str(out)]) == 0
    signed = parse_manifest(out.read_bytes())
    assert signed.artifact.size == len(b"model bytes")
    assert TrustStore.load([Path(f"{key}.pub")]).verify(signed, allow_unsigned=False)
    manifest.write_text(json.dumps({"model": "../x", "version": 3}))
    assert main(["ota", "sign", str(manifest), "--key", str(key)]) == 1  # a device would refuse
