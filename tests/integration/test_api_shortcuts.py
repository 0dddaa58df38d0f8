"""The shortcuts that skip work because they have seen something before (plans, replays, the
response cache, shm views) answer what the full path would, on the served API, in the three
cases a probe made them answer wrong (issue 49, items 2-4):

- a JSON header that is not UTF-8 (UTF-16, UTF-32) is refused, so a byte search for
  "shared_memory_region" can no longer miss a region it names and freeze its bytes in a plan;
- an answer computed from a shared memory view is never kept in the response cache (its owner
  may write other bytes while the request waits; the model reads those);
- a compressed body is never replayed, however long it is, and a corrupt one is refused."""

from __future__ import annotations

import gzip
import http.client
import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.daemon import Served, ServeFactory
from support.polling import wait_until

from edged.api.protocol import HEADER_LENGTH, decode_response
from edged.ops.client import SharedRegion
from tools.assets.models import make_scale, write_model

WIDE = 256  # `wide`'s row: compressible, and no two rows of the tests alike


@pytest.fixture
def shortcut_repo(tmp_path: Path) -> Path:
    root = tmp_path / "shortcut-models"
    write_model(make_scale(4), root / "scale" / "1" / "model.onnx")
    write_model(make_scale(WIDE), root / "wide" / "1" / "model.onnx")
    write_model(make_scale(4), root / "slow" / "1" / "model.onnx")
    # Every request waits in the queue for a while (a batch that may fill), and answers are
    # cached: what a client does to its region meanwhile must not reach the cache.
    (root / "slow" / "model.yaml").write_text(
        "response_cache: true\nbatching: {max_queue_delay_us: 1500000}\n")
    return root


@pytest.fixture
def device(make_served: ServeFactory, shortcut_repo: Path) -> Served:
    return make_served(models_dir=shortcut_repo, cache="preload: [scale, wide, slow]")


class Http:
    """One keep-alive connection to the loopback listener."""

    def __init__(self, served: Served) -> None:
        host, port = served.http.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None
             ) -> tuple[int, bytes, dict[str, str]]:
        self.conn.request("POST", path, body=body, headers=headers or {})
        response = self.conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())

    def answer(self, path: str, body: bytes, headers: dict[str, str] | None = None,
               output: str = "y") -> np.ndarray:
        status, raw, got = self.post(path, body, headers)
        assert status == 200, raw
        length = got.get(HEADER_LENGTH)
        return decode_response(raw, None if length is None else int(length)).outputs[output]

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def client(device: Served) -> Iterator[Http]:
    connection = Http(device)
    yield connection
    connection.close()


@pytest.fixture
def region(device: Served) -> Iterator[SharedRegion]:
    with SharedRegion("edged-test-shortcuts", 64) as shm, device.client() as api:
        api.register_shm("in", "/edged-test-shortcuts", 64)
        yield shm


def shm_header(region_name: str = "in", key: str = "shared_memory_region") -> dict[str, Any]:
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                        "parameters": {key: region_name, "shared_memory_byte_size": 16}}],
            "outputs": [{"name": "y"}]}


def error_of(raw: bytes) -> str:
    return str(json.loads(raw)["error"])


# -- item 2: JSON that is not UTF-8 --------------------------------------------------------
@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32",
                                      "utf-32-le"])
def test_infer_when_the_json_is_not_utf8_refuses_it_every_time_whatever_the_region_holds(
        client: Http, region: SharedRegion, encoding: str) -> None:
    body = json.dumps(shm_header()).encode(encoding)
    for value in (1.0, 2.0, 3.0):
        region.write(np.full(4, value, np.float32))
        status, raw, _ = client.post("/v2/models/scale/infer", body)
        assert status == 400, raw
        assert "not UTF-8" in error_of(raw) and "RFC 8259" in error_of(raw)


def test_infer_when_a_utf8_header_spells_the_region_key_with_escapes_reads_the_region_each_time(
        client: Http, region: SharedRegion) -> None:
    body = json.dumps(shm_header(key="shared\\u005fmemory\\u005fregion")).encode()
    body = body.replace(b"\\\\u005f", b"\\u005f")  # json.dumps escaped the backslash
    assert b"shared_memory_region" not in body
    for value in (1.0, 2.0, 3.0):
        region.write(np.full(4, value, np.float32))
        y = client.answer("/v2/models/scale/infer", body)
        np.testing.assert_array_equal(y, np.full((1, 4), 2 * value, np.float32))


def test_repository_and_shm_routes_when_the_json_is_utf16_refuse_it(client: Http) -> None:
    body = json.dumps({"name": "in2", "key": "/nope", "byte_size": 16}).encode("utf-16")
    status, raw, _ = client.post("/v2/systemsharedmemory/region/in2/register", body)
    assert status == 400 and "not UTF-8" in error_of(raw), raw
    status, raw, _ = client.post("/v2/repository/index", json.dumps({}).encode("utf-32"))
    assert status == 400 and "not UTF-8" in error_of(raw), raw


