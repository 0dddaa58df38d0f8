"""Pillow's bilinear resize of 8-bit images, to the bit: what torchvision's `Resize` does to a
PIL image (Ultralytics' classifiers are fed through it), which no OpenCV flag reproduces.

Pillow (src/libImaging/Resample.c) resizes in two separable passes (horizontal first, unless
the height loses more than twice the pixels the width loses: Pillow 13's rule), each output
pixel a weighted sum of the input pixels under a triangle filter widened by the shrink factor
(antialiased: a 5x shrink weighs about 11 pixels, where OpenCV's INTER_LINEAR reads 2). The
weights are normalised per output pixel, turned to 22-bit fixed point (`int(0.5 + w *
2**22)`), summed in integers from a rounding half, shifted back and clipped; the first pass's
result is stored as uint8 before the second reads it.
This is that arithmetic in numpy: the weights with the same double expressions in the same
order (the sum of a pixel's weights accumulated tap by tap, as the C loop does), the sums in
int32 (at most 255 * 2**22 + 2**21 < 2**31). Bilinear's weights are products and sums of
exact values and a division, so no fused multiply-add on any platform changes them.

`box` asks for part of the resized image (a centre crop's window): each output pixel depends
only on its own weights, so the window is the full resize's pixels, computed alone. Measured
against Pillow 13.0 (decision 041's addendum): equal bytes on every case tried.
"""

from __future__ import annotations

import cv2
import numpy as np

PRECISION_BITS = 22  # Resample.c: 32 - 8 - 2
SUPPORT = 1.0  # the bilinear (triangle) filter's half-width


def coefficients(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per output pixel: the first input pixel it reads, and its fixed-point weights
    [out_size, taps] (zero past the pixels it reads): Resample.c's precompute_coeffs and
    normalize_coeffs_8bpc for the box (0, 0, in_size, ...)."""
    scale = float(in_size) / out_size
    filterscale = max(scale, 1.0)
    support = SUPPORT * filterscale
    taps = int(np.ceil(support)) * 2 + 1
    center = (np.arange(out_size, dtype=np.float64) + 0.5) * scale
    first = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's (int): toward 0
    last = np.minimum((center + support + 0.5).astype(np.int64), in_size)
    count = last - first
    tap = np.arange(taps)
    reach = (tap[None, :] + first[:, None]) - center[:, None] + 0.5
    distance = np.abs(reach * (1.0 / filterscale))
    weights = np.where(distance < 1.0, 1.0 - distance, 0.0)
    weights[tap[None, :] >= count[:, None]] = 0.0
    total = np.zeros(out_size)
    for j in range(taps):  # the C loop's order: ww += w, tap by tap
        total += weights[:, j]
    weights = np.divide(weights, total[:, None], out=weights, where=total[:, None] != 0.0)
    fixed = np.trunc(weights * (1 << PRECISION_BITS) + 0.5).astype(np.int32)  # weights >= 0
    return first, fixed


def _pass(pixels: np.ndarray, first: np.ndarray, fixed: np.ndarray, axis: int) -> np.ndarray:
    """One pass along `axis` (1: columns, 0: rows) of an H x W x C uint8 image. Along the
    columns the image is transposed first and back after (OpenCV's, about a millisecond for a
    1080p window): a tap then reads whole rows of the transposed image, where reading one
    column of three bytes a row is a gather 2-3x slower (the same sums either way)."""
    if axis == 0:
        return _rows(pixels, first, fixed)
    return _transposed(_rows(_transposed(pixels), first, fixed))


CHUNK = 64  # output rows summed at once: their int32 sums stay in the cache between taps


def _rows(pixels: np.ndarray, first: np.ndarray, fixed: np.ndarray) -> np.ndarray:
    """The pass along the rows: output row i = sum over taps j of fixed[i, j] * input row
    (first[i] + j), from a rounding half, shifted back and clipped (Resample.c's)."""
    limit = pixels.shape[0] - 1
    taps = int(np.flatnonzero(fixed.any(axis=0)).max(initial=-1)) + 1  # the rest weigh 0
    out = np.empty((len(first), *pixels.shape[1:]), np.uint8)
    for start in range(0, len(first), CHUNK):
        rows = slice(start, min(len(first), start + CHUNK))
        shape = (rows.stop - rows.start, *pixels.shape[1:])
        acc = np.full(shape, 1 << (PRECISION_BITS - 1), np.int32)
        term = np.empty(shape, np.int32)
        for j in range(taps):
            # A tap past the pixels an output reads has weight 0: any index in range will do.
            index = np.minimum(first[rows] + j, limit)
            np.multiply(pixels[index], fixed[rows, j].reshape(-1, 1, 1), out=term)
            acc += term
        np.right_shift(acc, PRECISION_BITS, out=acc)
        np.clip(acc, 0, 255, out=acc)
        out[rows] = acc
    return out


def _transposed(pixels: np.ndarray) -> np.ndarray:
    """H x W x C to W x H x C, contiguous (OpenCV's transpose for 1 to 4 channels)."""
    channels = pixels.shape[2]
    if channels > 4:
        return np.ascontiguousarray(pixels.transpose(1, 0, 2))
    flipped = cv2.transpose(pixels[:, :, 0] if channels == 1 else pixels)
    return flipped.reshape(pixels.shape[1], pixels.shape[0], channels)


def resize(frame: np.ndarray, width: int, height: int,
           box: tuple[int, int, int, int] | None = None) -> np.ndarray:
    """`frame` (H x W x C uint8) resized to `width` x `height` as Pillow 13's
    `Image.resize((width, height), BILINEAR)` makes it; `box` (left, top, w, h): only that
    window of the result. A side that keeps its size is not resampled (Pillow skips the pass;
    its weights would be the identity). The passes run in Pillow's order (ImagingResampleInner:
    the vertical first when the height loses more than twice the pixels the width loses)."""
    if frame.dtype != np.uint8:  # (the sums and the clip are 8-bit's, as Pillow's "L"/"RGB")
        raise TypeError(f"resample.resize takes 8-bit images, got {frame.dtype}")
    left, top, out_w, out_h = box if box is not None else (0, 0, width, height)
    in_h, in_w = frame.shape[:2]
    pixels = frame if frame.ndim == 3 else frame[:, :, None]
    rows = _window(in_h, height, top, out_h)
    cols = _window(in_w, width, left, out_w)
    pixels = pixels[rows[0]:rows[1], cols[0]:cols[1]]  # only what the window reads
    shrunk = in_h - height
    passes = [(0, rows), (1, cols)] if shrunk > 0 and shrunk > (in_w - width) * 2 else \
        [(1, cols), (0, rows)]
    for axis, (_start, _stop, first, fixed) in passes:
        if first is not None and fixed is not None:
            pixels = _pass(pixels, first, fixed, axis)
    return np.ascontiguousarray(pixels)


def _window(in_size: int, out_size: int, start: int, count: int
            ) -> tuple[int, int, np.ndarray | None, np.ndarray | None]:
    """The input pixels [lo, hi) that outputs [start, start + count) of one side read, and
    their first pixels (from lo) and weights; no weights where the side keeps its size."""
    if in_size == out_size:
        return start, start + count, None, None
    first, fixed = coefficients(in_size, out_size)
    first, fixed = first[start:start + count], fixed[start:start + count]
    lo = int(first.min())
    hi = int(min(in_size, (first + fixed.shape[1]).max()))
    return lo, hi, first - lo, fixed
