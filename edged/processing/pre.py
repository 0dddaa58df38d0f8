"""Frame → input tensor: resize or letterbox, colour order, scale, mean/std, layout, written
into a buffer the caller may reuse. The geometry is returned so results can be mapped back."""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from edged.backends import TensorSpec
from edged.errors import InvalidInput
from edged.model_config import PreprocessConfig


@dataclass(frozen=True)
class Geometry:
    """Where the frame landed in the tensor: tensor = frame * scale + (pad_x, pad_y)."""

    scale_x: float
    scale_y: float
    pad_x: int
    pad_y: int
    frame_size: tuple[int, int]  # width, height


def target_size(cfg: PreprocessConfig, spec: TensorSpec, frame: np.ndarray) -> tuple[int, int]:
    """(width, height) of the tensor: the config's, else the input's own, else the frame's."""
    if cfg.resize is not None:
        return cfg.resize[0], cfg.resize[1]
    dims = spec.shape[-2:] if cfg.layout == "nchw" else spec.shape[-3:-1]
    height, width = dims
    if height > 0 and width > 0:
        return width, height
    return frame.shape[1], frame.shape[0]


def preprocess(frame: np.ndarray, cfg: PreprocessConfig, spec: TensorSpec,
               out: np.ndarray | None = None) -> tuple[np.ndarray, Geometry]:
    """One frame (H x W x 3 BGR, or H x W gray, uint8) as a batch of one for `spec`."""
    if frame.ndim == 2:
        frame = frame[:, :, None]
    if frame.ndim != 3 or frame.shape[2] not in (1, 3) or 0 in frame.shape:
        raise InvalidInput(f"frame of shape {frame.shape} is not an image")
    width, height = target_size(cfg, spec, frame)
    resized, geometry = _fit(frame, cfg, width, height)
    pixels = _colour(resized, cfg.color)
    channels = pixels.shape[2]
    mean = np.asarray(cfg.mean, np.float32) * np.ones(channels, np.float32)
    std = np.asarray(cfg.std, np.float32) * np.ones(channels, np.float32)
    # One fused pass: x * (scale / std) - mean / std.
    values = pixels.astype(np.float32) * (np.float32(cfg.scale) / std) - mean / std
    tensor = values.transpose(2, 0, 1) if cfg.layout == "nchw" else values
    shape = (1, *tensor.shape)
    if out is None or out.shape != shape or out.dtype != spec.dtype:
        out = np.empty(shape, spec.dtype)
    out[0] = tensor
    return out, geometry


def _fit(frame: np.ndarray, cfg: PreprocessConfig, width: int,
         height: int) -> tuple[np.ndarray, Geometry]:
    frame_h, frame_w = frame.shape[:2]
    if not cfg.keep_ratio:
        resized = _resize(frame, width, height)
        return resized, Geometry(width / frame_w, height / frame_h, 0, 0, (frame_w, frame_h))
    ratio = min(width / frame_w, height / frame_h)
    new_w, new_h = max(1, round(frame_w * ratio)), max(1, round(frame_h * ratio))
    pad_x, pad_y = ((width - new_w) // 2, (height - new_h) // 2) if cfg.pad == "center" \
        else (0, 0)
    canvas = np.full((height, width, frame.shape[2]), cfg.pad_value, np.float32)
    canvas[pad_y:pad_y + new_h, pad_x:pad_x + new_w] = _resize(frame, new_w, new_h)
    return canvas, Geometry(new_w / frame_w, new_h / frame_h, pad_x, pad_y, (frame_w, frame_h))


def _resize(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    if frame.shape[1] == width and frame.shape[0] == height:
        return frame
    smaller = width * height < frame.shape[0] * frame.shape[1]
    resized = cv2.resize(frame, (width, height),
                         interpolation=cv2.INTER_AREA if smaller else cv2.INTER_LINEAR)
    return resized if resized.ndim == 3 else resized[:, :, None]


def _colour(pixels: np.ndarray, color: str) -> np.ndarray:
    if color == "gray":
        if pixels.shape[2] == 1:
            return pixels
        gray = pixels.astype(np.float32) @ np.array([0.114, 0.587, 0.299], np.float32)  # BGR
        return gray[:, :, None]
    if pixels.shape[2] == 1:
        pixels = np.repeat(pixels, 3, axis=2)
    return pixels[:, :, ::-1] if color == "rgb" else pixels
