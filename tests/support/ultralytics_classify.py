"""A reference port of what Ultralytics' ClassificationPredictor does to a frame before an
exported classifier sees it (ultralytics 8.4.190, read from its wheel; torch, torchvision and
Pillow are not installed here), written apart from edged's code and more plainly:

- `classify_transforms(imgsz)`: a square imgsz is `Resize(S)` + `CenterCrop(S)`, a
  non-square one `Resize((h, w))`, both `InterpolationMode.BILINEAR`, then `ToTensor` and
  `Normalize(mean 0, std 1)`;
- torchvision's `Resize(S)` on a PIL image (`_compute_resized_output_size`): the short side S,
  the long `int(S * long / short)`; no resize when the size is already that;
- `CenterCrop`: offsets `int(round((h - S) / 2.0))`;
- Pillow 13's `Image.resize(size, BILINEAR)` (src/libImaging/Resample.c): per output pixel,
  triangle weights widened by the shrink factor, normalised, in 22-bit fixed point; two
  passes with a uint8 image between them, the vertical first when the height loses more than
  twice the pixels the width loses. Here one scalar loop per output pixel builds a dense
  weight matrix and a matrix product sums it (edged gathers tap by tap);
- `ToTensor`: RGB, float32 / 255; `Normalize((0,0,0), (1,1,1))`: (x - 0) / 1.

`PILLOW_DIGESTS` pins the resize to Pillow 13.0.0 itself: sha256 of its output for frames made
by `pattern`, measured with the real Pillow (pip download pillow==13.0.0, run once beside
this file); the unit tests check both this port and edged's against them.
"""

from __future__ import annotations

import hashlib

import numpy as np

BITS = 22

# (in_w, in_h, out_w, out_h) -> sha256 of Pillow 13.0.0's
# np.asarray(Image.fromarray(pattern(in_w, in_h)).resize((out_w, out_h), BILINEAR)).tobytes()
PILLOW_DIGESTS: dict[tuple[int, int, int, int], str] = {
    (640, 480, 298, 224): "ad43c2e7c116954fccf8b6389580b42ab9055d624db4a2de402b73c9a459f678",
    (480, 640, 224, 298): "efb0a7f7c96ce6a2e0ffb5813b82bf8e48772fd7711de8c616bb71003b662ec4",
    (1280, 720, 398, 224): "558c20ec60c71d3c284940bd35597a8df7ef1a7ba274565b47bbcb6aa6142227",
    (333, 517, 224, 347): "a9de8637f3b358dc099dd4ce71dc2c8247c2802be847a24c596286e8537a82d0",
    (120, 400, 224, 746): "823518c9f43be9b3a49da508bc7ef854942168bcfd4c5c7ab758b21534ab1697",
    (100, 300, 224, 224): "d188999eb7003e6e19d6e342291a9d63c780fc0811ceba1853c7d19db3481aee",
    (64, 48, 298, 224): "f9fa56ce01c50453498aaa1c07acbbdb8617c3fea7216831b396627cccf75507",
    (300, 300, 224, 224): "172ad80bc9a4a4d56e35892d58fcb471dc22196751cf8a259a2bd641412173e6",
    (37, 23, 320, 224): "41fb685819a62af18e9f7fe41bec9b39ff425c2aca09b0741266166b39d1dd57",
    (5, 700, 224, 224): "0abad5c7188afff3ec272dec50b72b9db55311ebcf3888b5f9cbc1a56aeca2fd",
    (701, 3, 11, 2): "582ec040b9ad981e578c1e37a1eff5243b48004b671eba83dc40f7a482cb2946",
}


