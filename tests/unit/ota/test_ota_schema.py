"""docs/schemas/ota-manifest.schema.json and parse_manifest agree: a manifest one accepts the
other accepts, and a manifest one refuses the other refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edged.ota import manifest
from edged.ota.manifest import MAX_MANIFEST_BYTES, Rejected, parse_manifest, sign_document

SCHEMA_PATH = Path(__file__).parents[3] / "docs" / "schemas" / "ota-manifest.schema.json"
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
SHA = "ab" * 32
DROP: Any = object()  # doc(field=DROP) leaves the field out
IO = {"inputs": [{"name": "x", "dtype": "float32", "shape": [3, -1, -1]}],
      "outputs": [{"name": "prob", "dtype": "bfloat16", "shape": []}]}


def doc(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "cls", "version": 2,
                            "artifact": {"url": "https://h/m.onnx", "size": 10, "sha256": SHA}}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not DROP}


def art(**changes: Any) -> dict[str, Any]:
    return {k: v for k, v in {"url": "https://h/m.onnx", "size": 10, "sha256": SHA,
                              **changes}.items() if v is not DROP}


GOOD = {
    "url-artifact": doc(),
    "file-url-and-every-option": doc(
        artifact=art(url="file:///srv/m.onnx"), format="onnx", precision="auto", force=True,
        allow_io_change=True, group="line-1", note={"changes": ["retrained"]}),
    "chunks-artifact": doc(model="a" * 64, version=10**12, artifact=art(url=DROP, chunks=4096)),
    "nulls-count-as-absent": doc(artifact=art(url=None, chunks=1), key_id=None,
                                 signature=None, group=None, io=None),
    "bundle-with-io": doc(format="bundle", precision="int8", io=IO),
    "io-one-side-extra-tensor-keys": doc(io={"outputs": [
        {"name": "", "dtype": "string", "shape": [0], "doc": "ignored"}]}),
    "signed": sign_document(doc(format="bundle", io=IO, note="v2"),
                            Ed25519PrivateKey.generate()),
    "signed-fresh": sign_document(doc(target="edged/fleet/groups/line-1", seq=2 ** 53 - 1,
                                      expires=1_900_000_000), Ed25519PrivateKey.generate()),
    "freshness-nulls": doc(target=None, seq=None, expires=None),
    "attached-neither-url-nor-chunks": doc(artifact=art(url=DROP)),
    "attached-url-and-chunks-null": doc(artifact=art(url=None, chunks=None)),
    "rollout-shadow-every-field": doc(rollout={
        "mode": "shadow", "sample": 0.1, "min_samples": 500, "max_duration_s": 3600,
        "promote_if": {"min_top1_agreement": 0.98, "max_failure_rate": 0, "max_p99_ms": 25}}),
    "rollout-direct-and-defaults": doc(rollout={"mode": "direct"}),
    "rollout-null": doc(rollout=None),
}

BAD = {
    "not-an-object": [doc()],
    "missing-model": doc(model=DROP),
    "missing-version": doc(version=DROP),
    "missing-artifact": doc(artifact=DROP),
    "unknown-top-level-field": doc(extra=1),
    "model-not-a-string": doc(model=3),
    "model-dotdot-slash": doc(model="../x"),
    "model-with-slash": doc(model="a/b"),
    "model-hidden": doc(model=".hidden"),
    "model-inner-dotdot": doc(model="a..b"),
    "model-65-chars": doc(model="a" * 65),
    "model-trailing-newline": doc(model="cls\n"),
    "version-0": doc(version=0),
    "version-negative": doc(version=-3),
    "version-bool": doc(version=True),
    "version-string": doc(version="3"),
    "format-zip": doc(format="zip"),
    "format-null": doc(format=None),
    "precision-int4": doc(precision="int4"),
    "force-string": doc(force="yes"),
    "allow-io-change-int": doc(allow_io_change=1),
    "sha256-uppercase": doc(artifact=art(sha256="AB" * 32)),
    "sha256-short": doc(artifact=art(sha256="ab" * 31)),
    "sha256-trailing-newline": doc(artifact=art(sha256=SHA + "\n")),
    "sha256-missing": doc(artifact=art(sha256=DROP)),
    "size-0": doc(artifact=art(size=0)),
    "size-bool": doc(artifact=art(size=True)),
    "url-and-chunks": doc(artifact=art(chunks=2)),
    "url-ftp": doc(artifact=art(url="ftp://h/m.onnx")),
    "chunks-0": doc(artifact=art(url=DROP, chunks=0)),
    "chunks-4097": doc(artifact=art(url=DROP, chunks=4097)),
    "chunks-bool": doc(artifact=art(url=DROP, chunks=True)),
    "unknown-artifact-field": doc(artifact=art(mirror="https://m/m.onnx")),
    "io-bad-dtype": doc(io={"inputs": [{"name": "x", "dtype": "float99", "shape": [1]}]}),
    "io-shape-below-minus-1": doc(io={"inputs": [{"name": "x", "dtype": "int8", "shape": [-2]}]}),
    "io-tensor-without-name": doc(io={"inputs": [{"dtype": "int8", "shape": [1]}]}),
    "io-unknown-side": doc(io={"inputs": [], "states": []}),
    "io-side-not-a-list": doc(io={"outputs": None}),
    "key-id-uppercase": doc(key_id="0123456789ABCDEF"),
    "key-id-short": doc(key_id="0123abcd"),
    "key-id-trailing-newline": doc(key_id="0123456789abcdef\n"),
    "signature-not-a-string": doc(signature=5),
    "group-not-a-string": doc(group=["line-1"]),
    "target-empty": doc(target=""),
    "target-not-a-string": doc(target=["edged/edge-01"]),
    "seq-0": doc(seq=0),
    "seq-beyond-2^53": doc(seq=2 ** 53),
    "seq-string": doc(seq="17"),
    "expires-bool": doc(expires=True),
    "rollout-not-an-object": doc(rollout="shadow"),
    "rollout-mode-canary": doc(rollout={"mode": "canary"}),
    "rollout-sample-0": doc(rollout={"mode": "shadow", "sample": 0}),
    "rollout-sample-above-1": doc(rollout={"mode": "shadow", "sample": 1.5}),
    "rollout-min-samples-0": doc(rollout={"mode": "shadow", "min_samples": 0}),
    "rollout-min-samples-string": doc(rollout={"mode": "shadow", "min_samples": "500"}),
    "rollout-duration-beyond-a-week": doc(rollout={"mode": "shadow", "max_duration_s": 10**6}),
    "rollout-unknown-bound": doc(rollout={"mode": "shadow", "promote_if": {"min_vibes": 1}}),
    "rollout-bound-not-a-number": doc(rollout={"promote_if": {"min_cosine": "0.9"}}),
    "rollout-unknown-field": doc(rollout={"mode": "shadow", "waves": [1]}),
}


def test_schema_when_checked_against_its_metaschema_is_valid() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)


def test_schema_when_compared_with_the_parser_lists_the_same_fields_and_dtypes() -> None:
    assert set(SCHEMA["properties"]) == manifest._FIELDS
    assert set(SCHEMA["$defs"]["tensor"]["properties"]["dtype"]["enum"]) == manifest._DTYPES


@pytest.mark.parametrize("document", GOOD.values(), ids=GOOD.keys())
def test_manifest_when_good_passes_schema_and_parser(document: dict[str, Any]) -> None:
    VALIDATOR.validate(document)
    assert parse_manifest(json.dumps(document).encode()).raw == document


@pytest.mark.parametrize("document", BAD.values(), ids=BAD.keys())
def test_manifest_when_bad_is_refused_by_schema_and_parser(document: Any) -> None:
    assert not VALIDATOR.is_valid(document)
    with pytest.raises(Rejected):
        parse_manifest(json.dumps(document).encode())


@pytest.mark.parametrize("payload", [
    json.dumps(doc(note="x" * MAX_MANIFEST_BYTES)).encode(),
    json.dumps(doc()).replace('"version": 2', '"version": 2.0').encode(),
], ids=["over-64-KiB", "version-written-2.0"])
def test_manifest_when_beyond_json_schema_is_refused_by_parser_alone(payload: bytes) -> None:
    assert VALIDATOR.is_valid(json.loads(payload))
    with pytest.raises(Rejected):
        parse_manifest(payload)
    assert "65536" in SCHEMA["description"] and "2.0" in SCHEMA["description"]
