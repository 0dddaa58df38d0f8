"""A GGUF file's header (llama.cpp's model format): checked when a version is read, so a file
that is not GGUF, or is cut short in its header, is an InvalidModel naming it before any
backend sees it; and the few numbers edged needs before loading (the architecture, its
context length and the sizes its KV cache is made of). Tensor data is not read here: a file
cut short there fails the load itself (ModelLoadError), and the version before it serves on."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from edged.core.errors import InvalidModel

MAGIC = b"GGUF"
VERSIONS = (2, 3)
MAX_KEYS = 1 << 16  # a header with more keys than this is not a model's
MAX_STRING = 1 << 24
# GGUF's value types: fixed-size ones by struct format; 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class GgufHeader:
    version: int
    tensors: int
    metadata: dict[str, Any]  # scalars and strings; arrays as their length only

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def number(self, key: str, default: int = 0) -> int:
        """`<architecture>.<key>` as an int (0 or `default` when absent)."""
        value = self.metadata.get(f"{self.architecture}.{key}", default)
        return int(value) if isinstance(value, (int, float)) else default

    def kv_cache_bytes(self, context: int) -> int:
        """What llama.cpp's KV cache (f16 keys and values) takes for `context` tokens: two
        tensors per layer of context x (embedding x kv heads / heads) halves."""
        layers, embedding = self.number("block_count"), self.number("embedding_length")
        heads = self.number("attention.head_count", 1) or 1
        kv_heads = self.number("attention.head_count_kv", heads) or heads
        return 2 * 2 * context * layers * (embedding * kv_heads // heads)


def read_header(path: Path) -> GgufHeader:
    """The header of the GGUF file at `path`, or InvalidModel saying what is wrong."""
    try:
        with path.open("rb") as f:
            return _read(f, path.stat().st_size)
    except OSError as exc:
        raise InvalidModel(f"{path}: cannot read: {exc}") from exc
    except (struct.error, UnicodeDecodeError, EOFError) as exc:
        raise InvalidModel(f"{path}: not a readable GGUF file (header cut short or "
                           f"malformed: {exc})") from exc


def _read(f: BinaryIO, size: int) -> GgufHeader:
    magic = f.read(4)
    if magic != MAGIC:
        raise InvalidModel(f"{getattr(f, 'name', 'file')}: not a GGUF file (starts with "
                           f"{magic!r}, not {MAGIC!r})")
    version, tensors, keys = struct.unpack("<IQQ", _exact(f, 20))
    if version not in VERSIONS:
        raise InvalidModel(f"{f.name}: GGUF version {version} (edged reads {VERSIONS})")
    if keys > MAX_KEYS or tensors > size:
        raise InvalidModel(f"{f.name}: GGUF header claims {keys} keys and {tensors} tensors "
                           f"in {size} bytes")
    metadata: dict[str, Any] = {}
    for _ in range(keys):
        key = _string(f)
        (kind,) = struct.unpack("<I", _exact(f, 4))
        metadata[key] = _value(f, kind, size)
    return GgufHeader(version, tensors, metadata)


def _exact(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError(f"wanted {n} bytes at offset {f.tell() - len(data)}, got {len(data)}")
    return data


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", _exact(f, 8))
    if length > MAX_STRING:
        raise EOFError(f"a string of {length} bytes")
    return _exact(f, length).decode("utf-8")


def _value(f: BinaryIO, kind: int, size: int) -> Any:
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _exact(f, struct.calcsize(fmt)))[0]
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        (item, count) = struct.unpack("<IQ", _exact(f, 12))
        if count > size:
            raise EOFError(f"an array of {count} items in {size} bytes")
        if item in _SCALARS:  # skipped whole: the tokenizer's scores, types
            f.seek(count * struct.calcsize(_SCALARS[item]), 1)
        else:
            for _ in range(count):
                _value(f, item, size)
        return count
    raise EOFError(f"unknown value type {kind}")
