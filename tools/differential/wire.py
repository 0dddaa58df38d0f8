"""An infer request as the differential test's generator chooses it (`Call`), and its bytes on
the wire (`render`): the JSON header in any key order and spacing, escaped keys, UTF-8 or not;
tensors as JSON data, binary data, a raw binary body or shared memory; outputs as JSON,
binary or shared memory; gzip or deflate (padded to the inflated length, on request); chunked
or not. The same Call with other tensor values (`Call.values`) is a client's loop: the same
head and JSON, other tail bytes."""

from __future__ import annotations

import gzip
import json
import random
import struct
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tools.differential.models import MODELS

HEADER_LENGTH = "Inference-Header-Content-Length"
TEXT_ENCODINGS = ("utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-32")


@dataclass(frozen=True)
class Tensor:
    """One input as sent: its declared name, datatype and shape, how it travels, and the
    values index (the pool it is drawn from is fixed by the rest)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    mode: str  # json | binary | shm
    region: str = ""  # mode shm: the region's name, and where in it
    offset: int = 0
    byte_size: int | None = None  # declared size where it is a lie (None: the true one)


@dataclass(frozen=True)
class Output:
    name: str
    mode: str  # default | json | binary | shm
    region: str = ""
    offset: int = 0
    byte_size: int = 0


@dataclass(frozen=True)
class Call:
    """An infer request's every choice but its tensor values (`values`, an index)."""

    model: str
    version: int | None
    inputs: tuple[Tensor, ...]
    outputs: tuple[Output, ...] | None  # None: the key left out (every output)
    params: tuple[tuple[str, Any], ...] = ()
    request_id: str | None = None
    raw_binary: bool = False  # the body is the one input's bytes (header length 0)
    key_order: int = 0  # a seed for the order of the JSON's keys
    compact: bool = True
    escaped: bool = False  # "shared_memory_region" spelled with a \\u escape
    text: str = "utf-8"
    encoding: str = "identity"  # identity | gzip | deflate
    padded: bool = False  # compressed to exactly the inflated length
    chunked: bool = False
    content_type: str | None = "application/octet-stream"
    values: int = 0
    extra_headers: tuple[tuple[str, str], ...] = field(default=())

    def again(self, values: int) -> Call:
        return replace(self, values=values)


def tensor_values(call: Call, tensor: Tensor) -> np.ndarray:
    """The values of `tensor` in `call`: drawn from a pool fixed by the model, input, shape
    and values index, so that repeats of a Call with one index send the same bytes."""
    shape = tensor.shape
    seed = zlib.crc32(f"{call.model}/{tensor.name}/{shape}/{call.values}".encode())
    rng = np.random.default_rng(seed)
    count = int(np.prod(shape)) if shape else 1
    if tensor.datatype == "FP32":
        return (rng.integers(-64, 64, count) / 4).astype(np.float32).reshape(shape)
    if tensor.datatype == "INT32":
        return rng.integers(-1000, 1000, count, dtype=np.int32).reshape(shape)
    words = ["", "a", "edge", "héllo", "\x00bin", "naïve", "x" * 40]
    return np.array([words[i] for i in rng.integers(0, len(words), count)],
                    dtype=object).reshape(shape)