def pattern(width: int, height: int) -> np.ndarray:
    """A deterministic RGB frame with edges, gradients and texture (no RNG: the same bytes on
    every numpy)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.int64)
    red = (x * 7 + y * 3) % 256
    green = ((x // 5 + y // 3) % 2) * 200 + (x * y) % 37
    blue = (x * x + 3 * y * y + x * y) % 251
    return np.stack([red, green, blue], axis=-1).astype(np.uint8)


def _weights(in_size: int, out_size: int) -> np.ndarray:
    """Resample.c's precompute_coeffs + normalize_coeffs_8bpc as a dense [out, in] matrix."""
    scale = in_size / out_size
    filterscale = max(scale, 1.0)
    support = 1.0 * filterscale
    matrix = np.zeros((out_size, in_size), np.int64)
    for xx in range(out_size):
        center = (xx + 0.5) * scale
        xmin = max(int(center - support + 0.5), 0)
        xmax = min(int(center + support + 0.5), in_size) - xmin
        weights = []
        for x in range(xmax):
            distance = abs((x + xmin - center + 0.5) * (1.0 / filterscale))
            weights.append(1.0 - distance if distance < 1.0 else 0.0)
        total = 0.0
        for w in weights:
            total += w
        for x, w in enumerate(weights):
            if total != 0.0:
                w /= total
            matrix[xx, xmin + x] = int(0.5 + w * (1 << BITS))
    return matrix


def _apply(pixels: np.ndarray, matrix: np.ndarray, axis: int) -> np.ndarray:
    moved = np.moveaxis(pixels.astype(np.int64), axis, -1)
    summed = moved @ matrix.T + (1 << (BITS - 1))
    return np.moveaxis(np.clip(summed >> BITS, 0, 255).astype(np.uint8), -1, axis)


def pil_bilinear(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Pillow 13's `Image.fromarray(image).resize((width, height), BILINEAR)` (H x W x C)."""
    in_h, in_w = image.shape[:2]
    if (in_w, in_h) == (width, height):
        return image.copy()
    vertical_first = in_h - height > 0 and in_h - height > (in_w - width) * 2
    out = image
    for axis in ((0, 1) if vertical_first else (1, 0)):
        size, target = (in_h, height) if axis == 0 else (in_w, width)
        if size != target:
            out = _apply(out, _weights(size, target), axis)
    return out


def digest(image: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


def classify_tensor(frame_bgr: np.ndarray, imgsz: tuple[int, int]) -> np.ndarray:
    """The [1, 3, h, w] float32 tensor ClassificationPredictor feeds an export of `imgsz`
    (height, width), from an OpenCV BGR frame."""
    rgb = np.ascontiguousarray(frame_bgr[:, :, ::-1])
    height, width = imgsz
    in_h, in_w = rgb.shape[:2]
    if height == width:
        short, long = (in_w, in_h) if in_w <= in_h else (in_h, in_w)
        new_short, new_long = height, int(height * long / short)
        new_w, new_h = (new_short, new_long) if in_w <= in_h else (new_long, new_short)
    else:
        new_w, new_h = width, height
    resized = rgb if (new_w, new_h) == (in_w, in_h) else pil_bilinear(rgb, new_w, new_h)
    top = round((new_h - height) / 2.0)  # torchvision's int(round(...)): round gives an int
    left = round((new_w - width) / 2.0)
    cut = resized[top:top + height, left:left + width]
    tensor = cut.transpose(2, 0, 1).astype(np.float32) / np.float32(255)
    tensor = (tensor - np.float32(0.0)) / np.float32(1.0)
    return tensor[None]


def squashed_tensor(frame_bgr: np.ndarray, imgsz: tuple[int, int]) -> np.ndarray:
    """What edged fed Ultralytics' classifiers before: the whole frame resized to imgsz
    (OpenCV INTER_AREA when shrinking), RGB, / 255."""
    import cv2

    height, width = imgsz
    flag = cv2.INTER_AREA if width * height < frame_bgr.shape[0] * frame_bgr.shape[1] else \
        cv2.INTER_LINEAR
    resized = cv2.resize(frame_bgr, (width, height), interpolation=flag)[:, :, ::-1]
    return (resized.transpose(2, 0, 1).astype(np.float32) / np.float32(255))[None]