# -- item 3: a queued shm view and the response cache --------------------------------------
def test_response_cache_when_a_view_input_changes_while_queued_keeps_no_answer_under_it(
        device: Served, client: Http, region: SharedRegion) -> None:
    a, b = np.full(4, 3.0, np.float32), np.full(4, 5.0, np.float32)
    region.write(a)
    body = json.dumps(shm_header()).encode()
    device.daemon.scheduler.prepare("slow")
    batcher = device.daemon.scheduler.batcher("slow")
    assert batcher is not None
    waiting = Http(device)
    try:
        waiting.conn.request("POST", "/v2/models/slow/infer", body=body)
        wait_until(lambda: batcher.depth == 1, timeout=10, what="the request to queue")
        region.write(b)  # the model reads the view when the batch runs: it sees B
        response = waiting.conn.getresponse()
        assert response.status == 200
        ran = decode_response(response.read(), None).outputs["y"]
    finally:
        waiting.close()
    np.testing.assert_array_equal(ran, 2 * b.reshape(1, 4))
    # A as plain JSON: computed from A, never 2·B kept under A's bytes.
    plain = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4],
                                    "data": a.tolist()}], "outputs": [{"name": "y"}]}).encode()
    for _ in range(2):  # the second may come from the cache: A's answer
        np.testing.assert_array_equal(client.answer("/v2/models/slow/infer", plain),
                                      2 * a.reshape(1, 4))


# -- item 4: compressed bodies are never replayed --------------------------------------------
def padded_gzip(raw: bytes, length: int) -> bytes:
    """A gzip member of exactly `length` bytes holding `raw`: its header carries a comment
    (FCOMMENT) as long as it takes."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    body = deflate.compress(raw) + deflate.flush()
    trailer = struct.pack("<II", zlib.crc32(raw), len(raw) & 0xFFFFFFFF)
    head = b"\x1f\x8b\x08\x10" + b"\0\0\0\0" + b"\x02\xff"
    comment = length - len(head) - len(body) - len(trailer) - 1
    assert comment >= 0, "the body does not compress enough"
    member = head + b"c" * comment + b"\0" + body + trailer
    assert len(member) == length and gzip.decompress(member) == raw
    return member


def padded_deflate(x: np.ndarray) -> tuple[bytes, bytes, int]:
    """(a request for `x`, a zlib stream of it exactly as long, its JSON length): empty
    stored blocks (5 bytes each) and spaces in the JSON header (a byte each) make up the
    length."""
    for spaces in range(16):
        raw, json_length = wide_request(x, spaces)
        packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS)
        stream = packer.compress(raw) + packer.flush(zlib.Z_FULL_FLUSH)
        tail = packer.flush()
        empty = zlib.compressobj(0, zlib.DEFLATED, -zlib.MAX_WBITS).flush(zlib.Z_FULL_FLUSH)
        while len(stream) + len(tail) < len(raw):
            stream += empty
        if len(stream) + len(tail) == len(raw):
            sent = stream + tail
            assert zlib.decompress(sent) == raw
            return raw, sent, json_length
    raise AssertionError("no padding made the lengths equal")


def wide_request(x: np.ndarray, spaces: int = 0) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, WIDE],
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}
                        ).encode() + b" " * spaces
    return header + x.tobytes(), len(header)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_infer_when_a_compressed_body_is_as_long_as_its_bytes_answers_each_repeat_right(
        client: Http, encoding: str) -> None:
    x = np.tile(np.arange(1, 5, dtype=np.float32), WIDE // 4).reshape(1, WIDE)
    if encoding == "gzip":
        raw, json_length = wide_request(x)
        sent = padded_gzip(raw, len(raw))
    else:
        raw, sent, json_length = padded_deflate(x)
    assert len(sent) == len(raw)
    headers = {"Content-Encoding": encoding, HEADER_LENGTH: str(json_length),
               "Content-Type": "application/octet-stream"}
    for _ in range(4):
        y = client.answer("/v2/models/wide/infer", sent, headers)
        np.testing.assert_array_equal(y, 2 * x)


def test_infer_when_a_repeated_gzip_body_has_a_corrupt_trailer_refuses_it(
        client: Http) -> None:
    x = np.tile(np.arange(1, 5, dtype=np.float32), WIDE // 4).reshape(1, WIDE)
    raw, json_length = wide_request(x)
    sent = padded_gzip(raw, len(raw))
    headers = {"Content-Encoding": "gzip", HEADER_LENGTH: str(json_length)}
    np.testing.assert_array_equal(client.answer("/v2/models/wide/infer", sent, headers), 2 * x)
    corrupt = sent[:-8] + bytes([sent[-8] ^ 0xFF]) + sent[-7:]
    status, body, _ = client.post("/v2/models/wide/infer", corrupt, headers)
    assert status == 400 and "corrupt" in error_of(body), body
    status, body, _ = client.post("/v2/models/wide/infer", sent + b"junk", headers)
    assert status == 400 and "follow the end" in error_of(body), body
    two = gzip.compress(raw[:100]) + gzip.compress(raw[100:])  # two members: one body
    np.testing.assert_array_equal(client.answer("/v2/models/wide/infer", two, headers), 2 * x)
