"""The model repository: discovery, version policy, ONNX reconciliation, bad files, installs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.models import write_yaml

from edged.core.errors import InvalidModel, ModelNotFound
from edged.model.repository import ModelRepository
from tools.assets import models as test_models


def test_repository_when_listing_skips_hidden_staging_and_bad_names(repo_dir: Path) -> None:
    (repo_dir / ".hidden").mkdir()
    (repo_dir / ".staging").mkdir()
    (repo_dir / "bad name").mkdir()
    assert ModelRepository(repo_dir).names() == ["colors", "tiny_cls", "tiny_cnn",
                                                 "tiny_nobatch", "tiny_two_input"]


@pytest.mark.parametrize("name", ["../etc", "a/b", ".hidden", "..", "", "x" * 65])
def test_repository_when_name_is_unsafe_raises_not_found(repo: ModelRepository, name: str) -> None:
    with pytest.raises(ModelNotFound, match="invalid model name"):
        repo.resolve(name)


def test_repository_when_no_model_yaml_infers_everything_from_onnx(repo_dir: Path) -> None:
    (repo_dir / "tiny_cls" / "model.yaml").unlink()
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    assert model.max_batch_size == 8  # dynamic first dims: batched, Triton-style default
    assert [(s.name, s.dtype.name, s.shape) for s in model.inputs] == \
        [("x", "float32", (-1, 3, 8, 8))]
    assert [(s.name, s.shape) for s in model.outputs] == [("prob", (-1, 4))]


def test_repository_when_no_model_yaml_and_fixed_dims_infers_no_batch(repo_dir: Path) -> None:
    (repo_dir / "tiny_nobatch" / "model.yaml").unlink()
    model = ModelRepository(repo_dir).resolve("tiny_nobatch")
    assert model.max_batch_size == 0
    assert model.inputs[0].shape == (4,)


def test_repository_when_yaml_narrows_dynamic_dims_keeps_declared_sizes(repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cnn", "inputs: [{name: image, shape: [3, 32, -1]}]\n")
    model = ModelRepository(repo_dir).resolve("tiny_cnn")
    assert model.inputs[0].shape == (-1, 3, 32, -1)


def test_repository_when_yaml_dtype_disagrees_names_both_files_and_line(repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 4\ninputs:\n  - name: x\n"
                                     "    dtype: float16\n")
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(repo_dir).resolve("tiny_cls")
    message = str(caught.value)
    assert f"{repo_dir / 'tiny_cls' / 'model.yaml'}: inputs[0].dtype: float16 disagrees" in message
    assert "model.onnx (float32) (line 4)" in message


def test_repository_when_yaml_shape_or_name_disagrees_reports_each(repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_two_input", "inputs:\n  - {name: a, shape: [5]}\n"
                                           "  - {name: c}\n")
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(repo_dir).resolve("tiny_two_input")
    message = str(caught.value)
    assert "inputs[0].shape: [5] disagrees with model.onnx ([4], batch dim excluded) (line 2)" \
        in message
    assert "inputs[1].name: 'c' is not one of the inputs of model.onnx (a, b) (line 3)" in message


def test_repository_when_batching_declared_on_fixed_batch_dim_is_rejected(
        repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_nobatch", "max_batch_size: 4\n")
    with pytest.raises(InvalidModel, match=r"max_batch_size: is 4, but v in model.onnx has no "
                                           r"dynamic first dim"):
        ModelRepository(repo_dir).resolve("tiny_nobatch")


def test_repository_when_model_yaml_invalid_names_file_and_line(repo_dir: Path) -> None:
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 4\ninstances: many\n")
    with pytest.raises(InvalidModel, match=r"model.yaml: instances: expected an integer or "
                                           r"one of 'auto', got 'many' \(line 2\)"):
        ModelRepository(repo_dir).resolve("tiny_cls")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_repository_when_onnx_file_is_damaged_names_it_and_others_still_load(
        repo_dir: Path, damage: str) -> None:
    path = repo_dir / "tiny_cnn" / "1" / "model.onnx"
    data = path.read_bytes()
    path.write_bytes({"garbage": b"\x08\x07garbage" * 40, "truncated": data[: len(data) // 2],
                      "empty": b""}[damage])
    repo = ModelRepository(repo_dir)
    with pytest.raises(InvalidModel, match=rf"{path}: not a valid ONNX model"):
        repo.resolve("tiny_cnn")
    assert repo.resolve("tiny_cls").max_batch_size == 16


def test_repository_when_file_changes_rereads_it(repo_dir: Path) -> None:
    repo = ModelRepository(repo_dir)
    assert repo.resolve("tiny_cls").max_batch_size == 16
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 2\n")
    assert repo.resolve("tiny_cls").max_batch_size == 2


def test_repository_version_policy_when_latest_specific_or_all(tmp_path: Path) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=3, names=["tiny_cls"])
    repo = ModelRepository(root)
    assert repo.served_versions("tiny_cls") == [3]
    write_yaml(root, "tiny_cls", "version_policy: {latest: 2}\n")
    assert repo.served_versions("tiny_cls") == [2, 3]
    write_yaml(root, "tiny_cls", "version_policy: {specific: [1, 3]}\n")
    assert repo.served_versions("tiny_cls") == [1, 3]
    write_yaml(root, "tiny_cls", "version_policy: {all: true}\n")
    assert repo.served_versions("tiny_cls") == [1, 2, 3]
    assert repo.default_version("tiny_cls") == 3
    with pytest.raises(ModelNotFound, match="no served version 7"):
        repo.resolve("tiny_cls", 7)


def test_repository_when_active_pointer_set_it_is_the_default_and_served(tmp_path: Path) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    repo = ModelRepository(root)
    repo.set_active("tiny_cls", 1)
    assert (root / "tiny_cls" / "active").read_text() == "1\n"
    assert repo.default_version("tiny_cls") == 1
    assert repo.served_versions("tiny_cls") == [1, 2]
    with pytest.raises(ModelNotFound):
        repo.set_active("tiny_cls", 9)


def test_repository_install_when_valid_appears_whole(repo: ModelRepository,
                                                     tmp_path: Path) -> None:
    source = test_models.write_model(test_models.make_tiny_cls(seed=5),
                                          tmp_path / "new.onnx")
    model = repo.install("tiny_cls", 2, {"model.onnx": source, "labels.txt": b"a\nb\nc\nd\n"})
    assert model.version == 2 and (model.dir / "labels.txt").read_bytes() == b"a\nb\nc\nd\n"
    assert repo.served_versions("tiny_cls") == [2]
    assert list((repo.root / ".staging").iterdir()) == []


def test_repository_install_when_onnx_corrupt_leaves_nothing(repo: ModelRepository) -> None:
    with pytest.raises(InvalidModel, match="not a valid ONNX model"):
        repo.install("tiny_cls", 2, {"model.onnx": b"\x00corrupt"})
    assert not (repo.root / "tiny_cls" / "2").exists()
    assert list((repo.root / ".staging").iterdir()) == []


@pytest.mark.parametrize(("name", "version", "files", "error"), [
    ("../x", 2, {"model.onnx": b""}, ModelNotFound),
    ("tiny_cls", 1, {"model.onnx": b""}, InvalidModel),  # versions are immutable
    ("tiny_cls", 0, {"model.onnx": b""}, InvalidModel),
    ("tiny_cls", 2, {"../model.onnx": b""}, InvalidModel),
    ("tiny_cls", 2, {"labels.txt": b""}, InvalidModel),
])
def test_repository_install_when_request_unsafe_is_refused(
        repo: ModelRepository, name: str, version: int, files: dict[str, bytes],
        error: type[Exception]) -> None:
    with pytest.raises(error):
        repo.install(name, version, files)
    assert repo.versions_on_disk("tiny_cls") == [1]


def test_repository_clean_staging_when_leftovers_removes_them(repo: ModelRepository) -> None:
    (repo.staging_dir() / "tiny_cls-2-dead").mkdir()
    (repo.staging_dir() / "half.onnx").write_bytes(b"x")
    assert repo.clean_staging() == 2
    assert list(repo.staging_dir().iterdir()) == []


def test_repository_remove_version_when_present_deletes_it(tmp_path: Path) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    repo = ModelRepository(root)
    repo.remove_version("tiny_cls", 1)
    assert repo.versions_on_disk("tiny_cls") == [2]


def test_repository_when_versions_differ_reads_each_own_file(tmp_path: Path) -> None:
    root = test_models.write_repository(tmp_path / "m", versions=2, names=["tiny_cls"])
    repo = ModelRepository(root)
    assert repo.get("tiny_cls", 1).onnx_path != repo.get("tiny_cls", 2).onnx_path
    assert repo.get("tiny_cls", 1).sha256() != repo.get("tiny_cls", 2).sha256()
    assert np.dtype("float32") == repo.get("tiny_cls", 1).inputs[0].dtype


def test_repository_when_a_folder_or_the_pointer_is_not_ascii_digits_ignores_it(
        repo: ModelRepository, repo_dir: Path) -> None:
    """A "²" passed str.isdigit() and failed int(): listing the versions raised ValueError, and
    every request for the model was an internal error; "٣" was taken as version 3."""
    model = (repo_dir / "tiny_cls" / "1" / "model.onnx").read_bytes()
    for stray in ("\u00b2", "\u0663"):
        (repo_dir / "tiny_cls" / stray).mkdir()
        (repo_dir / "tiny_cls" / stray / "model.onnx").write_bytes(model)
    assert repo.versions_on_disk("tiny_cls") == [1]
    (repo_dir / "tiny_cls" / "active").write_text("\u00b2\n")
    assert repo.active_version("tiny_cls") is None
    assert repo.default_version("tiny_cls") == 1
