"""Matching an embedding against a gallery: brute-force cosine similarity (a matrix-vector
product over unit vectors: 10k x 512 float32 is 20 MiB, read once), the negatives rule, and the
grouping of unknown embeddings. Pure numpy, no state.

The product is numpy's own loop (`einsum`), on the caller's thread, not BLAS: OpenBLAS splits a
matrix-vector product over its threads, which on a busy device spin for cores the frame path
is using (on the 2-core test VM: 0.4-7 ms wall and 4-7 ms of CPU a match at 10k entries,
against a steady 0.9-1.0 ms of one core for the loop, which is what reading 20 MiB costs). The
two differ in the last bits of a float32 sum (6e-8 at 10k x 512)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edged.core.errors import InvalidEmbedding

EPS = 1e-12


@dataclass(frozen=True)
class Match:
    name: str
    similarity: float  # cosine, -1..1
    entry: int  # the enrolled entry that matched best


def unit(vector: np.ndarray) -> np.ndarray:
    """The vector as float32 of length 1 (a zero vector stays zero: it matches nothing);
    InvalidEmbedding when it holds NaN or infinity (it would match nothing and start a new
    unknown group at every sighting)."""
    flat = np.asarray(vector, np.float32).reshape(-1)
    if not np.isfinite(flat).all():
        raise InvalidEmbedding(f"the {len(flat)}-wide embedding holds NaN or infinite values")
    norm = float(np.linalg.norm(flat))
    return flat / norm if norm > EPS else flat


def unit_rows(vectors: np.ndarray) -> np.ndarray:
    rows = np.asarray(vectors, np.float32)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.maximum(norms, EPS)


def similarities(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Each unit row's cosine with the unit `query`, on this thread (module docstring)."""
    return np.einsum("ij,j->i", vectors, query)


def best_match(query: np.ndarray, vectors: np.ndarray, codes: np.ndarray,
               negative: np.ndarray, names: list[str], ids: np.ndarray,
               threshold: float) -> Match | None:
    """The best enrolled name for `query` (a unit vector), or None.

    `vectors` [N, D] unit rows, `codes` [N] each row's name (an index into `names`),
    `negative` [N] bool (a negative: "this face is not names[code]"), `ids` [N] the rows' ids.
    A name matches when its most similar positive entry reaches `threshold` **and** is more
    similar to the query than every negative of that name: a face once marked "not X" keeps
    not becoming X, while X's own faces (closer to X's entries than to the negative) still do.
    Of the names that match, the most similar wins. Rows of another width than `query` (an
    embedder swapped between two calls) match nothing."""
    if not len(vectors) or vectors.shape[1] != len(query):
        return None
    sims = similarities(vectors, query)
    hits = np.flatnonzero(~negative & (sims >= threshold))
    if not len(hits):
        return None
    order = hits[np.argsort(-sims[hits], kind="stable")]
    refused: set[int] = set()
    for row in order.tolist():
        code = int(codes[row])
        if code in refused:
            continue
        against = negative & (codes == code)
        if against.any() and float(sims[against].max()) >= float(sims[row]):
            refused.add(code)
            continue
        return Match(names[code], round(float(sims[row]), 5), int(ids[row]))
    return None


def nearest_group(query: np.ndarray, vectors: np.ndarray, groups: np.ndarray,
                  threshold: float) -> tuple[int | None, float]:
    """The unknown group whose closest member is at least `threshold` similar to `query`
    (single linkage: a face seen from a new angle joins the group of its nearest sighting),
    and that similarity; (None, best) when none is close enough (or the rows are of another
    width than `query`)."""
    if not len(vectors) or vectors.shape[1] != len(query):
        return None, -1.0
    sims = similarities(vectors, query)
    best = int(np.argmax(sims))
    similarity = float(sims[best])
    return (int(groups[best]) if similarity >= threshold else None), similarity


def cluster(vectors: np.ndarray, threshold: float) -> list[int]:
    """Offline grouping of unit rows (the same rule as `nearest_group`, taken in order):
    each row joins the group of its most similar earlier row when that reaches `threshold`,
    else starts a group. Returns each row's group index."""
    groups: list[int] = []
    for i in range(len(vectors)):
        group, _ = nearest_group(vectors[i], vectors[:i], np.asarray(groups, np.int64),
                                 threshold)
        groups.append(max(groups, default=-1) + 1 if group is None else group)
    return groups
