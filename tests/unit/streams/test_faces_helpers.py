"""The face pipeline's inputs: landmarks read from a detection's keypoints (by a face's names,
else the first five; refused when a point scores low), and enrolment images decoded or
refused with a typed error."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest

from edged.core.errors import InvalidImage
from edged.streams.faces import decode_image, landmarks_of

NAMED = {"right_eye": [60.0, 40.0, 0.9], "left_eye": [40.0, 40.0, 0.9], "nose": [50.0, 55.0, 0.9],
         "mouth_left": [42.0, 70.0, 0.9], "mouth_right": [58.0, 70.0, 0.9]}


def test_landmarks_of_when_named_takes_retinafaces_order() -> None:
    assert landmarks_of(NAMED, 0.3) == [[40.0, 40.0], [60.0, 40.0], [50.0, 55.0],
                                        [42.0, 70.0], [58.0, 70.0]]


def test_landmarks_of_when_unnamed_takes_the_first_five_and_drops_scores() -> None:
    points = {str(i): [float(i), float(2 * i)] for i in range(6)}
    assert landmarks_of(points, 0.3) == [[float(i), float(2 * i)] for i in range(5)]


@pytest.mark.parametrize("points", [None, {}, {"a": [1.0, 2.0]},
                                    {**NAMED, "nose": [50.0, 55.0, 0.1]}])
def test_landmarks_of_when_too_few_or_unsure_is_none(
        points: dict[str, list[float]] | None) -> None:
    assert landmarks_of(points, 0.3) is None


def test_decode_image_when_a_png_decodes_gives_its_pixels() -> None:
    picture = np.zeros((20, 30, 3), np.uint8)
    picture[5:10, 5:10] = (0, 0, 255)
    assert np.array_equal(decode_image(cv2.imencode(".png", picture)[1].tobytes()), picture)


@pytest.mark.parametrize(("data", "words"), [(b"", "empty"), (b"GIF89a\x00\x00", "no image"),
                                             (b"\xff\xd8\xff\xe0" + b"\x00" * 64, "no image")])
def test_decode_image_when_corrupt_refuses_with_image_invalid(data: bytes, words: str) -> None:
    with pytest.raises(InvalidImage, match=words) as caught:
        decode_image(data)
    assert caught.value.code == "image_invalid"


def test_open_faces_when_the_gallery_file_is_not_a_database_logs_and_runs_without(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from edged.galleries.config import FacesConfig
    from edged.streams.faces import open_faces

    broken = tmp_path / "faces.sqlite"
    broken.write_bytes(b"this is not a database file" * 100)
    cfg = FacesConfig(enabled=True, database=broken)
    assert open_faces(cfg, tmp_path / "models", scheduler=None) is None  # type: ignore[arg-type]
    assert "the gallery" in caplog.text and "cannot be used" in caplog.text
    assert broken.read_bytes().startswith(b"this is not")  # left as it was, for a person