def tensor_bytes(array: np.ndarray) -> bytes:
    if array.dtype == object:
        return b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in array.flat)
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def render(call: Call, path_model: str | None = None) -> tuple[bytes, int]:
    """The request's bytes, and where its head ends (a split point: two writes)."""
    body, json_length = _body(call)
    headers = [("Host", "localhost")]
    if call.content_type is not None:
        headers.append(("Content-Type", call.content_type))
    if json_length is not None:
        headers.append((HEADER_LENGTH, str(json_length)))
    if call.encoding != "identity":
        body = _compress(body, call.encoding, call.padded)
        headers.append(("Content-Encoding", call.encoding))
    headers += list(call.extra_headers)
    if call.chunked:
        headers.append(("Transfer-Encoding", "chunked"))
        body = _chunks(body, call.values)
    else:
        headers.append(("Content-Length", str(len(body))))
    model = path_model or call.model
    path = f"/v2/models/{model}" + (f"/versions/{call.version}" if call.version else "")
    head = (f"POST {path}/infer HTTP/1.1\r\n"
            + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n").encode("latin-1")
    return head + body, len(head)


def _body(call: Call) -> tuple[bytes, int | None]:
    arrays = [tensor_values(call, t) for t in call.inputs]
    if call.raw_binary:
        return tensor_bytes(arrays[0]), 0
    entries, blobs = [], []
    for tensor, array in zip(call.inputs, arrays, strict=True):
        entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype,
                                 "shape": list(tensor.shape)}
        if tensor.mode == "json":
            data = array.tolist()
            entry["data"] = data if call.values % 2 else np.asarray(array).reshape(-1).tolist()
        elif tensor.mode == "binary":
            raw = tensor_bytes(array)
            size = len(raw) if tensor.byte_size is None else tensor.byte_size
            entry["parameters"] = {"binary_data_size": size}
            blobs.append(raw)
        else:
            size = len(tensor_bytes(array)) if tensor.byte_size is None else tensor.byte_size
            entry["parameters"] = _shm(tensor.region, tensor.offset, size)
        entries.append(entry)
    header: dict[str, Any] = {"inputs": entries}
    if call.outputs is not None:
        header["outputs"] = [_output(o) for o in call.outputs]
    if call.params:
        header["parameters"] = dict(call.params)
    if call.request_id is not None:
        header["id"] = call.request_id
    text = _json(header, call)
    encoded = text.encode(call.text)
    return encoded + b"".join(blobs), len(encoded) if blobs else None


def _shm(region: str, offset: int, size: int) -> dict[str, Any]:
    params: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": size}
    if offset:
        params["shared_memory_offset"] = offset
    return params


def _output(out: Output) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": out.name}
    if out.mode == "binary":
        entry["parameters"] = {"binary_data": True}
    elif out.mode == "json":
        entry["parameters"] = {"binary_data": False}
    elif out.mode == "shm":
        entry["parameters"] = _shm(out.region, out.offset, out.byte_size)
    return entry


def _json(header: dict[str, Any], call: Call) -> str:
    """The header's text, its keys in an order drawn from `key_order`."""
    order = random.Random(call.key_order)

    def shuffled(value: Any) -> Any:
        if isinstance(value, dict):
            items = list(value.items())
            order.shuffle(items)
            return {k: shuffled(v) for k, v in items}
        if isinstance(value, list):
            return [shuffled(v) for v in value]
        return value

    text = json.dumps(shuffled(header), separators=(",", ":") if call.compact else None,
                      ensure_ascii=call.key_order % 3 == 0)
    if call.escaped:
        text = text.replace('"shared_memory_region"', '"shared\\u005fmemory_region"')
    return text


def _compress(body: bytes, encoding: str, padded: bool) -> bytes:
    if encoding == "gzip":
        plain = gzip.compress(body, mtime=0)
        if padded and len(plain) < len(body):  # the FCOMMENT field makes up the difference
            deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
            stream = deflate.compress(body) + deflate.flush()
            trailer = struct.pack("<II", zlib.crc32(body), len(body) & 0xFFFFFFFF)
            head = b"\x1f\x8b\x08\x10\0\0\0\0\x02\xff"
            comment = len(body) - len(head) - len(stream) - len(trailer) - 1
            if comment >= 0:
                return head + b"c" * comment + b"\0" + stream + trailer
        return plain
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS)
    stream = packer.compress(body) + packer.flush(zlib.Z_FULL_FLUSH)
    tail = packer.flush()
    if padded:  # empty stored blocks, 5 bytes each, up to the inflated length
        empty = zlib.compressobj(0, zlib.DEFLATED, -zlib.MAX_WBITS).flush(zlib.Z_FULL_FLUSH)
        while len(stream) + len(tail) + len(empty) <= len(body):
            stream += empty
    return stream + tail


def _chunks(body: bytes, seed: int) -> bytes:
    sizes = random.Random(seed)
    out, at = [], 0
    while at < len(body):
        size = min(sizes.randint(1, max(1, len(body) // 2)), len(body) - at)
        out.append(b"%x\r\n" % size + body[at:at + size] + b"\r\n")
        at += size
    return b"".join(out) + b"0\r\n\r\n"


def known_model(name: str) -> bool:
    return name in MODELS
