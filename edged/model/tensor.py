"""A tensor's name, dtype and shape: the vocabulary that the repository, the backends, the
scheduler, the processing steps and the API all share (so it depends on nothing of theirs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    # -1 for a dynamic dim; the batch dim included when batched: -1 when the graph takes any
    # batch size, N when the graph's batch dim is fixed (see fixed_batch)
    shape: tuple[int, ...]

    def describe(self) -> str:
        return f"{self.name}: {self.dtype} {list(self.shape)}"


def fixed_batch(max_batch_size: int, inputs: Sequence[TensorSpec]) -> int | None:
    """The batch size a batched model's graph must be run with when its batch dim is fixed
    (an ONNX export with a static batch, e.g. [1, 3, 640, 640]); None when the graph takes any
    batch size or the model has no batch dim. The batcher sends at most `max_batch_size` rows
    and pads them with zero rows up to this size."""
    if max_batch_size <= 0 or not inputs or not inputs[0].shape:
        return None
    first = inputs[0].shape[0]
    return first if first > 0 else None
