"""A mask as COCO's run-length encoding, for subscribers that want the pixels rather than the
outline: `{"size": [height, width], "counts": "<string>"}`, the compressed form pycocotools'
`maskUtils.encode` writes and COCO's results files carry. The bitmap is the polygon drawn at
frame size (OpenCV's `fillPoly`, the pixels whose centres it covers), read in column-major
order (Fortran, as pycocotools reads its masks); runs alternate 0s and 1s starting with 0s;
each run is written as pycocotools' `rleToString` writes it (from the third run on, the
difference from the run two before; 5 bits a character, offset by 48, with a continuation
bit)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from edged.core.errors import InvalidInput


def raster(polygon: Sequence[Sequence[float]], height: int, width: int) -> np.ndarray:
    """The polygon (frame pixels, 0.1 px as published) drawn as a bool [height, width] bitmap:
    OpenCV's fill with 4 fractional bits, so a tenth of a pixel counts."""
    bitmap = np.zeros((height, width), np.uint8)
    points = np.asarray(polygon, np.float64).reshape(-1, 2)
    if len(points) >= 3:
        fixed = np.round(points * 16).astype(np.int32)
        cv2.fillPoly(bitmap, [fixed], 1, lineType=cv2.LINE_8, shift=4)
    return bitmap.astype(bool)


def runs(bitmap: np.ndarray) -> list[int]:
    """Column-major runs of 0s and 1s, starting with 0s (a bitmap that starts with a 1 has a
    first run of 0)."""
    flat = np.asarray(bitmap, bool).ravel(order="F")
    if flat.size == 0:
        return []
    edges = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    bounds = np.concatenate(([0], edges, [flat.size]))
    counts = np.diff(bounds).tolist()
    return [0, *counts] if flat[0] else counts


def counts_string(counts: Sequence[int]) -> str:
    """pycocotools' `rleToString`: LEB128-like, 5 bits a character + 48, deltas from the third."""
    out = []
    for i, count in enumerate(counts):
        x = int(count) - int(counts[i - 2]) if i > 2 else int(count)
        more = True
        while more:
            c = x & 0x1F
            x >>= 5
            more = not (((c & 0x10) == 0 and x == 0) or ((c & 0x10) != 0 and x == -1))
            if more:
                c |= 0x20
            out.append(chr(c + 48))
    return "".join(out)


def string_counts(text: str) -> list[int]:
    """pycocotools' `rleFrString`: the runs back from their string."""
    counts: list[int] = []
    position = 0
    while position < len(text):
        x, shift, more = 0, 0, True
        while more:
            c = ord(text[position]) - 48
            x |= (c & 0x1F) << (5 * shift)
            more = bool(c & 0x20)
            position += 1
            shift += 1
            if not more and c & 0x10:
                x |= -1 << (5 * shift)
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def encode(polygon: Sequence[Sequence[float]], height: int, width: int) -> dict[str, Any]:
    """A mask polygon as COCO RLE at frame size."""
    return {"size": [height, width], "counts": counts_string(runs(raster(polygon, height,
                                                                          width)))}


def decode(rle: dict[str, Any]) -> np.ndarray:
    """A COCO RLE (string or list counts) back to its bool [height, width] bitmap;
    InvalidInput when its runs do not fill its size."""
    height, width = (int(v) for v in rle["size"])
    counts = rle["counts"]
    values = string_counts(counts) if isinstance(counts, str) else [int(c) for c in counts]
    if sum(values) != height * width or any(v < 0 for v in values):
        raise InvalidInput(f"RLE runs sum to {sum(values)}, not {height} x {width}")
    flat = np.repeat(np.arange(len(values)) % 2 == 1, values)
    return flat.reshape((height, width), order="F")


def encode_rows(rows: list[dict[str, Any]], width: int, height: int) -> None:
    """Each published detection row's `mask` polygon replaced by its RLE, in place."""
    for row in rows:
        mask = row.get("mask")
        if mask is not None:
            row["mask"] = encode(mask, height, width)
