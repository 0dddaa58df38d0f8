"""Embeddings: a model whose one output is [N, D] with no class names is an embedder (a face's
ArcFace or SFace, an image's CLIP). Its vectors are compared by cosine similarity, so they are
made unit length here; a stream publishes only their size, never the vectors (a gallery keeps
them on the device)."""

from __future__ import annotations

from typing import Any

import numpy as np

MIN_DIM = 64  # narrower [N, D] outputs without names are left raw (tiny heads, logits)


def unit_rows(output: np.ndarray) -> np.ndarray:
    """[N, D] (or [D]) → [N, D] float32 rows of length 1 (a zero row stays zero)."""
    rows = np.asarray(output, np.float32).reshape(-1, output.shape[-1])
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, 1e-12)


def summary(output: np.ndarray) -> dict[str, Any]:
    """What a whole-frame embedding stream publishes: the size and norm, not the vector."""
    rows = np.asarray(output, np.float32).reshape(-1, output.shape[-1])
    return {"dim": int(rows.shape[1]), "norm": round(float(np.linalg.norm(rows[0])), 5)}
