"""Read an ONNX file's I/O signature and reconcile it with what `model.yaml` declares.

What model.yaml leaves out is taken from the ONNX graph; what it says must agree with it, and
every disagreement is reported with the model.yaml line and the ONNX file's name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edged.core.errors import ConfigIssue, InvalidModel
from edged.core.schema import Parsed
from edged.model.config import DTYPES, ModelConfig, TensorConfig
from edged.model.tensor import TensorSpec

if TYPE_CHECKING:
    import onnx

# Triton's auto-complete uses 4; edge batches of camera frames are often a little larger.
DEFAULT_MAX_BATCH_SIZE = 8


# Ops that move values without computing them: an output's "producer" is looked for behind them.
_PLUMBING = {"Identity", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Cast"}


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]  # full ONNX shapes, -1 for dynamic dims
    outputs: tuple[TensorSpec, ...]
    metadata: Mapping[str, str] = field(default_factory=dict)  # the file's metadata_props
    producers: Mapping[str, str] = field(default_factory=dict)  # output → op that computes it


def read_signature(path: Path) -> Signature:
    """The graph inputs (initializers excluded) and outputs; InvalidModel if the file is bad."""
    import onnx
    from onnx import helper

    if not path.is_file():
        raise InvalidModel(f"{path}: model file is missing")
    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(model)
    except Exception as exc:  # DecodeError, ValidationError, ...: all mean "not usable"
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModel(f"{path}: not a valid ONNX model ({first_line})") from exc
    graph = model.graph
    if not graph.output or not graph.node:
        raise InvalidModel(f"{path}: not a valid ONNX model (empty graph; truncated file?)")
    weights = {init.name for init in graph.initializer}

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        tensor = value.type.tensor_type
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        except (KeyError, TypeError) as exc:
            raise InvalidModel(f"{path}: {value.name} has an unsupported element type") from exc
        dims = tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1
                     for d in tensor.shape.dim)
        return TensorSpec(value.name, dtype, dims)

    return Signature(tuple(spec(v) for v in graph.input if v.name not in weights),
                     tuple(spec(v) for v in graph.output),
                     {p.key: p.value for p in model.metadata_props},
                     _producers(graph))


def _producers(graph: onnx.GraphProto) -> dict[str, str]:
    """The op type that computes each output (a Sigmoid says "scores are probabilities"),
    looking through reshapes and transposes."""
    made_by = {name: node for node in graph.node for name in node.output}
    found: dict[str, str] = {}
    for value in graph.output:
        node = made_by.get(value.name)
        for _hop in range(16):
            if node is None or node.op_type not in _PLUMBING or not node.input:
                break
            node = made_by.get(node.input[0])
        if node is not None:
            found[value.name] = node.op_type
    return found


Specs = tuple[TensorSpec, ...]


def reconcile(parsed: Parsed[ModelConfig], signature: Signature, yaml_path: Path,
              onnx_path: Path) -> tuple[ModelConfig, Specs, Specs]:
    """Merge model.yaml with the ONNX signature; raise InvalidModel listing every disagreement."""
    config = parsed.value
    issues: list[ConfigIssue] = []

    def issue(path: str, message: str) -> None:
        issues.append(ConfigIssue(path, message, parsed.lines.get(path), str(yaml_path)))

    max_batch = config.max_batch_size
    everything = signature.inputs + signature.outputs
    dynamic = bool(signature.inputs) and all(t.shape[:1] == (-1,) for t in everything)
    fixed = _fixed_first_dim(signature)
    if max_batch is None:
        # A fixed batch dim is served as Triton serves a static-batch ONNX model: max_batch_size
        # N, dims without the batch dim; clients and streams send rows, the batcher pads to N.
        max_batch = DEFAULT_MAX_BATCH_SIZE if dynamic else (fixed or 0)
    elif max_batch > 0 and fixed is not None:
        if max_batch > fixed:
            first = signature.inputs[0]
            issue("max_batch_size", f"is {max_batch}, but {first.name} in {onnx_path.name} has "
                  f"a fixed batch dim of {fixed} (shape {list(first.shape)}); use "
                  f"max_batch_size: {fixed} or less, or 0 for no batch dim")
    elif max_batch > 0:
        for t in everything:
            if t.shape[:1] != (-1,):
                issue("max_batch_size", f"is {max_batch}, but {t.name} in {onnx_path.name} has "
                      f"no dynamic first dim (shape {list(t.shape)}), nor one fixed batch dim "
                      f"shared by every input and output; use max_batch_size: 0")
    inputs = _merge("inputs", config.inputs, signature.inputs, max_batch, onnx_path, issue)
    outputs = _merge("outputs", config.outputs, signature.outputs, max_batch, onnx_path, issue)
    if issues:
        raise InvalidModel("; ".join(str(i) for i in issues))
    resolved = dataclasses.replace(
        config, max_batch_size=max_batch,
        inputs=[_to_config(t, max_batch) for t in inputs],
        outputs=[_to_config(t, max_batch) for t in outputs])
    return resolved, inputs, outputs


def _merge(kind: str, declared: list[TensorConfig], actual: tuple[TensorSpec, ...],
           max_batch: int, onnx_path: Path,
           issue: Callable[[str, str], None]) -> tuple[TensorSpec, ...]:
    by_name = {t.name: t for t in actual}
    overrides: dict[str, TensorSpec] = {}
    for i, d in enumerate(declared):
        path = f"{kind}[{i}]"
        t = by_name.get(d.name)
        if t is None:
            issue(f"{path}.name", f"{d.name!r} is not one of the {kind} of {onnx_path.name} "
                  f"({', '.join(by_name) or 'none'})")
            continue
        dims = t.shape[1:] if max_batch > 0 else t.shape
        if d.dtype is not None and np.dtype(DTYPES[d.dtype]) != t.dtype:
            issue(f"{path}.dtype", f"{d.dtype} disagrees with {onnx_path.name} ({t.dtype})")
        if d.shape is not None:
            if len(d.shape) != len(dims):
                issue(f"{path}.shape", f"{d.shape} has {len(d.shape)} dims but {onnx_path.name} "
                      f"has {len(dims)} ({list(dims)}, batch dim excluded)")
            else:
                for a, b in zip(d.shape, dims, strict=True):
                    if a != -1 and b != -1 and a != b:
                        issue(f"{path}.shape", f"{d.shape} disagrees with {onnx_path.name} "
                              f"({list(dims)}, batch dim excluded)")
                        break
                # A declared size narrows a dynamic ONNX dim; a fixed ONNX dim always wins.
                dims = tuple(b if b != -1 else a for a, b in zip(d.shape, dims, strict=True))
        # The batch dim stays as the graph has it: -1, or N when the graph's batch is fixed.
        overrides[t.name] = TensorSpec(t.name, t.dtype,
                                       (t.shape[0], *dims) if max_batch > 0 else dims)
    # Undeclared tensors come from the graph as they are (a batched graph's first dim is -1,
    # or its fixed batch size).
    return tuple(overrides.get(t.name, t) for t in actual)


def _fixed_first_dim(signature: Signature) -> int | None:
    """N when every input and output has the same fixed first dim N and at least one more dim;
    None otherwise. A tensor whose only dim is fixed ([4]) holds data, not a batch of
    scalars, so such a graph is read as having no batch dim."""
    everything = signature.inputs + signature.outputs
    firsts = {t.shape[0] if len(t.shape) >= 2 else -1 for t in everything}
    if not signature.inputs or len(firsts) != 1:
        return None
    first = firsts.pop()
    return first if first > 0 else None


def _to_config(spec: TensorSpec, max_batch: int) -> TensorConfig:
    dims = list(spec.shape[1:] if max_batch > 0 else spec.shape)
    return TensorConfig(spec.name, spec.dtype.name, dims)
