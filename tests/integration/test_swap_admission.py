"""A request is checked against the version the daemon serves now, never against the one its
batcher last ran (issue 49, item 1): after an OTA install that changes the model's inputs, or
an unload and load of a version whose file changed, the first request of the new shape is
answered, a request of the old shape is refused 400 naming the new one, and a header planned
for the old version is checked afresh."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from support.daemon import Served, ServeFactory
from support.ota import fresh
from support.polling import wait_until

from edged.ops.client import ApiError, EdgedClient
from edged.ota.manifest import sign_document
from tools.assets.models import make_scale, write_model


def scale_bytes(n: int) -> bytes:
    return make_scale(n).SerializeToString()


@pytest.fixture
def scale_repo(tmp_path: Path) -> Path:
    root = tmp_path / "scale-models"
    write_model(make_scale(4), root / "scale" / "1" / "model.onnx")
    return root


@pytest.fixture
def device(make_served: ServeFactory, scale_repo: Path,
           key: tuple[Ed25519PrivateKey, Path]) -> Served:
    return make_served(models_dir=scale_repo, cache="preload: [scale]",
                       ota=f"trusted_keys: [{key[1]}]")


def infer(client: EdgedClient, x: np.ndarray) -> np.ndarray:
    return client.infer("scale", {"x": x}).outputs["y"]


def refused(client: EdgedClient, x: np.ndarray) -> str:
    with pytest.raises(ApiError) as caught:
        client.infer("scale", {"x": x})
    assert caught.value.status == 400, caught.value
    return str(caught.value)


def install(client: EdgedClient, private: Ed25519PrivateKey, version: int, data: bytes,
            **extra: Any) -> dict[str, Any]:
    doc = sign_document({"model": "scale", "version": version, "format": "onnx",
                         "artifact": {"size": len(data),
                                      "sha256": hashlib.sha256(data).hexdigest()},
                         **fresh("local"), **extra}, private)
    head = json.dumps(doc).encode()
    status, _, raw = client.request("POST", "/v2/edged/ota/install", head + data,
                                    {"Content-Type": "application/octet-stream",
                                     "Edged-Manifest-Length": str(len(head))})
    assert status == 202, raw
    install_id = json.loads(raw)["id"]

    def final() -> dict[str, Any] | None:
        _, _, body = client.request("GET", f"/v2/edged/ota/installs/{install_id}")
        row = json.loads(body)
        return row if row["state"] in ("active", "failed", "rolled_back") else None

    return wait_until(final, timeout=60, what=f"install {install_id} to finish")


def input_shape(client: EdgedClient) -> list[int]:
    return client.model_metadata("scale")["inputs"][0]["shape"]


def test_admission_when_an_install_changes_the_inputs_checks_against_the_new_version(
        device: Served, key: tuple[Ed25519PrivateKey, Path]) -> None:
    four = np.arange(4, dtype=np.float32).reshape(1, 4)
    eight = np.arange(8, dtype=np.float32).reshape(1, 8)
    with device.client() as client:
        for _ in range(3):  # run, and its header planned
            np.testing.assert_array_equal(infer(client, four), 2 * four)
        done = install(client, key[0], 2, scale_bytes(8), allow_io_change=True)
        assert done["state"] == "active", done
        assert input_shape(client) == [-1, 8]
        # The first request of the new shape is answered, with nothing of the old shape run
        # in between to move the batcher on.
        np.testing.assert_array_equal(infer(client, eight), 2 * eight)
        message = refused(client, four)
        assert "[-1, 8]" in message, message
        np.testing.assert_array_equal(infer(client, eight), 2 * eight)


def test_admission_when_a_version_is_reloaded_from_a_changed_file_checks_the_new_file(
        device: Served, scale_repo: Path) -> None:
    four = np.ones((1, 4), np.float32)
    eight = np.ones((2, 8), np.float32)
    with device.client() as client:
        np.testing.assert_array_equal(infer(client, four), 2 * four)
        client.unload("scale")
        write_model(make_scale(8), scale_repo / "scale" / "1" / "model.onnx")
        client.load("scale")
        assert input_shape(client) == [-1, 8]
        np.testing.assert_array_equal(infer(client, eight), 2 * eight)
        assert "[-1, 8]" in refused(client, four)


@pytest.mark.parametrize("shortcuts", ["", "shortcuts: []"])
def test_admission_when_a_swapped_in_version_is_unloaded_before_any_request_checks_against_it(
        make_served: ServeFactory, scale_repo: Path, key: tuple[Ed25519PrivateKey, Path],
        shortcuts: str) -> None:
    """The 30-minute differential run's find: install a version of another shape, unload it
    before any request comes, and the next request, which loads it, was checked against the
    version swapped out (400 "expected [-1, 4]"), with the shortcuts on or off."""
    device = make_served(models_dir=scale_repo, cache="preload: [scale]", api=shortcuts,
                         ota=f"trusted_keys: [{key[1]}]")
    four = np.ones((1, 4), np.float32)
    eight = np.ones((1, 8), np.float32)
    with device.client() as client:
        np.testing.assert_array_equal(infer(client, four), 2 * four)
        done = install(client, key[0], 2, scale_bytes(8), allow_io_change=True)
        assert done["state"] == "active", done
        client.unload("scale")
        np.testing.assert_array_equal(infer(client, eight), 2 * eight)
        assert "[-1, 8]" in refused(client, four)
