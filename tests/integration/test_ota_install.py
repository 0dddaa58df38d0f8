"""OTA installs against a real repository, real ONNX Runtime sessions and a real artifact
server on 127.0.0.1: the good path with its status events, every rejection leaving the disk
as it was, resumed downloads, golden checks, rollback, and recovery after a crash."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.artifacts import ArtifactServer, TricklingServer
from support.backends import options

from edged.inference.cache import ModelCache
from edged.model.repository import ModelRepository
from edged.ota.config import OtaConfig
from edged.ota.fetch import ChunkAssembler, Fetcher
from edged.ota.install import Event, Updater
from edged.ota.journal import PENDING
from edged.ota.manifest import (
    Manifest,
    Rejected,
    TrustStore,
    key_id_of,
    parse_manifest,
    sign_document,
)
from tools.assets import models as test_models

X = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)


class Rig:
    def __init__(self, root: Path, server: ArtifactServer, key: Ed25519PrivateKey,
                 **ota: Any) -> None:
        self.root, self.server, self.key = root, server, key
        test_models.write_repository(root / "models", names=["tiny_cls", "tiny_cnn"])
        self.repo = ModelRepository(root / "models")
        self.cache = ModelCache(self.repo, budget_bytes=1 << 30, options=options(root))
        self.events: list[Event] = []
        trust = TrustStore({key_id_of(key.public_key()): key.public_key()})
        self.updater = Updater(self.repo, self.cache, OtaConfig(**ota), trust, self.events.append,
                               fetcher=Fetcher(max_bytes=OtaConfig(**ota).max_artifact_mb << 20,
                                               backoff_initial_s=0.01, backoff_max_s=0.05))

    def publish(self, name: str, data: bytes) -> str:
        (self.server.root / name).write_bytes(data)
        return self.server.url(name)

    def manifest(self, data: bytes, *, version: int = 2, model: str = "tiny_cls",
                 fmt: str = "onnx", sign: bool = True, **extra: Any) -> Manifest:
        doc = {"model": model, "version": version, "format": fmt,
               "artifact": {"url": self.publish(f"{model}-{version}", data), "size": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()}, **extra}
        return parse_manifest(json.dumps(sign_document(doc, self.key) if sign else doc)
                              .encode())

    def apply(self, manifest: Manifest) -> None:
        assert self.updater.claim(manifest)
        try:
            self.updater.apply(manifest)
        finally:
            self.updater.release(manifest)

    def output(self) -> np.ndarray:
        with self.cache.acquire("tiny_cls") as lease:
            return lease.session.infer({"x": X})["prob"]

    def snapshot(self) -> dict[str, bytes]:
        """Every file under the repository (staging excluded) with its content."""
        models = self.root / "models"
        return {str(p.relative_to(models)): p.read_bytes() for p in sorted(models.rglob("*"))
                if p.is_file() and ".staging" not in p.parts}

    def states(self) -> list[str]:
        return [e.state for e in self.events]


@pytest.fixture
def rig(tmp_path: Path, artifacts: ArtifactServer) -> Iterator[Rig]:
    r = Rig(tmp_path, artifacts, Ed25519PrivateKey.generate())
    try:
        yield r
    finally:
        r.cache.close(timeout_s=5)


def v2_bytes() -> bytes:
    return test_models.make_tiny_cls(1).SerializeToString()


def expected(seed: int) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(test_models.make_tiny_cls(seed).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": X})[0]


def test_update_when_signed_and_good_goes_live_and_reports_each_step(rig: Rig) -> None:
    rig.cache.load("tiny_cls")
    np.testing.assert_allclose(rig.output(), expected(0), rtol=1e-5)
    rig.apply(rig.manifest(v2_bytes()))
    np.testing.assert_allclose(rig.output(), expected(1), rtol=1e-5)
    assert rig.repo.active_version("tiny_cls") == 2
    states = rig.states()
    assert states[0] == "received" and states[-1] == "active"
    assert [s for s in states if s != "downloading"] == ["received", "verifying", "installing",
                                                         "warming", "active"]
    assert any(e.state == "downloading" and e.progress == 100.0 for e in rig.events)
    assert not list(rig.repo.staging_dir().iterdir())
    assert not (rig.root / "models" / "tiny_cls" / PENDING).exists()
    assert not rig.updater.claim(rig.manifest(v2_bytes()))  # the same again: nothing to do


def test_update_when_repeated_past_keep_versions_prunes_the_oldest(rig: Rig) -> None:
    rig.updater.cfg = OtaConfig(keep_versions=2)
    for version in (2, 3, 4):
        data = test_models.make_tiny_cls(version).SerializeToString()
        rig.apply(rig.manifest(data, version=version))
    assert rig.repo.versions_on_disk("tiny_cls") == [3, 4]
    assert rig.cache.default_version("tiny_cls") == 4


def bundle(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def npz(**arrays: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.savez(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def test_update_when_a_bundle_passes_its_golden_check_goes_live(rig: Rig) -> None:
    data = bundle({"model.onnx": v2_bytes(), "golden/inputs.npz": npz(x=X),
                   "golden/outputs.npz": npz(prob=expected(1)),
                   "golden/tolerance.json": b'{"rtol": 1e-4, "atol": 1e-6}'})
    rig.apply(rig.manifest(data, fmt="bundle"))
    assert rig.cache.default_version("tiny_cls") == 2
    assert (rig.root / "models" / "tiny_cls" / "2" / "golden" / "outputs.npz").is_file()


def test_update_when_the_golden_check_fails_rolls_back_and_leaves_the_old_serving(
        rig: Rig) -> None:
    rig.cache.load("tiny_cls")
    before = rig.snapshot()
    data = bundle({"model.onnx": v2_bytes(), "golden/inputs.npz": npz(x=X),
                   "golden/outputs.npz": npz(prob=expected(0))})  # v1's answers: wrong for v2
    with pytest.raises(Rejected) as info:
        rig.apply(rig.manifest(data, fmt="bundle"))
    assert info.value.reason == "golden_failed"
    assert rig.states()[-2:] == ["failed", "rolled_back"]
    assert rig.events[-1].version == 1 and "version 1 serves again" in rig.events[-1].detail
    np.testing.assert_allclose(rig.output(), expected(0), rtol=1e-5)
    after = rig.snapshot()
    assert after.pop("tiny_cls/active") == b"1\n"  # the pointer was pinned to the old version
    assert after == before
    assert rig.cache.status()[-1].version == 1  # v2 is not loaded


@pytest.mark.parametrize("tolerance", [b'{"rtol": "loose", "atol": 1e-6}', b'{"rtol": null}',
                                       b'[1e-3, 1e-5]', b'{"rtol": 1e-3, "atol": "NaN"}'])
def test_update_when_the_golden_tolerance_is_not_numbers_rolls_back(
        rig: Rig, tolerance: bytes) -> None:
    """A bundle that cannot say how close is close enough fails its golden check: it must
    not go live (it used to end failed/internal with the new version serving)."""
    rig.cache.load("tiny_cls")
    before = rig.snapshot()
    data = bundle({"model.onnx": v2_bytes(), "golden/inputs.npz": npz(x=X),
                   "golden/outputs.npz": npz(prob=expected(1)),
                   "golden/tolerance.json": tolerance})
    with pytest.raises(Rejected) as info:
        rig.apply(rig.manifest(data, fmt="bundle"))
    assert info.value.reason == "golden_failed"
    assert rig.states()[-2:] == ["failed", "rolled_back"]
    np.testing.assert_allclose(rig.output(), expected(0), rtol=1e-5)
    after = rig.snapshot()
    assert after.pop("tiny_cls/active") == b"1\n"
    assert after == before


def test_update_when_an_unexpected_error_follows_the_install_rolls_back(rig: Rig) -> None:
    """Past the point where files changed, any error (a bug included) must undo the install."""
    def broken(step: str) -> None:
        if step == "switched":
            raise RuntimeError("a bug after the swap")

    rig.cache.load("tiny_cls")
    rig.updater.step_hook = broken
    with pytest.raises(Rejected) as info:
        rig.apply(rig.manifest(v2_bytes()))
    assert info.value.reason == "internal"
    assert rig.states()[-2:] == ["failed", "rolled_back"]
    np.testing.assert_allclose(rig.output(), expected(0), rtol=1e-5)
    assert rig.repo.versions_on_disk("tiny_cls") == [1]
    assert rig.repo.default_version("tiny_cls") == 1


def corrupt() -> bytes:
    return b"\x08\x07" + os.urandom(200)


@pytest.mark.parametrize(("case", "reason"), [
    ("unsigned", "unsigned"),
    ("bad_signature", "bad_signature"),
    ("unknown_key", "unknown_key"),
    ("sha256", "sha256_mismatch"),
    ("size", "size_mismatch"),
    ("oversize", "oversize"),
    ("downgrade", "downgrade"),
    ("same_version", "downgrade"),
    ("io", "io_mismatch"),
    ("io_manifest", "io_mismatch"),
    ("corrupt", "corrupt_model"),
    ("bundle_traversal", "bad_bundle"),
    ("bundle_link", "bad_bundle"),
    ("not_found", "download_failed"),
])
def test_update_when_rejected_changes_nothing(rig: Rig, case: str, reason: str) -> None:
    rig.cache.load("tiny_cls")
    before = rig.snapshot()
    good = v2_bytes()
    manifest: Manifest
    if case == "unsigned":
        manifest = rig.manifest(good, sign=False)
    elif case == "bad_signature":
        doc = dict(rig.manifest(good).raw)
        doc["force"] = True  # changed after signing
        manifest = parse_manifest(json.dumps(doc).encode())
    elif case == "unknown_key":
        doc = sign_document(dict(rig.manifest(good, sign=False).raw),
                            Ed25519PrivateKey.generate())
        manifest = parse_manifest(json.dumps(doc).encode())
    elif case in ("sha256", "size", "oversize"):
        doc = dict(rig.manifest(good, sign=False).raw)
        artifact = dict(doc["artifact"])
        if case == "sha256":
            artifact["sha256"] = hashlib.sha256(b"other").hexdigest()
        elif case == "size":
            artifact["size"] = len(good) - 1
        else:
            artifact["size"] = (rig.updater.fetcher.max_bytes + 1)
        doc["artifact"] = artifact
        manifest = parse_manifest(json.dumps(sign_document(doc, rig.key)).encode())
    elif case == "downgrade":
        rig.apply(rig.manifest(good))
        before = rig.snapshot()
        manifest = rig.manifest(test_models.make_tiny_cls(5).SerializeToString(), version=1)
    elif case == "same_version":
        manifest = rig.manifest(v2_bytes(), version=1)
    elif case == "io":
        manifest = rig.manifest(test_models.make_tiny_cnn(0).SerializeToString())
    elif case == "io_manifest":
        manifest = rig.manifest(good, io={"inputs": [{"name": "x", "dtype": "float32",
                                                      "shape": [3, 16, 16]}], "outputs": []})
    elif case == "corrupt":
        manifest = rig.manifest(corrupt())
    elif case == "bundle_traversal":
        manifest = rig.manifest(bundle({"model.onnx": good, "../evil": b"x"}), fmt="bundle")
    elif case == "bundle_link":
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            tar.addfile(tarfile.TarInfo("model.onnx"), io.BytesIO(b""))
            link = tarfile.TarInfo("model.yaml")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(link)
        manifest = rig.manifest(out.getvalue(), fmt="bundle")
    else:
        doc = dict(rig.manifest(good, sign=False).raw)
        doc["artifact"] = {**doc["artifact"], "url": rig.server.url("absent")}
        manifest = parse_manifest(json.dumps(sign_document(doc, rig.key)).encode())
    with pytest.raises(Rejected) as info:
        rig.apply(manifest)
    assert info.value.reason == reason, info.value
    assert rig.events[-1].state == "failed" and rig.events[-1].reason == reason
    assert rig.snapshot() == before
    assert not list(rig.repo.staging_dir().iterdir())
    assert rig.cache.default_version("tiny_cls") == (2 if case == "downgrade" else 1)


def test_update_when_forced_may_downgrade(rig: Rig) -> None:
    rig.apply(rig.manifest(v2_bytes(), version=3))
    rig.apply(rig.manifest(test_models.make_tiny_cls(4).SerializeToString(), version=2,
                           force=True))
    assert rig.cache.default_version("tiny_cls") == 2


def test_update_when_one_is_in_progress_refuses_a_second_for_the_model(rig: Rig) -> None:
    first = rig.manifest(v2_bytes())
    assert rig.updater.claim(first)
    with pytest.raises(Rejected, match="busy"):
        rig.updater.claim(rig.manifest(v2_bytes(), version=3))
    rig.updater.release(first)
    assert rig.updater.claim(rig.manifest(v2_bytes(), version=3))


def test_update_when_the_download_is_cut_midway_resumes_with_range(rig: Rig) -> None:
    data = v2_bytes()
    rig.server.cut_after = len(data) // 2
    rig.apply(rig.manifest(data))
    assert rig.server.ranges == [None, f"bytes={len(data) // 2}-"]
    assert rig.cache.default_version("tiny_cls") == 2


@pytest.mark.timeout(60)
def test_update_when_the_server_trickles_gives_up_at_the_download_deadline(rig: Rig) -> None:
    """One byte at a time never trips the socket timeout; the overall deadline frees the
    single OTA worker (before, this download held it until the last byte, hours later)."""
    rig.cache.load("tiny_cls")
    before = rig.snapshot()
    rig.updater.cfg = OtaConfig(download_timeout_s=1.0)
    data = v2_bytes()
    server = TricklingServer(len(data))
    try:
        doc = {"model": "tiny_cls", "version": 2, "format": "onnx",
               "artifact": {"url": server.url, "size": len(data),
                            "sha256": hashlib.sha256(data).hexdigest()}}
        manifest = parse_manifest(json.dumps(sign_document(doc, rig.key)).encode())
        with pytest.raises(Rejected) as info:
            rig.apply(manifest)
    finally:
        server.close()
    assert info.value.reason == "download_timeout"
    assert server.requests >= 1
    assert rig.snapshot() == before
    assert not list(rig.repo.staging_dir().iterdir())
    assert rig.cache.default_version("tiny_cls") == 1


def test_update_when_chunks_arrive_out_of_order_assembles_them(rig: Rig) -> None:
    data = v2_bytes()
    doc = {"model": "tiny_cls", "version": 2, "format": "onnx",
           "artifact": {"chunks": 3, "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()}}
    manifest = parse_manifest(json.dumps(sign_document(doc, rig.key)).encode())
    third = len(data) // 3 + 1
    pieces = [data[i:i + third] for i in range(0, len(data), third)]
    assembler = ChunkAssembler(manifest.artifact, timeout_s=5)
    for index in (2, 0, 0, 1):
        assembler.add(index, pieces[index])
    assert rig.updater.claim(manifest)
    rig.updater.apply(manifest, assembler)
    assert rig.cache.default_version("tiny_cls") == 2


def test_update_when_chunks_stop_coming_fails_after_the_timeout(rig: Rig) -> None:
    data = v2_bytes()
    doc = {"model": "tiny_cls", "version": 2, "format": "onnx",
           "artifact": {"chunks": 2, "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()}}
    manifest = parse_manifest(json.dumps(sign_document(doc, rig.key)).encode())
    assembler = ChunkAssembler(manifest.artifact, timeout_s=0.3)
    assembler.add(0, data[:10])
    with pytest.raises(Rejected, match=r"1 of 2 chunks did not arrive"):
        rig.updater.apply(manifest, assembler)


def test_rollback_when_asked_serves_the_previous_version_again(rig: Rig) -> None:
    rig.apply(rig.manifest(v2_bytes()))
    assert rig.updater.rollback("tiny_cls") == 1
    np.testing.assert_allclose(rig.output(), expected(0), rtol=1e-5)
    assert rig.repo.versions_on_disk("tiny_cls") == [1]
    assert rig.events[-1].state == "rolled_back"
    with pytest.raises(Rejected, match="no_previous"):
        rig.updater.rollback("tiny_cls")


def test_recover_when_an_install_was_interrupted_removes_it_and_the_staging_leftovers(
        rig: Rig) -> None:
    rig.repo.set_active("tiny_cls", 1)
    rig.repo.install("tiny_cls", 2, {"model.onnx": v2_bytes()})  # as if killed after adopt
    (rig.root / "models" / "tiny_cls" / PENDING).write_text("2\n")
    leftover = rig.repo.staging_dir() / "ota-tiny_cls-2-dead"
    leftover.mkdir()
    (leftover / "artifact").write_bytes(b"half")
    done = rig.updater.recover()
    assert done == ["tiny_cls: removed version 2, whose install was interrupted"]
    assert rig.repo.versions_on_disk("tiny_cls") == [1]
    assert not leftover.exists() and not (rig.root / "models" / "tiny_cls" / PENDING).exists()


def test_recover_when_the_pointer_had_already_moved_keeps_the_new_version(rig: Rig) -> None:
    rig.repo.install("tiny_cls", 2, {"model.onnx": v2_bytes()})
    rig.repo.set_active("tiny_cls", 2)  # killed after the pointer moved, before the journal went
    (rig.root / "models" / "tiny_cls" / PENDING).write_text("2\n")
    assert rig.updater.recover() == []
    assert rig.repo.versions_on_disk("tiny_cls") == [1, 2]
    assert rig.repo.default_version("tiny_cls") == 2


def test_claim_when_an_artifact_was_cut_by_restarts_twice_refuses_it(rig: Rig) -> None:
    """A model that kills the runtime as it loads must not crash-loop a device that keeps
    receiving its retained manifest."""
    manifest = rig.manifest(v2_bytes())
    for attempt in (1, 2):
        assert rig.updater.claim(manifest)  # tried again after the first cut
        rig.updater.release(manifest)
        rig.repo.install("tiny_cls", 2, {"model.onnx": v2_bytes()})  # killed while warming
        (rig.root / "models" / "tiny_cls" / PENDING).write_text(
            f"2 {manifest.artifact.sha256}\n")
        assert rig.updater.recover()[0].endswith("not tried again)") == (attempt == 2)
    with pytest.raises(Rejected) as info:
        rig.updater.claim(manifest)
    assert info.value.reason == "crash_loop"
    assert rig.updater.claim(rig.manifest(test_models.make_tiny_cls(7)
                                          .SerializeToString(), version=3))  # another: tried
