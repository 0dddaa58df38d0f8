"""Only a stated pre-processing is applied, with the exporter's resize rule: the door from an
image to a tensor (`image_preprocess`), what a stated one cannot feed (`mismatch`), the scaled
size's rounding and the interpolation."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edged.core.errors import InvalidInput, PreprocessUnknown
from edged.model.config import PreprocessConfig
from edged.model.tensor import TensorSpec
from edged.processing.pre import image_preprocess, mismatch, preprocess

NHWC = TensorSpec("input_0", np.dtype(np.float32), (-1, 224, 224, 3))
NCHW = TensorSpec("x", np.dtype(np.float32), (-1, 3, 416, 416))


def test_image_preprocess_when_none_is_stated_refuses_naming_the_keys() -> None:
    with pytest.raises(PreprocessUnknown) as caught:
        image_preprocess(None, "plates:1", NCHW, batched=True)
    assert caught.value.code == "preprocess_unknown" and isinstance(caught.value, InvalidInput)
    message = str(caught.value)
    assert message.startswith("plates:1: no pre-processing is known for images")
    assert "x [-1, 3, 416, 416]" in message and "interpolation, rounding" in message


def test_image_preprocess_when_stated_returns_it_as_it_is() -> None:
    cfg = PreprocessConfig(layout="nhwc", resize=[224, 224])
    assert image_preprocess(cfg, "nsfw:1", NHWC, batched=True) is cfg


@pytest.mark.parametrize(("cfg", "spec", "batched", "said"), [
    (PreprocessConfig(resize=[224, 224]), NHWC, True,
     "makes 3-channel NCHW tensors, but input input_0 is [-1, 224, 224, 3]; set "
     "preprocess.layout: nhwc"),
    (PreprocessConfig(color="gray"), NCHW, True, "makes 1-channel NCHW tensors"),
    (PreprocessConfig(resize=[320, 320]), NCHW, True, "preprocess.resize [320, 320] is not its "
                                                      "416x416"),
    (PreprocessConfig(), TensorSpec("v", np.dtype(np.float32), (-1, 4)), True,
     "input v [-1, 4] is not an image input"),
])
def test_mismatch_when_the_stated_tensor_cannot_feed_the_input_says_why(
        cfg: PreprocessConfig, spec: TensorSpec, batched: bool, said: str) -> None:
    why = mismatch(cfg, spec, batched)
    assert why is not None and said in why, why
    with pytest.raises(InvalidInput, match="m:1: "):
        image_preprocess(cfg, "m:1", spec, batched)


def test_mismatch_when_layout_channels_and_size_fit_is_none() -> None:
    assert mismatch(PreprocessConfig(layout="nhwc", resize=[224, 224]), NHWC, True) is None
    assert mismatch(PreprocessConfig(), TensorSpec("x", np.dtype(np.float32), (3, -1, -1)),
                    False) is None


@pytest.mark.parametrize(("rounding", "frame_h", "rows"), [
    ("floor", 300, 276), ("round", 300, 277),  # 300 * 416 / 451 = 276.72
    ("round", 305, 281), ("ceil", 305, 282)])  # 305 * 416 / 451 = 281.33
def test_preprocess_when_keeping_ratio_makes_the_scaled_size_whole_by_its_rounding(
        rounding: str, frame_h: int, rows: int) -> None:
    """A 451-wide frame letterboxed into 416 x 416 at the top left: the image's rows are the
    scaled height made whole as stated (YOLOX's int() is floor)."""
    frame = np.full((frame_h, 451, 3), 200, np.uint8)
    cfg = PreprocessConfig(keep_ratio=True, pad="end", rounding=rounding,
                           interpolation="linear")  # type: ignore[arg-type]
    tensor, geometry = preprocess(frame, cfg, NCHW)
    assert int((tensor[0, 0, :, 0] > 0.5).sum()) == rows
    assert geometry.scale_x == geometry.scale_y == 416 / 451  # boxes go back through the ratio


@pytest.mark.parametrize(("interpolation", "flag"), [("linear", cv2.INTER_LINEAR),
                                                     ("area", cv2.INTER_AREA),
                                                     ("nearest", cv2.INTER_NEAREST),
                                                     ("cubic", cv2.INTER_CUBIC)])
def test_preprocess_when_an_interpolation_is_stated_resizes_with_it(
        interpolation: str, flag: int) -> None:
    frame = np.random.default_rng(1).integers(0, 255, (97, 131, 3), dtype=np.uint8)
    cfg = PreprocessConfig(resize=[64, 48], scale=1.0, color="bgr",
                           interpolation=interpolation)  # type: ignore[arg-type]
    tensor, _ = preprocess(frame, cfg, TensorSpec("x", np.dtype(np.float32), (1, 3, 48, 64)))
    expected = cv2.resize(frame, (64, 48), interpolation=flag).transpose(2, 0, 1)
    np.testing.assert_array_equal(tensor[0], expected.astype(np.float32))


CLS = TensorSpec("x", np.dtype(np.float32), (-1, 3, 224, 224))


@pytest.mark.parametrize(("cfg", "said"), [
    (PreprocessConfig(resize_short=256), "preprocess.resize_short needs crop: center"),
    (PreprocessConfig(crop="center", keep_ratio=True), "crop: center and keep_ratio: true "
                                                       "exclude each other"),
    (PreprocessConfig(resize_short=200, crop="center"), "preprocess.resize_short 200 is "
                                                        "shorter than the 224x224"),
])
def test_mismatch_when_a_centre_crop_cannot_make_the_tensor_says_why(
        cfg: PreprocessConfig, said: str) -> None:
    why = mismatch(cfg, CLS, batched=True)
    assert why is not None and said in why, why


def test_preprocess_when_short_side_and_centre_crop_are_stated_cuts_paddleclas_window() -> None:
    """PaddleClas' ResizeImage(resize_short) + CropImage, step by step: a 400x300 frame's short
    side to 256 (341x256, int(round())), then the middle 224x224 (offsets 58, 16)."""
    rng = np.random.default_rng(7)
    frame = rng.integers(0, 256, (300, 400, 3), np.uint8)
    cfg = PreprocessConfig(resize_short=256, crop="center", color="bgr", interpolation="lanczos",
                           mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    tensor, geometry = preprocess(frame, cfg, CLS)
    resized = cv2.resize(frame, (341, 256), interpolation=cv2.INTER_LANCZOS4)
    window = resized[16:240, 58:282].astype(np.float32) * np.float32(1 / 255)
    expected = ((window - np.float32([0.485, 0.456, 0.406])) /
                np.float32([0.229, 0.224, 0.225])).transpose(2, 0, 1)[None]
    np.testing.assert_allclose(tensor, expected, atol=1e-5)
    # the geometry maps the crop back: tensor = frame * scale + pad
    assert (geometry.pad_x, geometry.pad_y) == (-58, -16)
    assert geometry.scale_x == pytest.approx(341 / 400) and geometry.scale_y == 256 / 300


def test_preprocess_when_the_crop_is_bigger_than_the_resized_frame_refuses() -> None:
    frame = np.zeros((100, 150, 3), np.uint8)
    with pytest.raises(InvalidInput, match="smaller than the 224x224"):
        preprocess(frame, PreprocessConfig(crop="center"), CLS)
