"""Triton's raw binary request (the binary tensor extension): with
`Inference-Header-Content-Length: 0` the body is no JSON at all but the bytes of the model's
one input, whose name, datatype and shape come from the model. Triton's rules: the model has
exactly one input; a BYTES input has shape [1] and the body is that one element (no length
prefix); otherwise at most one dim is dynamic, and the body's size fixes it. A batched model
gets a batch of one. Every output comes back as JSON."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from edged.api import tensorbytes
from edged.api.protocol import HEADER_LENGTH, InferRequest
from edged.core.errors import InvalidInput
from edged.model.repository import ModelVersion


def copies_body(model: ModelVersion) -> bool:
    """Whether decoding copies the body: a BYTES input's element is bytes of its own (other
    inputs are views of the body)."""
    return len(model.inputs) == 1 and tensorbytes.is_bytes(model.inputs[0].dtype)


def decode_raw(model: ModelVersion, body: bytes | bytearray | memoryview,
               charge: Callable[[int], None] | None = None) -> InferRequest:
    """The request the body is; a copy it makes (a BYTES element) is charged first."""
    body = memoryview(body).cast("B")
    what = f"{model.label}: a raw binary request ({HEADER_LENGTH}: 0)"
    if len(model.inputs) != 1:
        raise InvalidInput(f"{what} needs a model with one input; this one has "
                           f"{len(model.inputs)}")
    spec = model.inputs[0]
    batched = model.max_batch_size > 0
    dims = list(spec.shape[1:] if batched else spec.shape)
    if tensorbytes.is_bytes(spec.dtype):
        if dims not in ([1], [-1]):
            raise InvalidInput(f"{what}: the BYTES input {spec.name} must have shape [1], "
                               f"the model's is {dims}")
        if charge is not None:
            charge(len(body))
        array = np.empty(1, dtype=np.object_)
        array[0] = bytes(body)
        dims = [1]
    else:
        dtype = np.dtype(spec.dtype).newbyteorder("<")
        if len(body) % dtype.itemsize:
            raise InvalidInput(f"{what}: {len(body)} bytes are not a whole number of "
                               f"{spec.dtype} elements")
        count = len(body) // dtype.itemsize
        dynamic = [i for i, d in enumerate(dims) if d < 0]
        fixed = math.prod(d for d in dims if d >= 0)
        if len(dynamic) > 1:
            raise InvalidInput(f"{what}: input {spec.name} has {len(dynamic)} dynamic dims "
                               f"{dims}, so its shape cannot be told from the body's size")
        if dynamic:
            if fixed == 0 or count % fixed:
                raise InvalidInput(f"{what}: {count} elements do not fill input {spec.name} "
                                   f"{dims}")
            dims[dynamic[0]] = count // fixed
        elif count != fixed:
            raise InvalidInput(f"{what}: {len(body)} bytes for input {spec.name} {dims} "
                               f"({fixed * dtype.itemsize} expected)")
        array = np.frombuffer(body, dtype=dtype, count=count)  # a view: no copy
    return InferRequest(None, {spec.name: array.reshape([1, *dims] if batched else dims)})
