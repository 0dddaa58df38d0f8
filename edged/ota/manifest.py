"""OTA manifests and rollback commands: parsing with typed rejections, the canonical form the
signature covers, Ed25519 signing and verification against the keys the device trusts.

The canonical form of a signed document is every field but `signature`, canonicalised by
RFC 8785 (JSON Canonicalization Scheme: sorted keys, no whitespace, UTF-8, ECMAScript
numbers), so that signers in other languages reproduce it with a JCS library. `key_id` is
the first 16 hex digits of the sha256 of the raw 32-byte public key. The freshness fields
(target, seq, expires) are checked by edged/ota/freshness.py.
docs/schemas/ota-manifest.schema.json documents the fields.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from edged.core.errors import ModelNotFound, UpdateRejected
from edged.core.states import OtaState
from edged.model.repository import check_model_name

if TYPE_CHECKING:
    from edged.ota.rollout import Rollout

MAX_MANIFEST_BYTES = 64 * 1024
MAX_COMMAND_BYTES = 4 * 1024  # a rollback command is a few hundred bytes


FINAL = frozenset({OtaState.ACTIVE, OtaState.FAILED, OtaState.ROLLED_BACK})
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_KEY_ID = re.compile(r"^[0-9a-f]{16}$")
_DTYPES = {"bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
           "float16", "float32", "float64", "bfloat16", "string"}
_FIELDS = {"model", "version", "format", "artifact", "precision", "force", "io",
           "allow_io_change", "key_id", "signature", "group", "note", "target", "seq", "expires",
           "rollout"}
_COMMAND_FIELDS = {"model", "action", "from_version", "version", "target", "seq", "expires",
                   "key_id", "signature"}
ACTIONS = ("rollback", "promote", "reject")
_MAX_JSON_INT = 2 ** 53 - 1  # RFC 8785 numbers are IEEE doubles: larger ints do not survive


class Rejected(UpdateRejected):
    """An update refused before anything changed; `reason` is a stable machine code."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(f"{reason}: {message}")

    def to_dict(self) -> dict[str, str]:
        return {"error": str(self), "code": self.code, "reason": self.reason}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]  # -1 for a dynamic dim, batch dim excluded when batched


@dataclass(frozen=True)
class Artifact:
    size: int
    sha256: str
    url: str | None = None  # http(s):// or file://
    chunks: int | None = None  # instead of url: bytes follow on ota/<model>/chunk/<i>

    @property
    def attached(self) -> bool:
        """Neither url nor chunks: the bytes come with the manifest itself (the socket API's
        install route, which the Mender update module uses); over MQTT that is refused."""
        return self.url is None and self.chunks is None


@dataclass(frozen=True)
class Manifest:
    model: str
    version: int
    format: Literal["onnx", "bundle", "gguf"]  # gguf: a language model's file
    artifact: Artifact
    precision: str = "fp32"
    force: bool = False  # allow a downgrade (never the active version number again)
    allow_io_change: bool = False
    io: tuple[tuple[Tensor, ...], tuple[Tensor, ...]] | None = None  # expected inputs, outputs
    key_id: str | None = None
    signature: str | None = None
    group: str | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    rollout: Rollout | None = None  # None: direct (edged/ota/rollout.py)

    @property
    def shadow(self) -> bool:
        return self.rollout is not None and self.rollout.shadow

    def canonical(self) -> bytes:
        return canonical_bytes(self.raw)


def canonical_bytes(document: Mapping[str, Any]) -> bytes:
    """What the signature covers: the document without `signature`, in its RFC 8785 form.
    Rejected('bad_manifest') for what JCS cannot represent (integers beyond 2^53, NaN)."""
    import rfc8785

    body = {k: v for k, v in document.items() if k != "signature"}
    try:
        return rfc8785.dumps(body)
    except rfc8785.CanonicalizationError as exc:
        raise Rejected("bad_manifest", f"not canonicalisable (RFC 8785): {exc}") from None


