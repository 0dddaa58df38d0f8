"""What matching reads: every row's unit vector beside its id, name (or group) and whether it
is a negative, as one immutable snapshot the stream threads read without a lock
(`edged.galleries.store` builds it from the file, or appends one row to it)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Index:
    """What matching reads: every row's unit vector and the columns beside it."""

    vectors: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), np.float32))
    ids: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    negative: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    names: list[str] = field(default_factory=list)


def appended(index: Index, row: int, name: str, negative: bool, vector: np.ndarray
             ) -> Index:
    """The index with one more row (a new one: the old stays as readers hold it)."""
    if len(index.ids) and index.vectors.shape[1] != len(vector):
        return index  # another width: matches nothing, as load_index leaves it out
    names = index.names if name in index.names else [*index.names, name]
    vectors = np.concatenate([index.vectors.reshape(-1, len(vector)), vector[None]])
    return Index(vectors, np.append(index.ids, row), np.append(index.codes, names.index(name)),
                  np.append(index.negative, negative), names)


def load_index(rows: Iterator[tuple[Any, ...]], numeric: bool = False) -> Index:
    """An index of (id, name or group, negative, vector blob) rows; `numeric`: the second
    column is a group number, kept as the code itself."""
    ids, keys, negative, blobs = [], [], [], []
    for row_id, key, neg, blob in rows:
        ids.append(row_id)
        keys.append(key)
        negative.append(bool(neg))
        blobs.append(blob)
    if not ids:
        return Index()
    width = len(blobs[0]) // 4
    vectors = np.frombuffer(b"".join(b for b in blobs if len(b) == width * 4), np.float32)
    keep = [i for i, b in enumerate(blobs) if len(b) == width * 4]
    # A copy: the joined bytes' buffer is not aligned for BLAS, which would then copy the
    # whole matrix at every match (20 MiB at 10k entries: 3-8 ms instead of 0.2).
    vectors = vectors.reshape(len(keep), width).copy()
    if numeric:
        return Index(vectors, np.array([ids[i] for i in keep], np.int64),
                      np.array([keys[i] for i in keep], np.int64),
                      np.array([negative[i] for i in keep], bool), [])
    names = sorted({keys[i] for i in keep})
    code_of = {n: c for c, n in enumerate(names)}
    return Index(vectors, np.array([ids[i] for i in keep], np.int64),
                  np.array([code_of[keys[i]] for i in keep], np.int64),
                  np.array([negative[i] for i in keep], bool), names)
