"""The demo's OTA update (`make ota-demo`): the next version of the demo model and a manifest
that `edged ota push --key` completes and a device accepts."""

from __future__ import annotations

import json
from pathlib import Path

from edged.ops.keys import keygen
from edged.ops.push import prepare
from edged.ota.manifest import parse_manifest
from tools.assets.demo import write_ota_update


def test_ota_update_when_the_demo_has_version_1_writes_version_2_that_signs_clean(
        tmp_path: Path) -> None:
    (tmp_path / "models" / "colors" / "1").mkdir(parents=True)
    manifest = write_ota_update(tmp_path)
    assert json.loads(manifest.read_text())["version"] == 2
    keygen(tmp_path / "keys" / "demo")  # makes the folder, as `make run` needs it to
    signed, data = prepare(manifest, key=tmp_path / "keys" / "demo",
                           artifact=tmp_path / "ota" / "model.onnx", url=None, inline=True)
    parsed = parse_manifest(json.dumps(signed).encode())  # as the device reads it
    assert data == (tmp_path / "ota" / "model.onnx").read_bytes()
    assert (parsed.model, parsed.version, parsed.format) == ("colors", 2, "onnx")
    assert parsed.artifact.size == (tmp_path / "ota" / "model.onnx").stat().st_size
