"""Frame → input tensor: resize or letterbox, colour order, scale, mean/std, layout, written
into a buffer the caller may reuse. The geometry is returned so results can be mapped back.

Only a stated pre-processing is applied (`image_preprocess`): a model whose config has none
(neither model.yaml nor its ONNX file said) refuses images, naming the keys to set."""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from edged.core.errors import InvalidInput, PreprocessUnknown
from edged.model.config import PreprocessConfig
from edged.model.tensor import TensorSpec
from edged.processing import resample

# What letterbox bars each reused output buffer holds (a stream's pool hands the same few
# back frame after frame): refilled only when the box or the pad value changes. The bars of
# a 640x480 frame in a 640x640 float32 tensor are 1.2 MB of writes, ~8% of a frame's
# pipeline CPU. Keyed by id() with a weak reference that must still be the very array (an
# id, like an address, is reused by a new array with other contents); dropped with it.
_BARS: dict[int, tuple[weakref.ref[np.ndarray], tuple[object, ...]]] = {}
INTERPOLATION = {"linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA,
                 "nearest": cv2.INTER_NEAREST, "cubic": cv2.INTER_CUBIC,
                 "lanczos": cv2.INTER_LANCZOS4}
ROUNDING: dict[str, Callable[[float], int]] = {"round": round, "floor": math.floor,
                                               "ceil": math.ceil}
KEYS = ("resize", "resize_short", "crop", "crop_offset", "keep_ratio", "pad", "pad_value",
        "color", "scale", "mean", "std", "layout", "interpolation", "rounding")


@dataclass(frozen=True)
class Geometry:
    """Where the frame landed in the tensor: tensor = frame * scale + (pad_x, pad_y)."""

    scale_x: float
    scale_y: float
    pad_x: int
    pad_y: int
    frame_size: tuple[int, int]  # width, height
    tensor_size: tuple[int, int] | None = None  # the input tensor's width, height


def image_preprocess(cfg: PreprocessConfig | None, model: str, spec: TensorSpec,
                     batched: bool) -> PreprocessConfig:
    """The pre-processing to apply to an image for `model`'s input `spec`: the stated one.
    PreprocessUnknown when none is (nothing is guessed), InvalidInput when the stated one
    cannot make a tensor this input takes."""
    if cfg is None:
        raise PreprocessUnknown(
            f"{model}: no pre-processing is known for images (neither model.yaml nor the ONNX "
            f"file says how an image becomes {spec.name} {list(spec.shape)}), and edged does "
            f"not guess one: set `preprocess:` in the model's model.yaml (keys: "
            f"{', '.join(KEYS)}), or send tensors")
    why = mismatch(cfg, spec, batched)
    if why is not None:
        raise InvalidInput(f"{model}: {why}")
    return cfg


def mismatch(cfg: PreprocessConfig, spec: TensorSpec, batched: bool) -> str | None:
    """Why the tensors `cfg` makes cannot feed `spec` (its layout, channels or fixed size),
    or None when they can."""
    dims = tuple(spec.shape[1:] if batched else spec.shape)
    if len(dims) != 3:
        return (f"input {spec.name} {list(spec.shape)} is not an image input (C, H, W or "
                f"H, W, C{' after the batch dim' if batched else ''}); send tensors")
    channels, height, width = dims if cfg.layout == "nchw" else (dims[2], dims[0], dims[1])
    cropped = _crop_mismatch(cfg, (cfg.resize[1], cfg.resize[0]) if cfg.resize else
                             (height, width))
    if cropped is not None:
        return cropped
    made = 1 if cfg.color == "gray" else 3
    given = f"preprocess (layout: {cfg.layout}, color: {cfg.color}) makes {made}-channel " \
            f"{cfg.layout.upper()} tensors, but input {spec.name} is {list(spec.shape)}"
    if channels > 0 and channels != made:
        other = dims[0] if cfg.layout == "nhwc" else dims[2]
        hint = f"; set preprocess.layout: {'nhwc' if cfg.layout == 'nchw' else 'nchw'}" \
            if other == made else ""
        return given + hint
    if cfg.resize is not None and (height, width) != (cfg.resize[1], cfg.resize[0]) and \
            min(height, width) > 0:
        return given + f"; preprocess.resize {cfg.resize} is not its {width}x{height}"
    return None


