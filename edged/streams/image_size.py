"""An encoded image's width and height read from its header, before any pixel is decoded: a
few hundred bytes of PNG can declare 16k x 16k pixels (a gigabyte once decoded), so an
enrolment image is sized from its header and refused when too large before OpenCV decodes it.
The formats enrolment takes: PNG (IHDR), JPEG (the SOFn segment), WebP (VP8, VP8L, VP8X) and
BMP; anything else is InvalidImage naming them."""

from __future__ import annotations

import struct

from edged.core.errors import InvalidImage

FORMATS = "JPEG, PNG, BMP or WebP"
_PNG = b"\x89PNG\r\n\x1a\n"
# SOF0..SOF15 carry the frame's size; C4 (DHT), C8 (JPG), CC (DAC) are not frames
_SOF = {m for m in range(0xC0, 0xD0)} - {0xC4, 0xC8, 0xCC}
_STANDALONE = {0x01, *range(0xD0, 0xD8)}  # markers with no length (TEM, RSTn)


def image_size(data: bytes | memoryview) -> tuple[int, int]:
    """(width, height) from the header; InvalidImage when it is no image of FORMATS or its
    header is cut short."""
    head = bytes(data[:32])
    try:
        if head.startswith(_PNG) and head[12:16] == b"IHDR":
            width, height = struct.unpack(">II", head[16:24])
        elif head.startswith(b"\xff\xd8"):
            width, height = _jpeg(data)
        elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            width, height = _webp(head)
        elif head[:2] == b"BM":
            width, height = _bmp(head)
        else:
            raise InvalidImage(f"the {len(data)} bytes are no image of {FORMATS}")
    except (struct.error, IndexError):
        raise InvalidImage(f"the {len(data)} bytes are no image: its header is cut short"
                           ) from None
    except InvalidImage as exc:
        if "bytes are no image" in str(exc):
            raise
        raise InvalidImage(f"the {len(data)} bytes are no image: {exc}") from None
    if width <= 0 or height <= 0:
        raise InvalidImage(f"the image header says {width}x{height} pixels")
    return width, height


def _jpeg(data: bytes | memoryview) -> tuple[int, int]:
    at = 2
    while at + 4 <= len(data):
        if data[at] != 0xFF:
            raise InvalidImage(f"the JPEG has no marker at byte {at}")
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in _STANDALONE:
            at += 2
            continue
        if marker in (0xD9, 0xDA):  # EOI, SOS: the scan came before any frame header
            break
        (length,) = struct.unpack_from(">H", data, at + 2)
        if marker in _SOF:
            height, width = struct.unpack_from(">HH", data, at + 5)
            return width, height
        if length < 2:
            raise InvalidImage(f"the JPEG's segment at byte {at} has length {length}")
        at += 2 + length
    raise InvalidImage("the JPEG has no frame header (SOFn) before its scan")


def _webp(head: bytes) -> tuple[int, int]:
    chunk = head[12:16]
    if chunk == b"VP8 ":
        if head[23:26] != b"\x9d\x01\x2a":
            raise InvalidImage("the WebP's VP8 frame has no start code")
        width, height = struct.unpack("<HH", head[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L":
        if head[20] != 0x2F:
            raise InvalidImage("the WebP's VP8L frame has no signature")
        (bits,) = struct.unpack("<I", head[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        return (int.from_bytes(head[24:27], "little") + 1,
                int.from_bytes(head[27:30], "little") + 1)
    raise InvalidImage(f"the WebP's first chunk {chunk!r} is none of VP8, VP8L, VP8X")


def _bmp(head: bytes) -> tuple[int, int]:
    (size,) = struct.unpack("<I", head[14:18])
    if size == 12:  # BITMAPCOREHEADER
        width, height = struct.unpack("<HH", head[18:22])
        return width, height
    width, height = struct.unpack("<ii", head[18:26])
    return width, abs(height)  # a negative height: rows stored top-down
