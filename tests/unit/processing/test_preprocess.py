"""Frames to tensors: sizes, letterbox geometry, colour order, normalisation, layout."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edged.core.errors import InvalidInput
from edged.model.config import PreprocessConfig
from edged.model.tensor import TensorSpec
from edged.processing.pre import preprocess

SPEC = TensorSpec("x", np.dtype(np.float32), (-1, 3, 4, 8))


def test_preprocess_when_frame_matches_input_scales_and_reorders_to_rgb_nchw() -> None:
    frame = np.zeros((4, 8, 3), np.uint8)
    frame[..., 0] = 255  # blue, in OpenCV's BGR
    tensor, geometry = preprocess(frame, PreprocessConfig(), SPEC)
    assert tensor.shape == (1, 3, 4, 8) and tensor.dtype == np.float32
    assert (tensor[0, 2] == 1.0).all() and (tensor[0, :2] == 0.0).all()  # blue is last in RGB
    assert (geometry.scale_x, geometry.pad_x) == (1.0, 0)


def test_preprocess_when_keeping_ratio_letterboxes_and_reports_the_geometry() -> None:
    frame = np.full((8, 8, 3), 255, np.uint8)
    cfg = PreprocessConfig(keep_ratio=True, pad_value=0.0)
    tensor, geometry = preprocess(frame, cfg, SPEC)
    assert (geometry.scale_x, geometry.scale_y, geometry.pad_x, geometry.pad_y) == (0.5, 0.5, 2, 0)
    assert (tensor[0, :, :, 2:6] == 1.0).all() and (tensor[0, :, :, :2] == 0.0).all()
    tensor, geometry = preprocess(frame, PreprocessConfig(keep_ratio=True, pad="end"), SPEC)
    assert geometry.pad_x == 0 and (tensor[0, :, :, 4:] == 0.0).all()


def test_preprocess_when_mean_std_and_nhwc_given_normalises_per_channel() -> None:
    frame = np.full((2, 2, 3), 51, np.uint8)
    cfg = PreprocessConfig(mean=[0.5, 0.5, 0.5], std=[0.5, 0.25, 0.5], layout="nhwc",
                           resize=[2, 2])
    tensor, _ = preprocess(frame, cfg, TensorSpec("x", np.dtype(np.float32), (1, -1, -1, 3)))
    assert tensor.shape == (1, 2, 2, 3)
    np.testing.assert_allclose(tensor[0, 0, 0], [(0.2 - 0.5) / 0.5, (0.2 - 0.5) / 0.25,
                                                 (0.2 - 0.5) / 0.5], rtol=1e-6)


def test_preprocess_when_gray_requested_gives_one_channel() -> None:
    frame = np.full((4, 8, 3), 100, np.uint8)
    spec = TensorSpec("x", np.dtype(np.float32), (1, 1, 4, 8))
    tensor, _ = preprocess(frame, PreprocessConfig(color="gray", scale=1.0), spec)
    assert tensor.shape == (1, 1, 4, 8)
    np.testing.assert_allclose(tensor, 100.0, rtol=1e-5)


@pytest.mark.parametrize("shape", [(4, 8, 4), (0, 8, 3), (4,)])
def test_preprocess_when_frame_is_not_an_image_raises_invalid_input(shape: tuple[int, ...]) -> None:
    with pytest.raises(InvalidInput, match="not an image"):
        preprocess(np.zeros(shape, np.uint8), PreprocessConfig(), SPEC)


def _reference(frame: np.ndarray, cfg: PreprocessConfig) -> np.ndarray:
    """The plain float formula, for frames already at the tensor's size."""
    pixels = frame[:, :, ::-1] if cfg.color == "rgb" else frame
    values = (pixels.astype(np.float64) * cfg.scale - np.array(cfg.mean)) / np.array(cfg.std)
    return (values.transpose(2, 0, 1) if cfg.layout == "nchw" else values)[None]


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_preprocess_when_given_a_buffer_writes_into_it_and_matches_the_formula(
        layout: str, color: str) -> None:
    frame = np.random.default_rng(0).integers(0, 256, (4, 8, 3), dtype=np.uint8)
    cfg = PreprocessConfig(color=color, layout=layout, mean=[0.485, 0.456, 0.406],  # type: ignore[arg-type]
                           std=[0.229, 0.224, 0.225])
    shape = (-1, 3, 4, 8) if layout == "nchw" else (-1, 4, 8, 3)
    spec = TensorSpec("x", np.dtype(np.float32), shape)
    buffer = np.full((1, *shape[1:]), np.nan, np.float32)
    tensor, _ = preprocess(frame, cfg, spec, buffer)
    assert tensor is buffer
    np.testing.assert_allclose(tensor, _reference(frame, cfg), rtol=1e-5, atol=1e-5)
    other = np.empty((1, 3, 2, 2), np.float32)  # the wrong shape: a new array, untouched buffer
    assert preprocess(frame, cfg, spec, other)[0] is not other


