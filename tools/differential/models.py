"""The models the differential test serves: small, with answers exact at any batch size (element
by element, so a batch of three and three runs alone give the same bytes), covering what the
shortcuts treat differently: FP32 and INT32 and BYTES inputs, one input and two, the response
cache on and off, requests run on the event loop and by the workers after a queue delay, and
versions to swap in (one with other inputs)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto, helper

from tools.assets.models import (
    build_model,
    declare_float,
    make_identity,
    make_scale,
    write_model,
)


@dataclass(frozen=True)
class Input:
    name: str
    datatype: str  # KServe's: FP32, INT32, BYTES
    width: int | None  # the second dim; None: any (the request picks it)


@dataclass(frozen=True)
class Model:
    name: str
    inputs: tuple[Input, ...]
    outputs: tuple[str, ...]
    yaml: str = ""


def make_pair() -> onnx.ModelProto:
    """a, b [batch, 4] → sum = a + b, prod = a · b."""
    return build_model(
        "pair",
        [helper.make_node("Add", ["a", "b"], ["sum"]), helper.make_node("Mul", ["a", "b"],
                                                                       ["prod"])],
        [declare_float("a", ["batch", 4]), declare_float("b", ["batch", 4])],
        [declare_float("sum", ["batch", 4]), declare_float("prod", ["batch", 4])], [])


# Several priority levels, a generous queue: nothing the generator sends is refused for load.
_QUEUE = "max_queue_size: 4096, priority_levels: 2"
MODELS: dict[str, Model] = {m.name: m for m in (
    Model("scale", (Input("x", "FP32", 4),), ("y",),
          f"response_cache: true\nbatching: {{{_QUEUE}}}\n"),
    Model("queued", (Input("x", "FP32", 4),), ("y",),
          f"batching: {{max_queue_delay_us: 2000, {_QUEUE}}}\n"),
    Model("pair", (Input("a", "FP32", 4), Input("b", "FP32", 4)), ("sum", "prod"),
          f"response_cache: true\nbatching: {{{_QUEUE}}}\n"),
    Model("ints", (Input("INPUT0", "INT32", None),), ("OUTPUT0",),
          f"response_cache: true\nbatching: {{{_QUEUE}}}\n"),
    Model("strings", (Input("INPUT0", "BYTES", None),), ("OUTPUT0",),
          f"response_cache: true\nbatching: {{{_QUEUE}}}\n"),
)}


def first_versions() -> dict[str, onnx.ModelProto]:
    return {"scale": make_scale(4), "queued": make_scale(4, name="queued"), "pair": make_pair(),
            "ints": make_identity(TensorProto.INT32, "ints"),
            "strings": make_identity(TensorProto.STRING, "strings")}


# `scale`'s versions to swap in, by what they change: (input width, factor).
SCALE_VERSIONS = ((4, 4.0), (8, 2.0), (4, 0.5), (8, 3.0), (4, 2.0))


def scale_version(width: int, factor: float) -> bytes:
    return make_scale(width, factor).SerializeToString()


def write_repository(root: Path) -> Path:
    """Every model's first version and its model.yaml under `root`."""
    for name, model in first_versions().items():
        write_model(model, root / name / "1" / "model.onnx")
        if MODELS[name].yaml:
            (root / name / "model.yaml").write_text(MODELS[name].yaml)
    return root