def _crop_mismatch(cfg: PreprocessConfig, size: tuple[int, int]) -> str | None:
    """Why `resize_short` and `crop` cannot make a tensor of `size` (height, width)."""
    if cfg.resize_short is not None and cfg.crop != "center":
        return "preprocess.resize_short needs crop: center (the short side alone leaves the " \
               "tensor's size to the frame's shape)"
    if cfg.crop == "center" and cfg.keep_ratio:
        return "preprocess.crop: center and keep_ratio: true exclude each other (a crop " \
               "cuts, a letterbox pads)"
    if cfg.resize_short is not None and min(size) > 0 and cfg.resize_short < max(size):
        return f"preprocess.resize_short {cfg.resize_short} is shorter than the " \
               f"{size[1]}x{size[0]} the centre crop cuts"
    return None


def target_size(cfg: PreprocessConfig, spec: TensorSpec, frame: np.ndarray) -> tuple[int, int]:
    """(width, height) of the tensor: the config's, else the input's own, else the frame's."""
    if cfg.resize is not None:
        return cfg.resize[0], cfg.resize[1]
    dims = spec.shape[-2:] if cfg.layout == "nchw" else spec.shape[-3:-1]
    height, width = dims
    if height > 0 and width > 0:
        return width, height
    return frame.shape[1], frame.shape[0]


def size_inputs(specs: Sequence[TensorSpec], tensor: np.ndarray, layout: str,
                batched: bool) -> dict[str, np.ndarray]:
    """The inputs beside the image that say its size: D-FINE's and RT-DETR's deploy exports
    take `orig_target_sizes` [N, 2] (width, height) and scale their boxes by it. edged feeds
    the tensor's own size, so boxes come out in tensor pixels and map back to the frame as
    every other head's do. `tensor` is the image input as built (a batch of one)."""
    height, width = tensor.shape[-2:] if layout == "nchw" else tensor.shape[-3:-1]
    found = {}
    for spec in specs[1:]:
        if is_size_input(spec, batched):
            dims = spec.shape[1:] if batched else spec.shape
            shape = ([1] if batched else []) + [1] * (len(dims) - 1) + [2]
            found[spec.name] = np.array([width, height], spec.dtype).reshape(shape)
    return found


def is_size_input(spec: TensorSpec, batched: bool) -> bool:
    """[N, 2] (or an unbatched [1, 2] or [2]) named as a size."""
    dims = tuple(spec.shape[1:] if batched else spec.shape)
    return "size" in spec.name.lower() and dims in ((2,), (1, 2)) and spec.dtype.kind in "iuf"


def tensor_shape(cfg: PreprocessConfig, spec: TensorSpec,
                 frame: np.ndarray) -> tuple[int, int, int, int]:
    """The shape `preprocess` gives `frame`: a batch of one in the model's layout."""
    width, height = target_size(cfg, spec, frame)
    channels = 1 if cfg.color == "gray" else 3
    return (1, channels, height, width) if cfg.layout == "nchw" else (1, height, width, channels)


