"""Fleets that roll out with Mender: the real Debian `mender` (standalone mode) installs
`edged-model` artifacts made by `edged ota mender-artifact` (the real `mender-artifact`), and
the update module (deploy/mender/edged-model) hands them to the running daemon's verified
installer over its socket. Install -> commit serves the new version with no failed request;
an artifact Mender or edged refuses leaves the daemon as it was; install -> rollback serves the
previous version again; an install over an uncommitted one is refused."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from support.daemon import Served, ServeFactory
from support.mender import DEVICE_TYPE, Mender, mender_keys
from support.ota import X, expected, tiny_cls_bytes
from support.polling import wait_until

from edged.cli import main as edged
from tools.assets import models as test_models

pytestmark = pytest.mark.slow


@pytest.fixture
def keys(tmp_path: Path, key: tuple[Ed25519PrivateKey, Path]) -> dict[str, Path]:
    """The fleet's Ed25519 key as a PEM file (`edged ota keygen` writes the same), its public
    half (the daemon trusts it), and a Mender signing key pair."""
    private, public = key
    fleet = tmp_path / "fleet.key"
    fleet.write_bytes(private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    mender_private, mender_public = mender_keys(tmp_path)
    return {"fleet": fleet, "fleet_pub": public, "mender": mender_private,
            "mender_pub": mender_public}


@pytest.fixture
def device(make_served: ServeFactory, make_mender: Callable[..., Mender],
           keys: dict[str, Path]) -> tuple[Served, Mender]:
    served = make_served(ota=f"trusted_keys: [{keys['fleet_pub']}]")
    return served, make_mender(served.socket, keys["mender_pub"])


def build(tmp_path: Path, keys: dict[str, Path], version: int, data: bytes, *,
          name: str | None = None, fleet_key: bool = True, mender_key: Path | str | None = "",
          model: str = "tiny_cls") -> Path:
    """An artifact made by `edged ota mender-artifact`, as an operator makes one."""
    source = tmp_path / f"{model}-{version}-{len(data)}.onnx"
    source.write_bytes(data)
    out = tmp_path / f"{name or f'{model}-v{version}'}.mender"
    args = ["ota", "mender-artifact", model, str(version), "--artifact", str(source),
            "-t", DEVICE_TYPE, "-o", str(out)]
    if name:
        args += ["--name", name]
    if fleet_key:
        args += ["--key", str(keys["fleet"])]
    signer = keys["mender"] if mender_key == "" else mender_key
    if signer is not None:
        args += ["--mender-key", str(signer)]
    assert edged(args) == 0
    return out


class Callers:
    """Clients calling tiny_cls over the socket without pause; every failure is kept."""

    def __init__(self, served: Served, count: int = 2) -> None:
        self.served = served
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        # Per client: the versions that answered, in the order its calls returned.
        self.versions: list[list[int]] = [[] for _ in range(count)]
        self.threads = [threading.Thread(target=self._call, args=(i,)) for i in range(count)]

    @property
    def answers(self) -> list[int]:
        return [v for versions in self.versions for v in versions]

    def _call(self, i: int) -> None:
        with self.served.client() as client:
            while not self.stop.is_set():
                try:
                    response = client.infer("tiny_cls", {"x": X})
                except Exception as exc:  # every failure is the test's failure, counted
                    self.errors.append(exc)
                    continue
                self.versions[i].append(int(response.version))

    def __enter__(self) -> Callers:
        for thread in self.threads:
            thread.start()
        self.wait_more(5)
        return self

    def wait_more(self, more: int) -> None:
        count = len(self.answers)
        wait_until(lambda: len(self.answers) >= count + more, timeout=30,
                   what=f"{more} more answers", alive=lambda: not self.errors,
                   details=lambda: repr(self.errors[:3]))

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def serving(served: Served) -> tuple[int, np.ndarray]:
    with served.client() as client:
        response = client.infer("tiny_cls", {"x": X})
    return int(response.version), response.outputs["prob"]


def installs(served: Served) -> list[dict[str, Any]]:
    with served.client() as client:
        status, _, raw = client.request("GET", "/v2/edged/ota/installs")
    assert status == 200, raw
    rows: list[dict[str, Any]] = json.loads(raw)["installs"]
    return rows


def on_disk(served: Served) -> dict[str, list[str]]:
    """Each model's folder listing (versions, active pointer), edged's own records aside."""
    root = served.daemon.repository.root
    return {p.name: sorted(c.name for c in p.iterdir() if not c.name.startswith(".ota"))
            for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")}


def test_mender_install_when_signed_then_commit_serves_the_new_version_and_fails_no_request(
        device: tuple[Served, Mender], keys: dict[str, Path], tmp_path: Path) -> None:
    served, mender = device
    artifact = build(tmp_path, keys, 2, tiny_cls_bytes(1))
    with Callers(served) as callers:
        done = mender.install(artifact)
        assert done.returncode == 0, done.stderr
        assert "Use 'commit' to update" in done.stdout
        callers.wait_more(5)
        (held,) = installs(served)
        assert (held["state"], held["version"], held["previous"], held["committed"],
                held["tag"]) == ("active", 2, 1, False, "tiny_cls-v2")
        assert mender.artifact_name() == mender.base_name  # Mender has not committed it either
        done = mender.commit()
        assert done.returncode == 0, done.stderr
        callers.wait_more(5)
    assert callers.errors == []
    for versions in callers.versions:  # each client: switched once, never back
        assert versions[0] == 1 and versions[-1] == 2
        assert versions == sorted(versions)
    version, prob = serving(served)
    assert version == 2
    np.testing.assert_allclose(prob, expected(1), rtol=1e-5)
    assert installs(served)[0]["committed"] is True
    assert mender.artifact_name() == "tiny_cls-v2"
    assert mender.provides()["edged-model.tiny_cls.version"] == "2"


def test_mender_install_then_rollback_serves_the_previous_version_again(
        device: tuple[Served, Mender], keys: dict[str, Path], tmp_path: Path) -> None:
    served, mender = device
    before = on_disk(served)
    assert mender.install(build(tmp_path, keys, 2, tiny_cls_bytes(1))).returncode == 0
    assert serving(served)[0] == 2
    with Callers(served) as callers:
        done = mender.rollback()
        assert done.returncode == 0, done.stderr
        callers.wait_more(5)
    assert callers.errors == []
    version, prob = serving(served)
    assert version == 1
    np.testing.assert_allclose(prob, expected(0), rtol=1e-5)
    assert on_disk(served) == {**before, "tiny_cls": sorted([*before["tiny_cls"], "active"])}
    assert installs(served)[0]["state"] == "rolled_back"
    assert mender.artifact_name() == mender.base_name
    assert mender.commit().returncode != 0  # nothing left to commit


def test_mender_install_then_rollback_of_a_new_model_removes_it(
        device: tuple[Served, Mender], keys: dict[str, Path], tmp_path: Path) -> None:
    served, mender = device
    before = on_disk(served)
    artifact = build(tmp_path, keys, 1, test_models.make_tiny_cls(3).SerializeToString(),
                     model="fresh_cls")
    assert mender.install(artifact).returncode == 0
    with served.client() as client:
        assert int(client.infer("fresh_cls", {"x": X}).version) == 1
    assert mender.rollback().returncode == 0
    assert on_disk(served) == before


CORRUPTIONS = ["mender-unsigned", "mender-wrong-key", "tampered", "edged-unsigned",
               "corrupt-model", "wrong-device-type"]


@pytest.mark.parametrize("case", CORRUPTIONS)
def test_mender_install_when_the_artifact_is_refused_leaves_the_daemon_untouched(
        device: tuple[Served, Mender], keys: dict[str, Path], tmp_path: Path,
        case: str) -> None:
    served, mender = device
    good = tiny_cls_bytes(1)
    if case == "mender-unsigned":
        artifact = build(tmp_path, keys, 2, good, mender_key=None)
    elif case == "mender-wrong-key":
        (tmp_path / "other").mkdir()
        artifact = build(tmp_path, keys, 2, good, mender_key=mender_keys(tmp_path / "other")[0])
    elif case == "tampered":
        artifact = build(tmp_path, keys, 2, good)
        data = bytearray(artifact.read_bytes())
        data[len(data) // 2] ^= 0xFF  # inside the payload's compressed data
        artifact.write_bytes(bytes(data))
    elif case == "edged-unsigned":  # Mender trusts it; edged's own keys do not
        artifact = build(tmp_path, keys, 2, good, fleet_key=False)
    elif case == "corrupt-model":
        artifact = build(tmp_path, keys, 2, b"\x08\x07not an onnx model" * 50)
    else:
        artifact = build(tmp_path, keys, 2, good)
        (mender.data / "device_type").write_text("device_type=another-board\n")
    before = on_disk(served)
    with Callers(served) as callers:
        done = mender.install(artifact)
        callers.wait_more(5)
    assert done.returncode != 0, done.stdout
    assert callers.errors == []
    assert set(callers.answers) == {1}
    assert on_disk(served) == before
    version, prob = serving(served)
    assert version == 1
    np.testing.assert_allclose(prob, expected(0), rtol=1e-5)
    reached = installs(served)
    if case == "corrupt-model":  # edged took it, staged it, and found it is no model
        (refused,) = reached
        assert (refused["state"], refused["reason"]) == ("failed", "corrupt_model")
        assert "did not install it" in done.stderr
    elif case == "edged-unsigned":  # edged refused it at once: nothing was started
        assert reached == []
        assert "edged refused the install (unsigned)" in done.stderr
    else:  # Mender refused it before the module ran
        assert reached == []
        assert "edged-model:" not in done.stderr
    assert mender.artifact_name() == mender.base_name


def test_mender_install_when_one_is_uncommitted_refuses_the_next_and_keeps_the_first(
        device: tuple[Served, Mender], keys: dict[str, Path], tmp_path: Path) -> None:
    served, mender = device
    assert mender.install(build(tmp_path, keys, 2, tiny_cls_bytes(1))).returncode == 0
    done = mender.install(build(tmp_path, keys, 3, tiny_cls_bytes(2)))
    assert done.returncode != 0
    assert "Download_Enter" in done.stderr  # the guard stopped it before anything was read
    assert [(i["version"], i["state"], i["committed"]) for i in installs(served)] == \
        [(2, "active", False)]
    assert serving(served)[0] == 2
    done = mender.commit()  # the first is still Mender's to commit
    assert done.returncode == 0, done.stderr
    assert mender.artifact_name() == "tiny_cls-v2"
    assert installs(served)[0]["committed"] is True
