"""An OTA update of a language model while clients generate: a signed manifest of format
`gguf` and the SmolLM2 file handed to the daemon on its socket (the path the Mender module
takes), installed, warmed and swapped with no request failing; answers come from version 1,
then version 2. A GGUF cut short is refused before the repository changes (its header) or
undone at its load (its tensors), and version 1 serves on."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat
from support.daemon import Served, ServeFactory
from support.ota import fresh
from support.polling import wait_until

from edged.cli import main
from edged.ops.client import EdgedClient
from edged.ota.manifest import sign_document
from tools.real_models import LANGUAGE_MODEL


@pytest.fixture
def device(make_served: ServeFactory, key: tuple[Ed25519PrivateKey, Path], real_models: Path,
           tmp_path: Path) -> Served:
    models = tmp_path / "models"
    (models / "smol" / "1").mkdir(parents=True)
    (models / "smol" / "1" / "model.gguf").symlink_to(real_models / LANGUAGE_MODEL)
    (models / "smol" / "model.yaml").write_text("llm: {context: 256, threads: 1, "
                                                "max_tokens: 4}\n")
    return make_served(models_dir=models, cache="preload: [smol]",
                       ota=f"trusted_keys: [{key[1]}], max_artifact_mb: 200")


def install(client: EdgedClient, private: Ed25519PrivateKey, version: int, data: bytes
            ) -> dict[str, Any]:
    doc = {"model": "smol", "version": version, "format": "gguf",
           "artifact": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()},
           **fresh("local")}
    head = json.dumps(sign_document(doc, private)).encode()
    status, _, raw = client.request("POST", "/v2/edged/ota/install", head + data, {
        "Content-Type": "application/octet-stream", "Edged-Manifest-Length": str(len(head))})
    assert status == 202, raw
    install_id = json.loads(raw)["id"]

    def final() -> dict[str, Any] | None:
        _, _, body = client.request("GET", f"/v2/edged/ota/installs/{install_id}")
        row: dict[str, Any] = json.loads(body)
        return row if row["state"] in ("active", "failed", "rolled_back") else None

    return wait_until(final, timeout=120, what=f"install {install_id} to finish")


def generate(client: EdgedClient) -> tuple[int, dict[str, Any]]:
    status, _, raw = client.request("POST", "/v2/models/smol/generate", json.dumps(
        {"text_input": "1 2 3", "max_tokens": 2, "temperature": 0}).encode())
    return status, json.loads(raw)


def test_ota_when_gguf_installed_under_load_swaps_with_no_failed_request(
        device: Served, key: tuple[Ed25519PrivateKey, Path], real_models: Path) -> None:
    stop = threading.Event()
    answers: list[tuple[int, str]] = []

    def load() -> None:
        with device.client() as client:
            while not stop.is_set():
                status, body = generate(client)
                answers.append((status, body.get("model_version") or str(body)))

    worker = threading.Thread(target=load, daemon=True)
    worker.start()
    try:
        wait_until(lambda: len(answers) >= 3, what="answers from version 1")
        with device.client() as client:
            row = install(client, key[0], 2, (real_models / LANGUAGE_MODEL).read_bytes())
        assert row["state"] == "active", row
        mark = len(answers)
        wait_until(lambda: len(answers) >= mark + 3, what="answers after the swap")
    finally:
        stop.set()
        worker.join(30)
    assert [a for a in answers if a[0] != 200] == []
    versions = [v for _, v in answers]
    assert versions[0] == "1" and versions[-1] == "2"
    assert versions == sorted(versions)  # never back to 1 once 2 answered


def test_ota_when_gguf_is_cut_short_keeps_version_1(
        device: Served, key: tuple[Ed25519PrivateKey, Path], real_models: Path) -> None:
    data = (real_models / LANGUAGE_MODEL).read_bytes()
    with device.client() as client:
        header_cut = install(client, key[0], 2, data[:2048])
        assert header_cut["state"] == "failed" and header_cut["reason"] == "corrupt_model"
        tensors_cut = install(client, key[0], 3, data[:len(data) // 2])
        assert tensors_cut["state"] in ("failed", "rolled_back"), tensors_cut
        assert tensors_cut["reason"] == "warmup_failed", tensors_cut
        status, body = generate(client)
    assert status == 200 and body["model_version"] == "1"


def test_daemon_when_stopped_mid_answer_ends_the_stream_and_stops(
        device: Served) -> None:
    import socket

    body = json.dumps({"text_input": "1 2 3 4 5 6 7 8 9 10", "max_tokens": 240,
                       "temperature": 0}).encode()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(30)
        sock.connect(str(device.socket))
        sock.sendall(b"POST /v2/models/smol/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        seen = b""
        while b"data: " not in seen:
            seen += sock.recv(4096)
        device.daemon.request_stop()
        assert device.daemon.stopped_event.wait(30), "the daemon did not stop in 30 s"
        while chunk := sock.recv(65536):  # the answer ends: the connection closes
            seen += chunk
    assert seen.count(b"data: ") >= 1


def test_ota_mender_when_artifact_is_a_gguf_writes_a_gguf_payload(
        key: tuple[Ed25519PrivateKey, Path], real_models: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    private_file = tmp_path / "fleet"
    private_file.write_bytes(key[0].private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                                                  NoEncryption()))
    out = tmp_path / "smol-v2.mender"
    assert main(["ota", "mender-artifact", "smol", "2", "--artifact",
                 str(real_models / LANGUAGE_MODEL), "--key", str(private_file), "-t", "jetson",
                 "--payload-only", "-o", str(out)]) == 0
    payload = out.with_name(out.name + ".payload")
    manifest = json.loads((payload / "manifest.json").read_text())
    assert manifest["format"] == "gguf" and "signature" in manifest
    assert (payload / "model.gguf").stat().st_size == manifest["artifact"]["size"]
    assert "--file " + str(payload / "model.gguf") in capsys.readouterr().out