def _bounded_json(payload: bytes, limit: int, reason: str, what: str) -> Any:
    """JSON of at most `limit` bytes (the length is checked before anything is parsed), or
    Rejected(reason)."""
    if len(payload) > limit:
        raise Rejected(reason, f"the {what} is {len(payload)} bytes; the limit is {limit}")
    try:
        return json.loads(payload.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Rejected(reason, f"not JSON: {exc}") from None


def parse_manifest(payload: bytes) -> Manifest:
    """A manifest from its JSON bytes, or Rejected('bad_manifest' | 'bad_name', why)."""
    doc = _bounded_json(payload, MAX_MANIFEST_BYTES, "bad_manifest", "manifest")
    if not isinstance(doc, dict):
        raise Rejected("bad_manifest", "a manifest is a JSON object")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise Rejected("bad_manifest", f"unknown fields: {', '.join(unknown)}")
    name = _get(doc, "model", str)
    try:
        check_model_name(name)
    except ModelNotFound:
        raise Rejected("bad_name", f"model name {name!r} is not a safe directory name "
                                   "(letters, digits, _ . -)") from None
    version = _get(doc, "version", int)
    if version < 1:
        raise Rejected("bad_manifest", f"version must be a positive integer, got {version}")
    fmt = _get(doc, "format", str, "onnx")
    if fmt not in ("onnx", "bundle", "gguf"):
        raise Rejected("bad_manifest", f"format must be onnx, bundle or gguf, got {fmt!r}")
    precision = _get(doc, "precision", str, "fp32")
    if precision not in ("fp32", "fp16", "int8", "auto"):
        raise Rejected("bad_manifest", f"precision must be fp32, fp16, int8 or auto, "
                                       f"got {precision!r}")
    key_id, signature = doc.get("key_id"), doc.get("signature")
    if key_id is not None and (not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id)):
        raise Rejected("bad_manifest", "key_id must be 16 lowercase hex digits")
    if signature is not None and not isinstance(signature, str):
        raise Rejected("bad_manifest", "signature must be a base64 string")
    group = doc.get("group")
    if group is not None and not isinstance(group, str):
        raise Rejected("bad_manifest", "group must be a string")
    _freshness_types(doc, "bad_manifest")
    from edged.ota.rollout import parse_rollout  # it reads Rejected from here

    return Manifest(name, version, fmt, _artifact(doc.get("artifact")), precision,
                    _get(doc, "force", bool, False), _get(doc, "allow_io_change", bool, False),
                    _io(doc.get("io")), key_id, signature, group, doc,
                    parse_rollout(doc.get("rollout")))


def _freshness_types(doc: Mapping[str, Any], bad: str) -> None:
    """target, seq and expires, where given, have their types (the freshness rule itself is
    checked where the topic is known: edged/ota/freshness.py)."""
    target = doc.get("target")
    if target is not None and (not isinstance(target, str) or not target):
        raise Rejected(bad, "target must be a non-empty topic root")
    for key in ("seq", "expires"):
        value = doc.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not 1 <= value <= _MAX_JSON_INT):
            raise Rejected(bad, f"{key} must be an integer from 1 to 2^53-1, got {value!r:.40}")


@dataclass(frozen=True)
class Command:
    """An operator's command about `model`: `rollback` (serve the previous version; only if
    the active one is `from_version`, when given), or `promote` / `reject` the candidate that
    a shadow rollout is proving (only if it is `version`, when given)."""

    model: str
    from_version: int | None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    action: str = "rollback"
    version: int | None = None


def parse_command(payload: bytes) -> Command:
    """A command from its JSON bytes, or Rejected('bad_command', why)."""
    doc = _bounded_json(payload, MAX_COMMAND_BYTES, "bad_command", "command")
    usage = ('commands are {"model": "<model>", "action": "rollback", optional '
             '"from_version": <int>} or {"model", "action": "promote" | "reject", optional '
             '"version": <the shadowed candidate>}, with "target", "seq", "expires", signed '
             'like manifests')
    if not isinstance(doc, dict) or doc.get("action") not in ACTIONS or \
            not isinstance(doc.get("model"), str) or set(doc) - _COMMAND_FIELDS:
        raise Rejected("bad_command", usage)
    versions = {}
    for key in ("from_version", "version"):
        value = doc.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise Rejected("bad_command", usage)
        versions[key] = value
    if (doc["action"] == "rollback" and versions["version"] is not None) or \
            (doc["action"] != "rollback" and versions["from_version"] is not None):
        raise Rejected("bad_command", usage)
    _freshness_types(doc, "bad_command")
    return Command(doc["model"], versions["from_version"], doc, doc["action"],
                   versions["version"])


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def _get(doc: Mapping[str, Any], key: str, kind: type, default: Any = ...) -> Any:
    if key not in doc:
        if default is ...:
            raise Rejected("bad_manifest", f"missing field {key!r}")
        return default
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise Rejected("bad_manifest", f"{key} must be a {kind.__name__}, got {value!r:.80}")
    return value


