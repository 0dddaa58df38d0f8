"""Triton's BYTES tensors on the wire: each element a 4-byte little-endian length and then its
bytes (binary data and shared memory), or a JSON string (UTF-8 text). In edged a BYTES tensor
is a numpy object array of `bytes`; `str` elements (what ONNX Runtime returns for a string
output) go out as their UTF-8 encoding.

Bytes that are not UTF-8 travel exactly as binary data and through shared memory; JSON has no
way to say them, so such an output asked for as JSON is refused with a hint to ask for it as
binary data (Triton writes them into the JSON raw, which no JSON parser then reads)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from edged.core.errors import InvalidInput

_LENGTH = struct.Struct("<I")


def is_bytes(dtype: np.dtype) -> bool:
    return dtype == np.object_ or dtype.kind in "SU"


def pack(array: np.ndarray, name: str = "tensor") -> bytes:
    """Every element, length-prefixed, in row-major order (empty for no elements)."""
    parts: list[bytes] = []
    for item in array.reshape(-1):
        raw = element(item, name)
        parts += [_LENGTH.pack(len(raw)), raw]
    return b"".join(parts)


def element(item: Any, name: str) -> bytes:
    """One BYTES element as bytes: bytes as they are, text as UTF-8."""
    if isinstance(item, (bytes, bytearray, memoryview, np.bytes_)):
        return bytes(item)
    if isinstance(item, str):
        try:
            return item.encode()
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 for it
            raise InvalidInput(f"{name}: a BYTES element is not encodable text: {exc}") from exc
    raise InvalidInput(f"{name}: BYTES elements must be bytes or text, got "
                       f"{type(item).__name__}")


def unpack(data: memoryview, count: int, name: str) -> np.ndarray:
    """`count` length-prefixed elements filling `data` exactly, as a flat object array of
    bytes (copies: nothing keeps `data` alive)."""
    items: list[bytes] = []
    pos = 0
    for _ in range(count):
        if pos + 4 > len(data):
            raise InvalidInput(f"input {name}: BYTES data ends early")
        (length,) = _LENGTH.unpack_from(data, pos)
        pos += 4
        if pos + length > len(data):
            raise InvalidInput(f"input {name}: BYTES element runs past the data")
        items.append(bytes(data[pos:pos + length]))
        pos += length
    if pos != len(data):
        raise InvalidInput(f"input {name}: {len(data) - pos} bytes left after {count} elements")
    out = np.empty(count, dtype=np.object_)
    out[:] = items  # np.array(items) would make a fixed-width 'S' array, dropping trailing NULs
    return out


def from_json(flat: list[Any], name: str) -> np.ndarray:
    """JSON strings as UTF-8 bytes; anything but a string is refused."""
    out = np.empty(len(flat), dtype=np.object_)
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise InvalidInput(f"input {name}: BYTES data must be strings, element {i} is "
                               f"{type(item).__name__}")
        out[i] = element(item, f"input {name}")
    return out


def to_json(array: np.ndarray, name: str) -> list[str]:
    """Each element as text; bytes that are not UTF-8 cannot be JSON text."""
    out = []
    for i, item in enumerate(array.reshape(-1)):
        if isinstance(item, str):
            out.append(item)
            continue
        try:
            out.append(element(item, f"output {name}").decode())
        except UnicodeDecodeError:
            raise InvalidInput(f"output {name}: element {i} is not UTF-8 text, which JSON "
                               "cannot carry; ask for the output with binary_data: true (or "
                               "in shared memory)") from None
    return out
