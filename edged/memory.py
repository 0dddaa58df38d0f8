"""Buffer pools that batches are assembled in. Today: plain host memory for the CPU path; the
pinned, mapped (zero-copy) and managed pools for GPUs extend the same `take()` contract."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class HostBufferPool:
    """One reusable buffer per input name, sized for the largest batch; not thread-safe, so
    each worker thread owns one. The batch is written into it once (the one copy a request
    makes on its way to the backend)."""

    def __init__(self, max_rows: int) -> None:
        self.max_rows = max_rows
        self._buffers: dict[str, np.ndarray] = {}

    def take(self, name: str, rows: int, tail: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A C-contiguous view of shape (rows, *tail), valid until the next take() of `name`."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[1:] != tail or buf.dtype != dtype or buf.shape[0] < rows:
            buf = np.empty((max(rows, self.max_rows), *tail), dtype=dtype)
            self._buffers[name] = buf
        return buf[:rows]

    def concatenate(self, name: str, parts: Sequence[np.ndarray]) -> np.ndarray:
        """Stack request arrays along axis 0 into the pooled buffer for `name`."""
        first = parts[0]
        rows = sum(p.shape[0] for p in parts)
        out = self.take(name, rows, first.shape[1:], first.dtype)
        np.concatenate(parts, axis=0, out=out)
        return out
