"""Canary waves with `edged ota push --waves` over a fleet of three in-process daemons on one
private mosquitto, each with its own model repository and live socket traffic: a shadow
rollout goes to the first wave, is promoted there, and a second wave that fails halts the
rollout before the third device hears of it; offline devices are reported, not waited on; a
wave that does not finish in time is rolled back when asked; `edged ota decide` promotes a
candidate by a signed command."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from support.broker import Broker
from support.daemon import Served, ServeFactory
from support.shadow import nudged_cls_bytes, traffic

from edged.cli import main
from edged.core.errors import ToolError
from edged.ops.keys import keygen
from edged.ops.waves import parse_waves, plan


@pytest.fixture
def fleet_key(tmp_path: Path) -> tuple[Path, Path]:
    private = tmp_path / "fleet.key"
    public, _key_id = keygen(private)
    return private, public


def shadow_manifest(tmp_path: Path, min_samples: int = 10) -> tuple[Path, Path]:
    artifact = tmp_path / "tiny_cls-2.onnx"
    artifact.write_bytes(nudged_cls_bytes(0))
    manifest = tmp_path / "tiny_cls-2.json"
    manifest.write_text(json.dumps({
        "model": "tiny_cls", "version": 2, "format": "onnx",
        "artifact": {"url": "http://127.0.0.1:9/unused"},
        "rollout": {"mode": "shadow", "sample": 1.0, "min_samples": min_samples,
                    "max_duration_s": 300}}))
    return manifest, artifact


def fleet(make_served: ServeFactory, broker: Broker, repo_dir: Path, tmp_path: Path,
          root: str, keys: dict[str, Path]) -> dict[str, Served]:
    """One daemon per device name, trusting the key given for it."""
    devices = {}
    for name, public in keys.items():
        models = tmp_path / f"models-{name}"
        shutil.copytree(repo_dir, models)
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {root}/{name},"
                                  f" fleet_prefix: {root}/fleet",
                             ota=f"trusted_keys: [{public}], shadow: {{max_share: 1.0}}",
                             device_id=name, models_dir=models)
        assert served.daemon.ota is not None and served.daemon.ota.wait_listening(10)
        devices[name] = served
    return devices


@pytest.fixture
def live(request: pytest.FixtureRequest) -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def test_waves_when_the_second_wave_fails_halt_before_the_third(
        broker: Broker, make_served: ServeFactory, fleet_key: tuple[Path, Path],
        repo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        live: ExitStack) -> None:
    private, public = fleet_key
    other_public, _key_id = keygen(tmp_path / "other.key")
    root = "t/waves1"
    devices = fleet(make_served, broker, repo_dir, tmp_path, root,
                    {"a": public, "b": other_public, "c": public})  # b trusts another key
    for served in devices.values():
        live.enter_context(traffic(served))  # live requests: what a shadow is proven on
    # A device that was there once and is gone: its Last Will says so, retained.
    import paho.mqtt.publish as publish

    publish.single(f"{root}/d/status", b"offline", qos=1, retain=True, hostname="127.0.0.1",
                   port=broker.port)
    manifest, artifact = shadow_manifest(tmp_path)
    code = main(["ota", "push", str(manifest), "--key", str(private), "--artifact",
                 str(artifact), "--inline", "--fleet", f"{root}/fleet", "--waves", "1,2,100%",
                 "--broker", f"127.0.0.1:{broker.port}", "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert f"offline: {root}/d (not sent" in out
    assert "rolling tiny_cls:2 out to 3 device(s) in 3 wave(s) with a shadow run on each" in out
    assert f"wave 1/3: {root}/a\n" in out and f"{root}/a  tiny_cls:2  shadowing" in out
    assert f"{root}/a  tiny_cls:2  active" in out
    assert "wave 1: 1 device(s) healthy (promoted)" in out
    assert f"wave 2/3: {root}/b\n" in out and f"{root}/b  tiny_cls:2  failed [unknown_key]" in out
    assert f"HALTED at wave 2: failed: {root}/b; not sent to 1 device(s); 1 device(s) of " \
           "earlier waves keep version 2" in out
    assert "wave 3/3" not in out and f"{root}/c  tiny_cls" not in out
    assert devices["a"].daemon.cache.default_version("tiny_cls") == 2
    for name in ("b", "c"):
        assert devices[name].daemon.cache.default_version("tiny_cls") == 1
        assert devices[name].daemon.repository.versions_on_disk("tiny_cls") == [1]


def test_waves_when_a_wave_does_not_finish_in_time_rolls_it_back_when_asked(
        broker: Broker, make_served: ServeFactory, fleet_key: tuple[Path, Path],
        repo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = fleet_key
    root = "t/waves2"
    devices = fleet(make_served, broker, repo_dir, tmp_path, root, {"a": public, "b": public})
    manifest, artifact = shadow_manifest(tmp_path)
    # No live traffic: the shadow cannot gather its samples within the wave's time.
    code = main(["ota", "push", str(manifest), "--key", str(private), "--artifact",
                 str(artifact), "--inline", "--device", f"{root}/a", "--device", f"{root}/b",
                 "--waves", "1,100%", "--rollback-on-halt", "--broker",
                 f"127.0.0.1:{broker.port}", "--timeout", "3"])
    out = capsys.readouterr().out
    assert code == 2, out
    assert f"HALTED at wave 1: no answer in 3 s: {root}/a; not sent to 1 device(s)" in out
    assert f"{root}/a  reject sent" in out
    a = devices["a"].daemon

    def removed() -> bool:
        return a.repository.versions_on_disk("tiny_cls") == [1]

    from support.polling import wait_until

    wait_until(removed, timeout=20, what="the rejected candidate to go")
    assert a.cache.default_version("tiny_cls") == 1 and a.updater.shadows.get("tiny_cls") is None
    assert devices["b"].daemon.repository.versions_on_disk("tiny_cls") == [1]


def test_ota_decide_when_a_shadow_runs_promotes_it_by_a_signed_command(
        broker: Broker, make_served: ServeFactory, fleet_key: tuple[Path, Path],
        repo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    private, public = fleet_key
    root = "t/waves3"
    device = fleet(make_served, broker, repo_dir, tmp_path, root, {"a": public})["a"]
    manifest, artifact = shadow_manifest(tmp_path, min_samples=100_000)
    common = ["--broker", f"127.0.0.1:{broker.port}", "--device", f"{root}/a"]
    assert main(["ota", "push", str(manifest), "--key", str(private), "--artifact",
                 str(artifact), "--inline", "--waves", "100%", "--timeout", "2",
                 *common]) == 2
    assert f"{root}/a  tiny_cls:2  shadowing" in capsys.readouterr().out
    assert main(["ota", "decide", "tiny_cls", "--promote", "--version", "2", "--key",
                 str(private), "--timeout", "30", *common]) == 0
    out = capsys.readouterr().out
    assert f"{root}/a  tiny_cls:2  active" in out and "promoted by the operator" in out
    assert device.daemon.cache.default_version("tiny_cls") == 2
    assert main(["ota", "decide", "tiny_cls", "--reject", "--key", str(private), "--timeout",
                 "30", *common]) == 1
    assert "failed [no_shadow]" in capsys.readouterr().out


@pytest.mark.parametrize(("spec", "devices", "sizes"), [
    ("1,10%,100%", 30, [1, 2, 27]),
    ("1,10%,100%", 3, [1, 1, 1]),  # 10% of 3 rounds up to 1, taken: one more device then
    ("1,2,100%", 3, [1, 1, 1]),
    ("50%", 5, [5]),  # the last wave takes the rest
    ("5,100%", 3, [3]),
])
def test_waves_plan_when_given_counts_and_shares_splits_cumulatively(
        spec: str, devices: int, sizes: list[int]) -> None:
    names = [f"d{i:02}" for i in range(devices)]
    waves = plan(names, parse_waves(spec))
    assert [len(w.devices) for w in waves] == sizes
    assert [d for w in waves for d in w.devices] == names


@pytest.mark.parametrize("spec", ["", "0", "1,,2", "150%", "ten", "-1"])
def test_waves_when_malformed_say_what_a_wave_is(spec: str) -> None:
    with pytest.raises(ToolError, match="--waves"):
        parse_waves(spec)