def preprocess(frame: np.ndarray, cfg: PreprocessConfig, spec: TensorSpec,
               out: np.ndarray | None = None) -> tuple[np.ndarray, Geometry]:
    """One frame (H x W x 3 BGR, or H x W gray, uint8) as a batch of one for `spec`, written
    into `out` when it has the right shape and dtype (else into a new array). The resized
    uint8 pixels go straight into the tensor, channel by channel: no float intermediates. A
    float32 NCHW plane with no mean to take off (YOLO's 0..1 input) is a widening copy and an
    in-place multiply, two contiguous SIMD loops; with a mean, OpenCV's scale-and-add does it
    in one pass. 640x480 letterboxed into 640x640, whole `preprocess`, medians of 10 x 200
    alternating (AMD EPYC VM, 2026-11-24): no mean 473 us (529 through scale-and-add); with
    ImageNet's mean, scale-and-add 500 us (566 as copy, multiply, subtract)."""
    if frame.ndim == 2:
        frame = frame[:, :, None]
    if frame.ndim != 3 or frame.shape[2] not in (1, 3) or 0 in frame.shape:
        raise InvalidInput(f"frame of shape {frame.shape} is not an image")
    shape = tensor_shape(cfg, spec, frame)
    width, height = (shape[3], shape[2]) if cfg.layout == "nchw" else (shape[2], shape[1])
    channels = 1 if cfg.color == "gray" else 3
    if out is None or out.shape != shape or out.dtype != spec.dtype:
        out = np.empty(shape, spec.dtype)
    image = out[0].transpose(1, 2, 0) if cfg.layout == "nchw" else out[0]  # H x W x C view
    std = np.asarray(cfg.std, np.float32) * np.ones(channels, np.float32)
    gain = np.float32(cfg.scale) / std  # x * (scale / std) - mean / std
    offset = np.asarray(cfg.mean, np.float32) * np.ones(channels, np.float32) / std
    frame_h, frame_w = frame.shape[:2]
    if cfg.keep_ratio:
        ratio = min(width / frame_w, height / frame_h)  # the exporters' float arithmetic
        whole = ROUNDING[cfg.rounding]
        new_w = min(width, max(1, whole(frame_w * ratio)))
        new_h = min(height, max(1, whole(frame_h * ratio)))
        pad_x, pad_y = ((width - new_w) // 2, (height - new_h) // 2) if cfg.pad == "center" \
            else (0, 0)
        value = np.float32(cfg.pad_value) * gain - offset
        box = (pad_x, pad_y, new_w, new_h)
        bars = (out.shape, out.dtype.str, cfg.layout, box, value.tobytes())
        held = _BARS.get(id(out))
        if held is None or held[0]() is not out or held[1] != bars:
            _fill_outside(out, image, cfg.layout, value, box)
            key = id(out)
            _BARS[key] = (weakref.ref(out, lambda _gone: _BARS.pop(key, None)), bars)
        region = image[pad_y:pad_y + new_h, pad_x:pad_x + new_w]
        # Boxes go back through the ratio, as the exporters' own code maps them (Ultralytics'
        # scale_boxes, YOLOX's demo), not through the whole-pixel size.
        geometry = Geometry(ratio, ratio, pad_x, pad_y, (frame_w, frame_h), (width, height))
    elif cfg.crop == "center":
        region = image
        resized, geometry = _resize_crop(frame, cfg, width, height)
    else:
        new_w, new_h, region = width, height, image
        geometry = Geometry(width / frame_w, height / frame_h, 0, 0, (frame_w, frame_h),
                            (width, height))
    if cfg.crop != "center":
        resized = _resize(frame, new_w, new_h, cfg.interpolation)
    if out.dtype == np.float32 and cfg.layout == "nchw" and resized.dtype == np.uint8:
        for c, plane in enumerate(_planes(resized, cfg.color)):
            target = region[:, :, c]  # the plane's rows in the NCHW tensor
            if offset[c]:  # one pass: OpenCV's SIMD scale-and-add
                written = cv2.addWeighted(plane, float(gain[c]), plane, 0.0, -float(offset[c]),
                                          dst=target, dtype=cv2.CV_32F)
                if not np.shares_memory(written, target):  # OpenCV could not write in place
                    target[...] = written
                continue
            np.copyto(target, plane, casting="unsafe")  # uint8 -> float32, SIMD
            if gain[c] != 1:
                np.multiply(target, gain[c], out=target)
        return out, geometry
    pixels = _colour(resized, cfg.color)
    if np.issubdtype(out.dtype, np.floating):
        for c in range(channels):  # a plane at a time: NCHW planes are contiguous (4x faster)
            plane = region[:, :, c]
            np.multiply(pixels[:, :, c], gain[c], out=plane, casting="unsafe")
            np.subtract(plane, offset[c], out=plane, casting="unsafe")
    else:  # integer inputs (quantised models fed raw pixels): round once at the end
        region[...] = np.clip(np.rint(pixels * gain - offset), *_limits(out.dtype))
    return out, geometry


def _resize_crop(frame: np.ndarray, cfg: PreprocessConfig, width: int, height: int
                 ) -> tuple[np.ndarray, Geometry]:
    """The short side resized to `resize_short`, or the frame as it is, then the middle
    `width` x `height` cut out. Sizes: with `rounding: round` PaddleClas' ResizeImage
    (`percent = short / min(w, h)`, each side `int(round(side * percent))`); with floor
    torchvision's Resize(int) (the short side S, the long `int(S * long / short)`: the exact
    quotient's floor, which that float expression always is for image sizes), ceil alike.
    Offsets: `(w - W) // 2` (PaddleClas' CropImage) or, with `crop_offset: round`,
    `int(round((w - W) / 2))` (torchvision's CenterCrop). Pillow's resampler computes only
    the window. The geometry maps the cut back: the crop's offset is a negative pad."""
    frame_h, frame_w = frame.shape[:2]
    if cfg.resize_short is not None:
        short = min(frame_w, frame_h)
        if cfg.rounding == "round":
            percent = float(cfg.resize_short) / short
            new_w, new_h = max(1, round(frame_w * percent)), max(1, round(frame_h * percent))
        else:
            new_w, new_h = (_short_scaled(side, cfg.resize_short, short, cfg.rounding)
                            for side in (frame_w, frame_h))
        scale_x, scale_y = new_w / frame_w, new_h / frame_h
    else:
        new_w, new_h, scale_x, scale_y = frame_w, frame_h, 1.0, 1.0
    if new_w < width or new_h < height:
        raise InvalidInput(f"a {frame_w}x{frame_h} frame resized to {new_w}x{new_h} is smaller "
                           f"than the {width}x{height} that preprocess.crop: center cuts")
    if cfg.crop_offset == "round":  # Python's round: half to even, as torchvision's
        left, top = round((new_w - width) / 2.0), round((new_h - height) / 2.0)
    else:
        left, top = (new_w - width) // 2, (new_h - height) // 2
    if cfg.interpolation == "pillow_bilinear":
        cut = resample.resize(frame, new_w, new_h, (left, top, width, height))
    else:
        resized = _resize(frame, new_w, new_h, cfg.interpolation)
        cut = np.ascontiguousarray(resized[top:top + height, left:left + width])
    return cut, Geometry(scale_x, scale_y, -left, -top, (frame_w, frame_h), (width, height))


def _short_scaled(side: int, short_to: int, short: int, rounding: str) -> int:
    """`side` scaled by short_to / short in integers: the short side is `short_to` itself."""
    if rounding == "ceil":
        return max(1, -(-side * short_to // short))
    return max(1, side * short_to // short)


def _fill_outside(out: np.ndarray, image: np.ndarray, layout: str, value: np.ndarray,
                  box: tuple[int, int, int, int]) -> None:
    """The letterbox bars only (the frame's region is written next): NCHW planes band by
    band, contiguous, instead of every pixel through the strided H x W x C view (~5x)."""
    x, y, w, h = box
    if layout != "nchw":
        image[...] = value
        return
    for c, plane in enumerate(out[0]):
        plane[:y] = value[c]
        plane[y + h:] = value[c]
        plane[y:y + h, :x] = value[c]
        plane[y:y + h, x + w:] = value[c]


def _planes(pixels: np.ndarray, color: str) -> list[np.ndarray]:
    """The uint8 channel planes (contiguous) in the model's channel order."""
    if color == "gray":
        return [pixels[:, :, 0] if pixels.shape[2] == 1 else
                cv2.cvtColor(pixels, cv2.COLOR_BGR2GRAY)]
    if pixels.shape[2] == 1:
        return [np.ascontiguousarray(pixels[:, :, 0])] * 3
    blue, green, red = cv2.split(pixels)
    return [red, green, blue] if color == "rgb" else [blue, green, red]


def _limits(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _resize(frame: np.ndarray, width: int, height: int, interpolation: str) -> np.ndarray:
    if frame.shape[1] == width and frame.shape[0] == height:
        return frame
    if interpolation == "pillow_bilinear":
        return resample.resize(frame, width, height)
    if interpolation == "auto":
        smaller = width * height < frame.shape[0] * frame.shape[1]
        flag = cv2.INTER_AREA if smaller else cv2.INTER_LINEAR
    else:
        flag = INTERPOLATION[interpolation]
    resized = cv2.resize(frame, (width, height), interpolation=flag)
    return resized if resized.ndim == 3 else resized[:, :, None]


def _colour(pixels: np.ndarray, color: str) -> np.ndarray:
    """uint8 pixels in the model's channel order; a view where no conversion is needed."""
    if color == "gray":
        if pixels.shape[2] == 1:
            return pixels
        return cv2.cvtColor(pixels, cv2.COLOR_BGR2GRAY)[:, :, None]
    if pixels.shape[2] == 1:
        return np.broadcast_to(pixels, (*pixels.shape[:2], 3))
    return pixels[:, :, ::-1] if color == "rgb" else pixels
