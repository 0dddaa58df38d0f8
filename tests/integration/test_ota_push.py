"""`edged ota push` and `edged ota rollback` against in-process daemons and a real mosquitto:
the tool signs, serves the artifact from its own HTTP server (or sends it as MQTT chunks),
follows the devices' status to the end and exits 0, 1 or 2 as documented."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.broker import Broker
from support.daemon import ServeFactory
from support.ota import X, expected, tiny_cls_bytes

from edged.cli import main
from edged.ops.keys import keygen


@pytest.fixture
def fleet_key(tmp_path: Path) -> tuple[Path, Path]:
    private = tmp_path / "fleet.key"
    public, _key_id = keygen(private)
    return private, public


def write(tmp_path: Path, version: int, seed: int) -> tuple[Path, Path]:
    """An unsigned manifest for tiny_cls `version` and its artifact file."""
    artifact = tmp_path / f"tiny_cls-{version}.onnx"
    artifact.write_bytes(tiny_cls_bytes(seed))
    manifest = tmp_path / f"tiny_cls-{version}.json"
    manifest.write_text(json.dumps({"model": "tiny_cls", "version": version, "format": "onnx",
                                    "artifact": {"url": "http://127.0.0.1:9/unused"}}))
    return manifest, artifact


def test_ota_push_when_serving_the_artifact_follows_the_device_to_active_then_rolls_back(
        broker: Broker, make_served: ServeFactory, fleet_key: tuple[Path, Path],
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = fleet_key
    prefix = "t/push/dev1"
    served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}",
                         ota=f"trusted_keys: [{public}]")
    common = ["--broker", f"127.0.0.1:{broker.port}", "--device", prefix, "--timeout", "60"]
    manifest, artifact = write(tmp_path, 2, 1)
    # Retained: the device gets it whenever its subscription is in place.
    assert main(["ota", "push", str(manifest), "--key", str(private), "--artifact",
                 str(artifact), "--serve", "127.0.0.1:0", "--retain", *common]) == 0
    out = capsys.readouterr().out
    assert "serving" in out and f"{prefix}  tiny_cls:2  downloading 100%" in out
    assert f"{prefix}  tiny_cls:2  active" in out and "done: 1 active" in out
    with served.client() as client:
        np.testing.assert_allclose(client.infer("tiny_cls", {"x": X}).outputs["prob"],
                                   expected(1), rtol=1e-5)

    older, older_artifact = write(tmp_path, 1, 5)
    assert main(["ota", "push", str(older), "--key", str(private), "--artifact",
                 str(older_artifact), "--serve", "127.0.0.1:0", *common]) == 1
    out = capsys.readouterr().out
    assert "failed [downgrade]" in out and "FAILED: 1 failed" in out

    assert main(["ota", "rollback", "tiny_cls", "--key", str(private), "--from-version", "2",
                 *common]) == 0
    out = capsys.readouterr().out
    assert "tiny_cls:1  rolled_back" in out and "done: 1 rolled_back" in out
    with served.client() as client:
        np.testing.assert_allclose(client.infer("tiny_cls", {"x": X}).outputs["prob"],
                                   expected(0), rtol=1e-5)
    # Again: the device no longer serves 2, so it has nothing to do, and says so.
    assert main(["ota", "rollback", "tiny_cls", "--key", str(private), "--from-version", "2",
                 *common]) == 0
    assert "not 2: nothing to roll back" in capsys.readouterr().out
    assert served.daemon.cache.repository.versions_on_disk("tiny_cls") == [1]


def test_ota_push_when_inline_to_the_fleet_reaches_each_expected_device(
        broker: Broker, make_served: ServeFactory, fleet_key: tuple[Path, Path],
        repo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = fleet_key
    for device in ("d1", "d2"):
        models = tmp_path / f"models-{device}"
        shutil.copytree(repo_dir, models)
        make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/push2/{device}, "
                         "fleet_prefix: t/push2/fleet",
                    ota=f"trusted_keys: [{public}]", device_id=device, models_dir=models)
    manifest, artifact = write(tmp_path, 2, 1)
    try:
        assert main(["ota", "push", str(manifest), "--key", str(private), "--artifact",
                     str(artifact), "--inline", "--retain", "--fleet", "t/push2/fleet",
                     "--expect", "2", "--broker", f"127.0.0.1:{broker.port}",
                     "--timeout", "60"]) == 0  # watches t/push2/+ by default
        out = capsys.readouterr().out
        assert "t/push2/d1  tiny_cls:2  active" in out and "t/push2/d2  tiny_cls:2  active" in out
        assert "done: 2 active" in out
    finally:  # the retained fleet manifest must not reach later tests' daemons
        main(["ota", "rollback", "tiny_cls", "--key", str(private), "--fleet", "t/push2/fleet",
              "--expect", "2", "--broker", f"127.0.0.1:{broker.port}", "--timeout", "30"])


@pytest.mark.parametrize(("args", "message"), [
    (["-k", "-a", "-b", "--device", "t/push3/nobody", "--timeout", "1"],
     "did not finish in time"),
    (["-k", "-a", "-b", "--device", "a", "--fleet", "b"], "(--device PREFIX, repeatable) or"),
    (["-k", "-b", "--device", "a", "--serve", "127.0.0.1:0"], "--serve needs --artifact"),
    (["-a", "-b", "--device", "a"], "do not match what is being sent; pass --key"),
    (["-b", "--device", "a"], "a device would refuse it: bad_manifest: missing field 'size'"),
    (["-k", "-a", "--device", "a", "--broker", "127.0.0.1:1"], "cannot reach the broker"),
    (["-k", "-a", "--device", "a", "--broker", "nonsense"], "--broker: expected HOST:PORT"),
    (["-k", "-a", "-b", "--device", "a", "--serve", "0.0.0.0:0"], "say which one devices"),
    (["-k", "-a", "-b", "--device", "a", "--serve", "127.0.0.1:0", "--inline"], "pick one"),
    (["-k", "-a", "-b", "--device", "a", "--group", "line-3"], "--group goes with --fleet"),
])
def test_ota_push_when_misused_or_unanswered_says_why(
        broker: Broker, fleet_key: tuple[Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    manifest, artifact = write(tmp_path, 2, 1)
    short = {"-k": ["--key", str(fleet_key[0])], "-a": ["--artifact", str(artifact)],
             "-b": ["--broker", f"127.0.0.1:{broker.port}"]}
    argv = [part for arg in args for part in short.get(arg, [arg])]
    code = main(["ota", "push", str(manifest), *argv])
    captured = capsys.readouterr()
    assert code == (2 if "finish" in message else 1), captured
    assert message in captured.out + captured.err
