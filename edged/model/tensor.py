"""A tensor's name, dtype and shape: the vocabulary that the repository, the backends, the
scheduler, the processing steps and the API all share (so it depends on nothing of theirs)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # -1 for a dynamic dim; the batch dim included when batched

    def describe(self) -> str:
        return f"{self.name}: {self.dtype} {list(self.shape)}"