def test_preprocess_when_input_is_uint8_rounds_and_clips() -> None:
    frame = np.full((4, 8, 3), 200, np.uint8)
    spec = TensorSpec("x", np.dtype(np.uint8), (1, 3, 4, 8))
    tensor, _ = preprocess(frame, PreprocessConfig(scale=1.5), spec)
    assert tensor.dtype == np.uint8 and (tensor == 255).all()
    tensor, _ = preprocess(frame, PreprocessConfig(scale=0.5), spec)
    assert (tensor == 100).all()


@pytest.mark.parametrize("color", ["rgb", "bgr", "gray"])
@pytest.mark.parametrize("size", [(6, 8), (8, 5)])  # bars left/right, then top/bottom
def test_preprocess_when_letterboxing_into_a_reused_buffer_writes_every_element(
        color: str, size: tuple[int, int]) -> None:
    """The bars and the frame's region together cover the whole tensor (a NaN-filled buffer
    keeps no NaN), with the formula's values: pad value outside, pixels inside."""
    frame = np.random.default_rng(1).integers(0, 256, (*size, 3), dtype=np.uint8)
    cfg = PreprocessConfig(color=color, keep_ratio=True, pad_value=114,  # type: ignore[arg-type]
                           mean=[0.5, 0.4, 0.3] if color != "gray" else [0.5],
                           std=[0.2, 0.25, 0.3] if color != "gray" else [0.2])
    channels = 1 if color == "gray" else 3
    spec = TensorSpec("x", np.dtype(np.float32), (-1, channels, 8, 8))
    buffer = np.full((1, channels, 8, 8), np.nan, np.float32)
    tensor, g = preprocess(frame, cfg, spec, buffer)
    assert tensor is buffer and not np.isnan(tensor).any()
    h, w = round(size[0] * g.scale_y), round(size[1] * g.scale_x)
    inside = tensor[0, :, g.pad_y:g.pad_y + h, g.pad_x:g.pad_x + w]
    if size == (8, 5):
        assert g.pad_x > 0 and w < 8
    else:
        assert g.pad_y > 0 and h < 8
    pad = (114 / 255 - np.array(cfg.mean)) / np.array(cfg.std)
    outside = tensor[0].copy()
    outside[:, g.pad_y:g.pad_y + h, g.pad_x:g.pad_x + w] = np.nan
    for c in range(channels):
        plane = outside[c][~np.isnan(outside[c])]
        np.testing.assert_allclose(plane, pad[c], rtol=1e-5)
    resized = cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA
                         if w * h < size[0] * size[1] else cv2.INTER_LINEAR)
    if color == "gray":
        resized = cv2.cvtColor(resized, cv2.COLOR_BGR2GRAY)[:, :, None]
    expected = _reference(resized, cfg)[0]
    np.testing.assert_allclose(inside, expected, rtol=1e-5, atol=1e-5)


def test_preprocess_when_a_buffer_comes_back_refills_its_bars_only_when_they_change() -> None:
    """A stream's buffer keeps its letterbox bars from frame to frame (they are not rewritten),
    and gets new ones when the frame's shape or the pad value changes; another buffer, even
    one at a reused address, is always filled."""
    rng = np.random.default_rng(2)
    spec = TensorSpec("x", np.dtype(np.float32), (-1, 3, 8, 8))
    cfg = PreprocessConfig(keep_ratio=True, pad_value=114)
    wide = rng.integers(0, 256, (4, 8, 3), dtype=np.uint8)
    buffer = np.zeros((1, 3, 8, 8), np.float32)
    first, g = preprocess(wide, cfg, spec, buffer)
    bar = first[0, :, :g.pad_y].copy()
    buffer[0, :, :g.pad_y] = -7.0  # not something preprocess writes again for this geometry
    again, _ = preprocess(wide, cfg, spec, buffer)
    assert (again[0, :, :g.pad_y] == -7.0).all()  # kept, not rewritten
    other = PreprocessConfig(keep_ratio=True, pad_value=0)
    refilled, _ = preprocess(wide, other, spec, buffer)  # another pad value: new bars
    assert (refilled[0, :, :g.pad_y] == 0.0).all()
    tall = rng.integers(0, 256, (8, 4, 3), dtype=np.uint8)
    turned, g2 = preprocess(tall, cfg, spec, buffer)  # another geometry: bars on the sides
    np.testing.assert_allclose(turned[0, :, :, :g2.pad_x], np.broadcast_to(
        bar[:, :1, :1], turned[0, :, :, :g2.pad_x].shape), rtol=1e-6)
    fresh = np.full((1, 3, 8, 8), np.nan, np.float32)  # a new buffer: filled whatever it holds
    assert not np.isnan(preprocess(wide, cfg, spec, fresh)[0]).any()
