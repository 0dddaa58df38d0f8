"""GGUF files in the repository: the header read before any backend sees the file (the real
SmolLM2 file from its wheel, and files that are not GGUF or are cut short), and a version
holding model.gguf read as a language model."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from edged.core.errors import InvalidModel
from edged.model.gguf import read_header
from edged.model.repository import GGUF_FILE, ModelRepository
from tools.real_models import LANGUAGE_MODEL


@pytest.fixture(scope="module")
def gguf(real_models: Path) -> Path:
    return real_models / LANGUAGE_MODEL


def header_bytes(*pairs: tuple[str, int, bytes], version: int = 3, tensors: int = 0) -> bytes:
    out = b"GGUF" + struct.pack("<IQQ", version, tensors, len(pairs))
    for key, kind, value in pairs:
        out += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + value
    return out


def string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def language_repo(root: Path, gguf: Path, yaml: str = "") -> ModelRepository:
    (root / "smol" / "1").mkdir(parents=True)
    (root / "smol" / "1" / GGUF_FILE).symlink_to(gguf)
    if yaml:
        (root / "smol" / "model.yaml").write_text(yaml)
    return ModelRepository(root)


def test_read_header_when_smollm2_names_its_architecture_and_sizes(gguf: Path) -> None:
    header = read_header(gguf)
    assert header.architecture == "llama"
    assert header.number("context_length") == 8192
    assert header.number("block_count") == 30
    assert header.tensors > 0
    # 30 layers, 576 wide, 3 of 9 heads for keys and values: f16 K and V per token.
    assert header.kv_cache_bytes(512) == 2 * 2 * 512 * 30 * 192
    assert isinstance(header.metadata["tokenizer.chat_template"], str)


def test_read_header_when_not_gguf_is_invalid_model(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"\x08\x01onnx protobuf")
    with pytest.raises(InvalidModel, match="not a GGUF file"):
        read_header(path)


def test_read_header_when_cut_short_is_invalid_model(gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(gguf.read_bytes()[:4096])  # inside the tokenizer's arrays
    with pytest.raises(InvalidModel, match="cut short"):
        read_header(path)


def test_read_header_when_version_unknown_is_invalid_model(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(header_bytes(version=9))
    with pytest.raises(InvalidModel, match="GGUF version 9"):
        read_header(path)


def test_read_header_when_counts_are_hostile_is_invalid_model(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1 << 40))
    with pytest.raises(InvalidModel, match="claims"):
        read_header(path)
    path.write_bytes(header_bytes(("a", 9, struct.pack("<IQ", 8, 1 << 40))))
    with pytest.raises(InvalidModel, match="an array of"):
        read_header(path)


def test_read_header_when_values_of_every_kind_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(header_bytes(("general.architecture", 8, string("toy")),
                                  ("toy.block_count", 4, struct.pack("<I", 2)),
                                  ("toy.scale", 6, struct.pack("<f", 0.5)),
                                  ("toy.flag", 7, b"\x01"),
                                  ("toy.names", 9, struct.pack("<IQ", 8, 2) + string("a")
                                   + string("b")),
                                  ("toy.ids", 9, struct.pack("<IQ", 5, 3) + bytes(12))))
    header = read_header(path)
    assert header.architecture == "toy"
    assert header.number("block_count") == 2
    assert header.metadata["toy.scale"] == 0.5 and header.metadata["toy.flag"] is True
    assert header.metadata["toy.names"] == 2 and header.metadata["toy.ids"] == 3
    assert header.number("missing", 7) == 7


def test_repository_when_version_holds_gguf_reads_a_language_model(
        gguf: Path, tmp_path: Path) -> None:
    repo = language_repo(tmp_path, gguf, "llm: {context: 512, threads: 1}\n")
    model = repo.get("smol", 1)
    assert model.is_language and model.model_path.name == GGUF_FILE
    assert model.config.backend == "llamacpp" and model.config.llm.context == 512
    assert model.max_batch_size == 0 and not model.config.deterministic
    assert [(s.name, s.dtype, s.shape) for s in model.inputs] == [
        ("text_input", np.dtype(object), (1,))]
    assert model.sha256() == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def test_repository_when_gguf_names_another_backend_is_invalid_model(
        gguf: Path, tmp_path: Path) -> None:
    repo = language_repo(tmp_path, gguf, "backend: onnxruntime\n")
    with pytest.raises(InvalidModel, match=r"cannot run model\.gguf"):
        repo.get("smol", 1)


def test_repository_when_context_exceeds_training_is_invalid_model(
        gguf: Path, tmp_path: Path) -> None:
    repo = language_repo(tmp_path, gguf, "llm: {context: 16384}\n")
    with pytest.raises(InvalidModel, match="more than the 8192 tokens"):
        repo.get("smol", 1)


def test_repository_when_llm_key_unknown_is_invalid_model(gguf: Path, tmp_path: Path) -> None:
    repo = language_repo(tmp_path, gguf, "llm: {contxt: 512}\n")
    with pytest.raises(InvalidModel, match=r"llm\.contxt"):
        repo.get("smol", 1)


def test_repository_install_when_gguf_is_not_gguf_refuses_it(
        gguf: Path, tmp_path: Path) -> None:
    repo = language_repo(tmp_path, gguf)
    with pytest.raises(InvalidModel, match="not a GGUF file"):
        repo.install("smol", 2, {GGUF_FILE: b"<html>not found</html>"})
    assert repo.versions_on_disk("smol") == [1]
    stage = tmp_path / "copy.gguf"
    shutil.copyfile(gguf, stage)
    assert repo.install("smol", 2, {GGUF_FILE: stage}).is_language
    assert repo.versions_on_disk("smol") == [1, 2]


def test_check_config_when_a_stream_names_a_language_model_refuses_it(
        gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edged.cli import main

    language_repo(tmp_path / "models", gguf)
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {tmp_path / 'models'}\nstreams:\n"
                      "  - {name: s, source: 'mqtt://sensors/s', model: smol}\n")
    assert main(["check-config", str(config)]) == 1
    assert ("streams[0].model: smol:1 is a language model (model.gguf): it generates text "
            "for the API, it takes no frames or tensors (line 3)") in capsys.readouterr().out
