"""OTA bundles: a .tar.gz holding `model.onnx`, optionally `model.yaml`, `model.int8.onnx`,
and a golden check in `golden/` (inputs.npz, outputs.npz, tolerance.json). Unpacked with the
checks an archive from the network needs: no links, no paths out, a size bound."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

from edged.model.repository import GGUF_FILE, MODEL_FILE
from edged.ota.manifest import Rejected

GOLDEN = "golden"  # bundle folder: inputs.npz, outputs.npz, tolerance.json


def unpack(archive: Path, dest: Path, max_bytes: int) -> None:
    """A bundle (.tar.gz) into `dest`: regular files only, at the top level or in golden/,
    names of letters, digits and _ . -, at most `max_bytes` unpacked. Anything else is
    refused before a byte is written."""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            total = 0
            for member in members:
                parts = member.name.split("/")
                if member.isdir() and member.name.rstrip("/") == GOLDEN:
                    continue
                ok = member.isfile() and all(_safe_name(p) for p in parts) and (
                    len(parts) == 1 or (len(parts) == 2 and parts[0] == GOLDEN))
                if not ok:
                    raise Rejected("bad_bundle", f"bundle member {member.name!r} is not allowed "
                                                 "(regular files at the top or in golden/)")
                total += member.size
                if total > max_bytes:
                    raise Rejected("oversize", f"the bundle unpacks to more than {max_bytes} "
                                               "bytes")
            if not {MODEL_FILE, GGUF_FILE} & {m.name for m in members}:
                raise Rejected("bad_bundle", f"the bundle has no {MODEL_FILE} (nor "
                                             f"{GGUF_FILE})")
            for member in members:
                if not member.isfile():
                    continue
                target = dest / member.name
                target.parent.mkdir(exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                with source, target.open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise Rejected("bad_bundle", f"not a readable .tar.gz: {exc}") from None


def _safe_name(part: str) -> bool:
    return bool(part) and not part.startswith(".") and all(
        c.isalnum() or c in "_.-" for c in part)