def _artifact(value: Any) -> Artifact:
    if not isinstance(value, dict):
        raise Rejected("bad_manifest", "artifact must be an object with size and sha256")
    unknown = sorted(set(value) - {"url", "chunks", "size", "sha256"})
    if unknown:
        raise Rejected("bad_manifest", f"unknown artifact fields: {', '.join(unknown)}")
    size = _get(value, "size", int)
    sha256 = _get(value, "sha256", str)
    if size < 1:
        raise Rejected("bad_manifest", f"artifact.size must be positive, got {size}")
    if not _SHA256.fullmatch(sha256):
        raise Rejected("bad_manifest", "artifact.sha256 must be 64 lowercase hex digits")
    url, chunks = value.get("url"), value.get("chunks")
    if url is not None and chunks is not None:  # neither: attached (Artifact.attached)
        raise Rejected("bad_manifest", "artifact takes one of url and chunks, not both")
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://", "file://")):
            raise Rejected("bad_manifest", "artifact.url must be http://, https:// or file://")
    elif chunks is not None and (not isinstance(chunks, int) or isinstance(chunks, bool)
                                 or not 1 <= chunks <= 4096):
        raise Rejected("bad_manifest", "artifact.chunks must be an integer from 1 to 4096")
    return Artifact(size, sha256, url, chunks)


def _io(value: Any) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) - {"inputs", "outputs"}:
        raise Rejected("bad_manifest", "io must be an object with inputs and outputs")
    sides = []
    for side in ("inputs", "outputs"):
        tensors = value.get(side, [])
        if not isinstance(tensors, list):
            raise Rejected("bad_manifest", f"io.{side} must be a list")
        sides.append(tuple(_tensor(t, f"io.{side}") for t in tensors))
    return sides[0], sides[1]


def _tensor(value: Any, where: str) -> Tensor:
    if not isinstance(value, dict):
        raise Rejected("bad_manifest", f"{where}: each tensor is an object")
    name, dtype, shape = value.get("name"), value.get("dtype"), value.get("shape")
    if not isinstance(name, str) or dtype not in _DTYPES or not isinstance(shape, list) or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= -1 for d in shape):
        raise Rejected("bad_manifest", f"{where}: tensor needs name, a known dtype and a shape "
                                       f"of integers (-1 = dynamic), got {value!r:.120}")
    return Tensor(name, dtype, tuple(shape))


# -- keys and signatures -----------------------------------------------------------------------
def key_id_of(public_key: Any) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


class TrustStore:
    """The Ed25519 public keys a device accepts manifests from, by key_id."""

    def __init__(self, keys: Mapping[str, Any]) -> None:
        self.keys = dict(keys)

    @classmethod
    def load(cls, paths: Iterable[Path]) -> TrustStore:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        from edged.core.credentials import credential
        from edged.core.errors import ConfigError

        keys = {}
        for given in paths:
            path = credential(Path(given))  # relative: LoadCredential=ota-<name>.pub
            try:
                key = load_pem_public_key(path.read_bytes())
            except (OSError, ValueError) as exc:
                raise ConfigError(f"ota.trusted_keys: cannot read {path}: {exc}") from None
            if not isinstance(key, Ed25519PublicKey):
                raise ConfigError(f"ota.trusted_keys: {path} is not an Ed25519 public key")
            keys[key_id_of(key)] = key
        return cls(keys)

    def verify(self, manifest: Manifest, *, allow_unsigned: bool) -> str | None:
        """The key_id that signed `manifest` (None if unsigned and that is allowed)."""
        return self.verify_document(manifest.raw, allow_unsigned=allow_unsigned)

    def verify_document(self, document: Mapping[str, Any], *,
                        allow_unsigned: bool) -> str | None:
        """Check the signature of any signed document (manifests, commands)."""
        from cryptography.exceptions import InvalidSignature

        key_id, signature = document.get("key_id"), document.get("signature")
        if signature is None:
            if allow_unsigned:
                return None
            raise Rejected("unsigned", "no signature, and ota.allow_unsigned is false")
        if not isinstance(key_id, str) or not isinstance(signature, str):
            raise Rejected("bad_manifest", "a signed document needs key_id and a base64 "
                                           "signature")
        key = self.keys.get(key_id)
        if key is None:
            raise Rejected("unknown_key", f"key {key_id} is not in ota.trusted_keys")
        try:
            key.verify(base64.b64decode(signature, validate=True), canonical_bytes(document))
        except (InvalidSignature, binascii.Error, ValueError):
            raise Rejected("bad_signature", f"the signature does not verify with key "
                                            f"{key_id}") from None
        return key_id


def sign_document(document: Mapping[str, Any], private_key: Any) -> dict[str, Any]:
    """`document` with key_id and signature set by `private_key` (an Ed25519PrivateKey)."""
    signed = {k: v for k, v in document.items() if k != "signature"}
    signed["key_id"] = key_id_of(private_key.public_key())
    signed["signature"] = base64.b64encode(private_key.sign(canonical_bytes(signed))).decode()
    return signed
