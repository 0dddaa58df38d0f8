"""A preprocess that does not say its layout takes the input's shape's (`layout_of`); a model
whose file tells nothing of its pre-processing keeps `preprocess: null`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edged.model.repository import ModelRepository
from edged.model.resolve import layout_of
from edged.model.tensor import TensorSpec


def channels_last_classifier(path: Path) -> None:
    """input_0 [N, 224, 224, 3] float32 -> the mean of each channel [N, 3]."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input_0"], ["probs"], axes=[1, 2], keepdims=0)],
        "nhwc", [helper.make_tensor_value_info("input_0", TensorProto.FLOAT,
                                               ["N", 224, 224, 3])],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["N", 3])])
    path.parent.mkdir(parents=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), path)


@pytest.mark.parametrize(("shape", "layout"), [
    ((-1, 224, 224, 3), "nhwc"), ((-1, -1, -1, 3), "nhwc"), ((1, 28, 28, 1), "nhwc"),
    ((-1, 3, 224, 224), "nchw"), ((-1, 3, -1, -1), "nchw"), ((3, 32, -1), "nchw"),
    ((-1, -1, -1, -1), None), ((-1, 4), None)])
def test_layout_of_when_reading_an_input_shape_tells_channels_last_from_first(
        shape: tuple[int, ...], layout: str | None) -> None:
    assert layout_of(TensorSpec("x", np.dtype(np.float32), shape)) == layout


def test_resolve_when_preprocess_omits_layout_takes_nhwc_from_the_shape_and_says_why(
        tmp_path: Path) -> None:
    channels_last_classifier(tmp_path / "nsfw" / "1" / "model.onnx")
    (tmp_path / "nsfw" / "model.yaml").write_text("preprocess: {resize: [224, 224]}\n")
    model = ModelRepository(tmp_path).resolve("nsfw")
    assert model.config.preprocess is not None and model.config.preprocess.layout == "nhwc"
    assert model.reasons["preprocess"] == "model.yaml; layout nhwc from the input's shape " \
                                          "[-1, 224, 224, 3]"


def test_resolve_when_model_yaml_says_the_layout_keeps_it(tmp_path: Path) -> None:
    channels_last_classifier(tmp_path / "nsfw" / "1" / "model.onnx")
    (tmp_path / "nsfw" / "model.yaml").write_text("preprocess: {layout: nchw}\n")
    model = ModelRepository(tmp_path).resolve("nsfw")
    assert model.config.preprocess is not None and model.config.preprocess.layout == "nchw"


def test_resolve_when_nothing_tells_the_preprocess_keeps_it_null(tmp_path: Path) -> None:
    channels_last_classifier(tmp_path / "nsfw" / "1" / "model.onnx")
    model = ModelRepository(tmp_path).resolve("nsfw")
    assert model.config.preprocess is None and "preprocess" not in model.reasons
