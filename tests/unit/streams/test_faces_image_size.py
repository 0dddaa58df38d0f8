"""An enrolment image is sized from its header before it is decoded (review of issue 50's
faces): a 47 KB PNG of 7000x7000 zeros, or a 100-byte one claiming 40000x40000, is refused
with `image_invalid` and costs no decoded pixels; each format enrolment takes is sized from
its own header; OpenCV's own refusal (cv2.error) is the same typed error."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import pytest
from support.images import png_of_zeros

from edged.core.errors import InvalidImage
from edged.streams import faces
from edged.streams.faces import decode_image
from edged.streams.image_size import image_size

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("ext", "params"), [
    (".png", []), (".jpg", []), (".jpg", [cv2.IMWRITE_JPEG_PROGRESSIVE, 1]), (".bmp", []),
    (".webp", [cv2.IMWRITE_WEBP_QUALITY, 80]), (".webp", [cv2.IMWRITE_WEBP_QUALITY, 101])])
def test_image_size_when_encoded_by_opencv_reads_its_header(ext: str, params: list[int]
                                                             ) -> None:
    picture = np.zeros((37, 53, 3), np.uint8)
    data = cv2.imencode(ext, picture, params)[1].tobytes()
    assert image_size(data) == (53, 37) == image_size(memoryview(data))


def test_image_size_when_webp_extended_reads_the_canvas() -> None:
    canvas = (1999).to_bytes(3, "little") + (2999).to_bytes(3, "little")
    data = b"RIFF" + struct.pack("<I", 30) + b"WEBP" + b"VP8X" + struct.pack("<I", 10) + \
        b"\x00" * 4 + canvas
    assert image_size(data) == (2000, 3000)


@pytest.mark.parametrize(("data", "words"), [
    (b"GIF89a" + b"\x00" * 40, "no image of JPEG, PNG, BMP or WebP"),
    (b"II*\x00" + b"\x00" * 40, "no image of JPEG, PNG, BMP or WebP"),  # TIFF: not taken
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR\x00\x00", "cut short"),
    (b"\xff\xd8\xff\xda" + b"\x00" * 40, "no frame header"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 20, "no start code")])
def test_image_size_when_the_header_is_not_read_refuses_naming_the_formats(
        data: bytes, words: str) -> None:
    with pytest.raises(InvalidImage, match=words) as caught:
        image_size(data)
    assert caught.value.code == "image_invalid"


def test_decode_image_when_a_huge_png_claims_few_bytes_refuses_before_decoding() -> None:
    data = png_of_zeros(40000, 40000, rows=1)  # ~100 bytes; OpenCV raised cv2.error on it
    assert len(data) < 200
    with pytest.raises(InvalidImage, match="40000x40000: more than") as caught:
        decode_image(data)
    assert caught.value.code == "image_invalid"


def test_decode_image_when_opencv_raises_is_image_invalid(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    # OpenCV's own refusals (its OPENCV_IO_MAX_IMAGE_PIXELS bound, a header it rejects)
    # raise cv2.error; the header here is one decode_image takes
    def refuse(_data: np.ndarray, _flags: int) -> np.ndarray:
        raise cv2.error("OpenCV(4.x) loadsave.cpp:77: error: (-215:Assertion failed) "
                        "pixels <= CV_IO_MAX_IMAGE_PIXELS in function 'validateInputImageSize'")
    monkeypatch.setattr(faces.cv2, "imdecode", refuse)
    with pytest.raises(InvalidImage, match="do not decode") as caught:
        decode_image(png_of_zeros(8, 8))
    assert caught.value.code == "image_invalid"


def test_decode_image_when_a_png_bomb_is_refused_peak_memory_stays_small() -> None:
    """A 7000x7000 PNG of zeros (47 KB) decoded to 147 MB of BGR (+282 MB peak) before its
    size was checked. The peak RSS of a child process that refuses it stays far below."""
    script = textwrap.dedent("""
        import resource, sys
        sys.path.insert(0, sys.argv[1])
        from support.images import png_of_zeros
        from edged.core.errors import InvalidImage
        from edged.streams.faces import decode_image
        data = png_of_zeros(7000, 7000)
        decode_image(png_of_zeros(64, 64))  # OpenCV's own start-up is not the bomb's
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            decode_image(data)
        except InvalidImage as exc:
            print("refused", exc.code)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print("grown_kib", grown)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, str(ROOT / "tests")], capture_output=True,
                          text=True, timeout=120, env=env, check=True)
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["refused"] == "image_invalid", done.stdout
    assert int(lines["grown_kib"]) < 100 * 1024, done.stdout  # was ~282 MB
