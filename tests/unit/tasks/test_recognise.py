"""Tasks recognised from the file: classifiers of any origin by their [N, C] output and the
class names their metadata (`names`, `labels`, `classes`) or labels file gives, CTC text
recognisers by `character`, raw with the reason when nothing fits, refused naming the keys when
two do; the model config API says which and why."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

from edged.api.describe import model_config
from edged.core.errors import InvalidModel
from edged.model.metadata import read_metadata
from edged.model.repository import ModelRepository
from edged.model.tensor import TensorSpec
from edged.tasks.recognise import recognise
from tools.assets.models import make_colors, write_model


def colors_with(tmp_path: Path, props: dict[str, str], labels: str | None = None) -> Path:
    model = make_colors()
    helper.set_model_props(model, props)
    write_model(model, tmp_path / "cls" / "1" / "model.onnx")
    if labels is not None:
        (tmp_path / "cls" / "labels.txt").write_text(labels)
    return tmp_path


@pytest.mark.parametrize(("props", "labels", "source"), [
    ({"labels": "['red', 'green', 'blue']"}, None, "metadata labels: 3 names"),
    ({"classes": "red\ngreen\nblue"}, None, "metadata classes: 3 names"),
    ({"classes": "red, green, blue"}, None, "metadata classes: 3 names"),
    ({}, "red\ngreen\nblue\n", "the labels file's 3 lines"),
])
def test_classifier_when_its_names_fit_its_output_is_recognised_with_them(
        tmp_path: Path, props: dict[str, str], labels: str | None, source: str) -> None:
    model = ModelRepository(colors_with(tmp_path, props, labels)).resolve("cls")
    edged = model_config(model)["edged"]
    assert edged["task"]["kind"] == "classify"
    assert source in edged["task"]["reason"]
    assert edged["postprocess"]["names"] == ["red", "green", "blue"]


def test_classifier_when_its_names_do_not_fit_is_raw_with_the_reason(tmp_path: Path) -> None:
    model = ModelRepository(colors_with(tmp_path, {"labels": "['a', 'b']"})).resolve("cls")
    task = model_config(model)["edged"]["task"]
    assert task["kind"] == "raw"
    assert task["reason"].startswith("raw: no task told")
    assert "prob [-1, 3]" in task["reason"]


@dataclass(frozen=True)
class _Said:
    task: str | None = None
    names: tuple[str, ...] | None = None
    labels: tuple[str, ...] | None = None
    labels_key: str | None = None
    character: tuple[str, ...] | None = None
    kpt_shape: tuple[int, int] | None = None


def test_recognise_when_two_tasks_fit_refuses_naming_the_keys() -> None:
    outputs = [TensorSpec("out", np.dtype(np.float32), (1, 5))]
    said = _Said(names=tuple("abcde"))
    with pytest.raises(InvalidModel, match=r"more than one task: classify .*metadata names.*; "
                                           r"detect .*set postprocess.kind"):
        recognise(said, outputs, detector="kind detect: outputs of boxes")


def test_recognise_when_the_metadata_has_a_character_set_reads_a_ctc_recogniser() -> None:
    outputs = [TensorSpec("softmax", np.dtype(np.float32), (-1, 40, 12))]
    found = recognise(_Said(character=tuple("0123456789")), outputs, batched=True)
    assert found.kind == "text"
    assert "10 characters, the blank and a space" in found.why
    assert recognise(_Said(character=tuple("0123456789a")), outputs, batched=True).kind == "text"
    assert recognise(_Said(character=tuple("0123")), outputs, batched=True).kind is None


def test_recognise_when_the_metadata_task_is_obb_serves_raw_saying_so() -> None:
    found = recognise(_Said(task="obb"), [TensorSpec("o", np.dtype(np.float32), (1, 20, 84))])
    assert found.kind is None and "obb" in found.why


def test_metadata_when_kpt_shape_or_names_are_malformed_reads_them_as_absent() -> None:
    meta = read_metadata({"kpt_shape": "[17, 5]", "kpt_names": "{0: ['a', 'b']}",
                          "labels": "1 2 3 ["}, "m.onnx")
    assert meta.kpt_shape is None
    assert meta.kpt_names == ("a", "b")
    assert meta.labels == ("1 2 3 [",)
