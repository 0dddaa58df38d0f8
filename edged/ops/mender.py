"""`edged ota mender-artifact`: one model version as a Mender artifact of type `edged-model`,
for fleets that roll out with Mender (phased deployments, its own artifact signatures). The
payload is what deploy/mender/edged-model hands to edged on the device: `manifest.json`, an
edged manifest signed with the fleet key for the topic root `local`, and the model file or
bundle it describes (attached: no url). `mender-artifact` (Debian's package) writes the
artifact and signs it with Mender's own key (`--mender-key`), which the devices' mender.conf
`ArtifactVerifyKey` checks; each model's version is an artifact provide,
`edged-model.<model>.version`, so Mender's inventory lists what every device serves."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from edged.core.errors import ToolError
from edged.model.repository import check_model_name
from edged.ops.keys import (
    DEFAULT_TTL_S,
    describe_artifact,
    freshness,
    load_private_key,
    read_manifest,
)
from edged.ota.freshness import LOCAL_ROOT
from edged.ota.manifest import Rejected, parse_manifest, sign_document

PAYLOAD_TYPE = "edged-model"
FILE_NAMES = {"onnx": "model.onnx", "bundle": "bundle.tar.gz", "gguf": "model.gguf"}
# Manifest fields an operator may add with --manifest (the rest this command writes).
EXTRA_FIELDS = ("precision", "force", "allow_io_change", "io", "group", "note", "rollout")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="the model's name on the devices")
    parser.add_argument("version", type=int, help="the version this artifact installs")
    parser.add_argument("--artifact", type=Path, required=True,
                        help="model.onnx, a language model's .gguf, or a bundle .tar.gz "
                             "(model.onnx, model.yaml, golden/)")
    parser.add_argument("--format", choices=["onnx", "bundle", "gguf"],
                        help="default: bundle for a .tar.gz / .tgz, gguf for a .gguf, else onnx")
    parser.add_argument("--key", type=Path,
                        help="the fleet's Ed25519 key (edged ota keygen): devices verify the "
                             "manifest against ota.trusted_keys; without it the manifest is "
                             "unsigned and only devices with ota.allow_unsigned take it")
    parser.add_argument("--manifest", type=Path, metavar="JSON",
                        help="more manifest fields: " + ", ".join(EXTRA_FIELDS))
    parser.add_argument("--device-type", "-t", action="append", required=True,
                        help="Mender device type the artifact is for (repeatable)")
    parser.add_argument("--name", "-n", help="Mender artifact name (default MODEL-vVERSION)")
    parser.add_argument("--mender-key", "-k", type=Path,
                        help="Mender signing key (RSA or ECDSA, traditional PEM: `openssl rsa "
                             "-traditional`, `openssl ec`) for the devices' ArtifactVerifyKey")
    parser.add_argument("--ttl", type=float, default=DEFAULT_TTL_S, metavar="SECONDS",
                        help="devices refuse the manifest after this long (default a day; at "
                             "most 31 days: build the artifact again for a later deployment)")
    parser.add_argument("--seq", type=int, help="the manifest's seq (default: the time in ms)")
    parser.add_argument("--output", "-o", type=Path, required=True, help="the .mender file")
    parser.add_argument("--payload-only", action="store_true",
                        help="write manifest.json and the model beside --output and print the "
                             "mender-artifact command, instead of running it (a build machine "
                             "without mender-artifact)")


def run(args: argparse.Namespace) -> int:
    if not args.payload_only and shutil.which("mender-artifact") is None:
        raise ToolError("mender-artifact is not installed (apt-get install mender-artifact), "
                        "or pass --payload-only and run the printed command where it is")
    fmt = args.format or ("bundle" if args.artifact.name.endswith((".tar.gz", ".tgz"))
                          else "gguf" if args.artifact.name.endswith(".gguf") else "onnx")
    manifest = build_manifest(args.model, args.version, args.artifact, fmt, key=args.key,
                              extra=_extra(args.manifest), ttl_s=args.ttl, seq=args.seq)
    name = args.name or f"{args.model}-v{args.version}"
    if args.payload_only:
        folder = args.output.with_name(args.output.name + ".payload")
        folder.mkdir(parents=True, exist_ok=True)
        command = _write_payload(folder, manifest, args.artifact, fmt, name, args)
        print(" ".join(command))
        return 0
    with tempfile.TemporaryDirectory(prefix="edged-mender-") as tmp:
        command = _write_payload(Path(tmp), manifest, args.artifact, fmt, name, args)
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ToolError(f"mender-artifact failed ({done.returncode}): "
                        f"{(done.stderr or done.stdout).strip()[-2000:]}")
    signed = "signed with " + str(args.mender_key) if args.mender_key else "not signed for Mender"
    print(f"{args.output}: {PAYLOAD_TYPE} artifact {name!r}, {args.model} version "
          f"{args.version} ({fmt}), {signed}; manifest "
          f"{'signed, key ' + manifest['key_id'] if 'signature' in manifest else 'unsigned'}")
    if "signature" not in manifest:
        print("warning: the manifest is unsigned: devices refuse it unless ota.allow_unsigned",
              file=sys.stderr)
    return 0


def build_manifest(model: str, version: int, artifact: Path, fmt: str, *, key: Path | None,
                   extra: dict[str, Any], ttl_s: float = DEFAULT_TTL_S,
                   seq: int | None = None) -> dict[str, Any]:
    """The manifest the module hands to edged: the artifact attached (size and sha256, no
    url), fresh for the root `local` and signed when `key` is given; checked as a device
    will read it."""
    try:
        check_model_name(model)
    except Exception as exc:
        raise ToolError(str(exc)) from None
    if not artifact.is_file():
        raise ToolError(f"--artifact {artifact}: no such file")
    if fmt == "bundle" and not tarfile.is_tarfile(artifact):
        raise ToolError(f"--artifact {artifact}: not a .tar.gz bundle")
    document: dict[str, Any] = {"model": model, "version": version, "format": fmt,
                                "artifact": describe_artifact(artifact), **extra}
    if key is not None:
        document.update(freshness(LOCAL_ROOT, ttl_s=ttl_s, seq=seq))
        document = sign_document(document, load_private_key(key))
    try:
        parse_manifest(json.dumps(document).encode())
    except Rejected as exc:
        raise ToolError(f"a device would refuse the manifest: {exc}") from None
    return document


def _extra(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    given = read_manifest(path)
    unknown = sorted(set(given) - set(EXTRA_FIELDS))
    if unknown:
        raise ToolError(f"--manifest {path}: this command writes {', '.join(unknown)} itself "
                        f"(fields taken: {', '.join(EXTRA_FIELDS)})")
    return given


def _write_payload(folder: Path, manifest: dict[str, Any], artifact: Path, fmt: str,
                   name: str, args: argparse.Namespace) -> list[str]:
    """manifest.json and the model in `folder`; returns the mender-artifact command."""
    (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    model_file = folder / FILE_NAMES[fmt]
    shutil.copyfile(artifact, model_file)
    command = ["mender-artifact", "write", "module-image", "--type", PAYLOAD_TYPE,
               "--artifact-name", name, "--file", str(folder / "manifest.json"),
               "--file", str(model_file),
               # Provides per model: installing one model clears only its own provides.
               "--software-filesystem", PAYLOAD_TYPE, "--software-name", args.model,
               "--software-version", str(args.version),
               "--output-path", str(args.output)]
    for device_type in args.device_type:
        command += ["--device-type", device_type]
    if args.mender_key is not None:
        command += ["--key", str(args.mender_key)]
    return command
