"""The operator's side of OTA: `edged ota keygen` and `edged ota sign`, and the freshness
fields (target, seq, expires) every signed message carries."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from edged.core.errors import ToolError
from edged.core.fsutil import file_sha256
from edged.ota.freshness import MAX_LIFETIME_S
from edged.ota.manifest import key_id_of, parse_manifest, sign_document


def keygen(private_path: Path) -> tuple[Path, str]:
    """A new Ed25519 key pair: `private_path` (PEM, mode 0600) and `<private_path>.pub`, the
    file devices list in ota.trusted_keys. Returns the public key's path and key_id."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
        PublicFormat,
    )

    public_path = private_path.with_name(private_path.name + ".pub")
    private_path.parent.mkdir(parents=True, exist_ok=True)
    for path in (private_path, public_path):
        if path.exists():
            raise ToolError(f"{path} exists; not overwriting a key")
    key = Ed25519PrivateKey.generate()
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    public_path.write_bytes(key.public_key().public_bytes(Encoding.PEM,
                                                          PublicFormat.SubjectPublicKeyInfo))
    return public_path, key_id_of(key.public_key())


def load_private_key(path: Path) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise ToolError(f"cannot read the private key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ToolError(f"{path} is not an Ed25519 private key")
    return key


def read_manifest(path: Path) -> dict[str, Any]:
    """A manifest file as the operator wrote it (not yet checked)."""
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ToolError(f"cannot read the manifest {path}: {exc}") from None
    if not isinstance(document, dict):
        raise ToolError(f"{path}: a manifest is a JSON object")
    return document


def describe_artifact(path: Path) -> dict[str, Any]:
    """The manifest's `artifact.size` and `artifact.sha256` of a file."""
    return {"size": path.stat().st_size, "sha256": file_sha256(path)}


DEFAULT_TTL_S = 86400.0  # a signed message is good for a day unless --ttl says otherwise


def freshness(target: str, *, ttl_s: float = DEFAULT_TTL_S, seq: int | None = None,
              now: float | None = None) -> dict[str, Any]:
    """The fields that make a signed message act once, on `target` (a topic root: a device
    prefix, the fleet prefix or <fleet>/groups/<group>), for `ttl_s` seconds: see
    edged/ota/freshness.py. `seq` defaults to the signing time in ms, which grows from one
    signing to the next (pass --seq when signing from machines whose clocks disagree)."""
    now = time.time() if now is None else now
    if not 0 < ttl_s <= MAX_LIFETIME_S:
        raise ToolError(f"--ttl must be between 0 and {MAX_LIFETIME_S} s, got {ttl_s:g}")
    return {"target": target.rstrip("/"), "seq": seq if seq is not None else int(now * 1000),
            "expires": int(now + ttl_s)}


def sign(manifest_path: Path, key_path: Path, artifact: Path | None = None, *,
         target: str | None = None, ttl_s: float = DEFAULT_TTL_S,
         seq: int | None = None) -> dict[str, Any]:
    """The manifest at `manifest_path`, signed, with fresh target, seq and expires (target:
    `target`, or the manifest's own; with neither, none of the three, and devices refuse it
    as stale unless ota.allow_unsigned); with `artifact`, its size and sha256 are filled in
    first. The result is checked by parsing it as a device would."""
    document = read_manifest(manifest_path)
    if artifact is not None:
        document["artifact"] = {**document.get("artifact", {}), **describe_artifact(artifact)}
    target = target or document.get("target")
    if isinstance(target, str) and target:
        document.update(freshness(target, ttl_s=ttl_s, seq=seq))
    signed = sign_document(document, load_private_key(key_path))
    parse_manifest(json.dumps(signed).encode())  # refuse to sign what a device would refuse
    return signed
