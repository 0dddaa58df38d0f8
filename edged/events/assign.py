"""Matching tracks to detections: given a [tracks, detections] similarity (IoU) and the least
similarity a match may have, the pairs to take, each track and detection used once.

`cluster_assign`, the tracker's, gives what scipy's `linear_sum_assignment` gives SORT (the
assignment of largest total IoU, then pairs under the threshold dropped) without scipy: the
overlapping pairs split into clusters that share no track and no detection, and only a cluster
where two tracks overlap the same detection needs solving (Hungarian method in plain Python;
such clusters are a handful of objects). Most clusters are one track and one detection.
Optimising over every overlapping pair, not only those above the threshold, lets a track that
overlaps a detection a little hold it against a second track: fewer id changes in crowds.
`greedy_assign` (best pair first) is kept for comparison. Numbers:
`docs/decisions/013-events-engine.md`, `python -m tools.bench events`.
"""

from __future__ import annotations

import numpy as np


def greedy_assign(similarity: np.ndarray, least: float) -> list[tuple[int, int]]:
    """Pairs by falling similarity, each row and column used once, none below `least`."""
    rows, cols = np.nonzero(similarity >= least)
    if rows.size == 0:
        return []
    order = np.argsort(-similarity[rows, cols], kind="stable")
    used_rows: set[int] = set()
    used_cols: set[int] = set()
    pairs = []
    for r, c in zip(rows[order].tolist(), cols[order].tolist(), strict=True):
        if r not in used_rows and c not in used_cols:
            used_rows.add(r)
            used_cols.add(c)
            pairs.append((r, c))
    return pairs


def cluster_assign(similarity: np.ndarray, least: float) -> list[tuple[int, int]]:
    """The assignment of largest total similarity over every overlapping pair, then the pairs
    under `least` dropped (as SORT does with scipy)."""
    overlap = similarity > 0
    rows, cols = np.nonzero(overlap)
    if rows.size == 0:
        return []
    # A track overlapping one detection that overlaps no other track: the usual case.
    alone = (overlap.sum(1)[rows] == 1) & (overlap.sum(0)[cols] == 1)
    chosen = list(zip(rows[alone].tolist(), cols[alone].tolist(), strict=True))
    rows, cols = rows[~alone], cols[~alone]
    if rows.size:
        chosen += _solve_clusters(similarity, rows.tolist(), cols.tolist())
    if not chosen:
        return []
    pairs = np.array(chosen)
    keep = similarity[pairs[:, 0], pairs[:, 1]] >= least
    return sorted(map(tuple, pairs[keep].tolist()))


def _solve_clusters(similarity: np.ndarray, rows: list[int],
                    cols: list[int]) -> list[tuple[int, int]]:
    """The optimal pairs of each cluster of overlapping (row, column) edges."""
    offset = similarity.shape[0]
    parent = list(range(offset + similarity.shape[1]))  # rows, then columns past `offset`

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    edges = list(zip(rows, cols, strict=True))
    for r, c in edges:
        parent[root(r)] = root(offset + c)
    weight = dict(zip(edges, similarity[rows, cols].tolist(), strict=True))
    clusters: dict[int, list[tuple[int, int]]] = {}
    for r, c in edges:
        clusters.setdefault(root(r), []).append((r, c))
    chosen = []
    for members in clusters.values():
        cluster_rows = sorted({r for r, _c in members})
        cluster_cols = sorted({c for _r, c in members})
        if len(cluster_rows) == 1 or len(cluster_cols) == 1:  # a star: its best edge
            chosen.append(max(members, key=lambda rc: (weight[rc], -rc[0], -rc[1])))
            continue
        block = [[weight.get((r, c), 0.0) for c in cluster_cols] for r in cluster_rows]
        chosen += [(cluster_rows[i], cluster_cols[j]) for i, j in hungarian(block)]
    return chosen


def hungarian(weights: list[list[float]]) -> list[tuple[int, int]]:
    """Maximum-weight assignment of a dense rectangular matrix (Kuhn-Munkres with potentials,
    O(n² m)); returns (row, column) pairs, min(rows, columns) of them."""
    transposed = len(weights) > len(weights[0])
    if transposed:
        weights = [list(col) for col in zip(*weights, strict=True)]
    n, m = len(weights), len(weights[0])
    cost = [[-w for w in row] for row in weights]  # the method minimises
    u, v = [0.0] * (n + 1), [0.0] * (m + 1)
    owner, way = [0] * (m + 1), [0] * (m + 1)  # owner[j]: row (1-based) holding column j
    for i in range(1, n + 1):
        owner[0], j0 = i, 0
        least = [float("inf")] * (m + 1)
        used = [False] * (m + 1)
        while owner[j0] != 0:
            used[j0] = True
            i0, delta, j1 = owner[j0], float("inf"), 0
            for j in range(1, m + 1):
                if not used[j]:
                    reduced = cost[i0 - 1][j - 1] - u[i0] - v[j]
                    if reduced < least[j]:
                        least[j], way[j] = reduced, j0
                    if least[j] < delta:
                        delta, j1 = least[j], j
            for j in range(m + 1):
                if used[j]:
                    u[owner[j]] += delta
                    v[j] -= delta
                else:
                    least[j] -= delta
            j0 = j1
        while j0:
            j1 = way[j0]
            owner[j0] = owner[j1]
            j0 = j1
    pairs = [(owner[j] - 1, j - 1) for j in range(1, m + 1) if owner[j]]
    return sorted((c, r) for r, c in pairs) if transposed else sorted(pairs)
