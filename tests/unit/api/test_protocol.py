"""The KServe v2 / Triton codec: JSON and binary tensors both ways, and every malformed request
rejected with an InvalidInput that says what is wrong."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest

from edged.api.protocol import (
    RequestedOutput,
    ShmRef,
    decode_request,
    encode_request,
    encode_response,
    triton_dtype,
)
from edged.core.errors import InvalidInput


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, int]:
    head = json.dumps(header).encode()
    return head + b"".join(blobs), len(head)


def test_decode_when_json_data_nested_or_flat_builds_arrays_and_parameters() -> None:
    body = json.dumps({
        "id": "req-7",
        "parameters": {"priority": 2, "timeout": 250000, "binary_data_output": True},
        "inputs": [{"name": "a", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]},
                   {"name": "b", "shape": [3], "datatype": "INT64", "data": [5, 6, 7]}],
        "outputs": [{"name": "sum", "parameters": {"binary_data": False}}],
    }).encode()
    request = decode_request(body)
    assert request.id == "req-7"
    assert (request.priority, request.timeout_s, request.binary_default) == (2, 0.25, True)
    np.testing.assert_array_equal(request.inputs["a"], np.array([[1, 2], [3, 4]], np.float32))
    assert request.inputs["a"].dtype == np.float32 and request.inputs["b"].dtype == np.int64
    assert request.outputs == [RequestedOutput("sum", binary=False)]


def test_decode_when_binary_data_follows_json_gives_zero_copy_views() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, -2], dtype=np.int16)
    body, length = binary_body({"inputs": [
        {"name": "a", "shape": [2, 3], "datatype": "FP32",
         "parameters": {"binary_data_size": a.nbytes}},
        {"name": "j", "shape": [1], "datatype": "BOOL", "data": [True]},
        {"name": "b", "shape": [2], "datatype": "INT16",
         "parameters": {"binary_data_size": b.nbytes}}]}, a.tobytes(), b.tobytes())
    request = decode_request(body, length)
    np.testing.assert_array_equal(request.inputs["a"], a)
    np.testing.assert_array_equal(request.inputs["b"], b)
    assert request.inputs["j"].dtype == np.bool_
    view = request.inputs["a"]
    assert not view.flags.writeable and not view.flags.owndata  # a view of the body


def test_decode_when_bytes_tensor_binary_or_json_round_trips() -> None:
    items = [b"hello", b"", b"\x00\xff"]
    raw = b"".join(struct.pack("<I", len(x)) + x for x in items)
    body, length = binary_body({"inputs": [{"name": "s", "shape": [3], "datatype": "BYTES",
                                            "parameters": {"binary_data_size": len(raw)}}]}, raw)
    assert list(decode_request(body, length).inputs["s"]) == items
    as_json = json.dumps({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES",
                                      "data": ["x", "yz"]}]}).encode()
    assert list(decode_request(as_json).inputs["s"]) == [b"x", b"yz"]


def test_decode_when_input_lives_in_shared_memory_reads_it_through_the_resolver() -> None:
    region = bytearray(64)
    region[16:32] = np.arange(4, dtype=np.float32).tobytes()
    seen: list[ShmRef] = []

    def read(ref: ShmRef) -> memoryview:
        seen.append(ref)
        return memoryview(region)[ref.offset:ref.offset + ref.byte_size]

    body = json.dumps({"inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "parameters": {
        "shared_memory_region": "frames", "shared_memory_offset": 16,
        "shared_memory_byte_size": 16}}]}).encode()
    request = decode_request(body, read_shm=read)
    assert seen == [ShmRef("frames", 16, 16)]
    np.testing.assert_array_equal(request.inputs["x"], [0, 1, 2, 3])


def with_blob(head: bytes, blob: bytes) -> tuple[bytes, int]:
    return head + blob, len(head)


BAD_REQUESTS = [
    (b"{not json", None, "malformed JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    (b'{"inputs": []}', None, "inputs must be a non-empty list"),
    (b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP33", "data": [1, 2]}]}', None,
     "unknown datatype 'FP33'"),
    (b'{"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}', None,
     "shape must be a list of integers in 0.."),
    (b'{"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2]}]}', None,
     "2 values for shape"),
    *((b'{"inputs": [{"name": "x", "shape": %s, "datatype": "FP32", "data": [1]}]}' % shape,
       None, "shape must be a list of integers in 0..")
      for shape in (b"[1, true]", b"[1.0]", b'["1"]', b"[null]", b"[[1]]", b"[1099511627777]",
                    b'{"0": 1}', b"7")),
    (b'{"inputs": [{"name": "x", "shape": [2097152, 1048576, 0], "datatype": "FP32",'
     b' "data": []}]}', None, "describes more than"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}\xff', None,
     "not UTF-8"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "INT32", "data": ["a"]}]}', None,
     "data is not INT32"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}', None, "no data"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]},'
     b' {"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}', None, "appears twice"),
    (*with_blob(b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",'
                b' "parameters": {"binary_data_size": 8}}]}', b"\x00" * 4), "runs past the body"),
    (*with_blob(b'{"inputs": [{"name": "x", "shape": [2], "datatype": "FP32",'
                b' "parameters": {"binary_data_size": 4}}]}', b"\x00" * 4),
     "4 bytes of data for 2"),
    (*with_blob(b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}',
                b"xx"), "2 bytes of binary data but the inputs declare 0"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}', 500,
     "Inference-Header-Content-Length is 500"),
    (b'{"parameters": {"timeout": -5}, "inputs": [{"name": "x", "shape": [1], "datatype": '
     b'"FP32", "data": [1]}]}', None, "timeout must be an integer number of microseconds"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "parameters": '
     b'{"shared_memory_region": "r", "shared_memory_byte_size": 4}}]}', None,
     "shared memory is not available"),
    (b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}], '
     b'"outputs": [{"parameters": {}}]}', None, r"outputs\[0\].name"),
]


@pytest.mark.parametrize(("body", "length", "message"), BAD_REQUESTS)
def test_decode_when_request_is_malformed_raises_invalid_input(body: bytes, length: int | None,
                                                               message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_request(body, length)


TEXT = '{"id": "\u00e9t\u00e9", "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", ' \
       '"data": [1.5]}]}'


@pytest.mark.parametrize("encode", [
    lambda text: text.encode(),  # what every client sends
    lambda text: b"\xef\xbb\xbf" + text.encode(),  # UTF-8 with a byte order mark
])
def test_decode_when_json_is_utf8_reads_it(encode: Any) -> None:
    request = decode_request(encode(TEXT))
    assert request.id == "\u00e9t\u00e9"
    assert request.inputs["x"].tolist() == [1.5]


@pytest.mark.parametrize("encoding,named", [
    ("utf-16", "UTF-16 with a byte order mark"), ("utf-16-le", "UTF-16"),
    ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32 with a byte order mark"),
    ("utf-32-le", "UTF-32"), ("utf-32-be", "UTF-32"), ("latin-1", "invalid continuation"),
])
def test_decode_when_json_is_not_utf8_refuses_it_naming_what_it_looks_like(
        encoding: str, named: str) -> None:
    """JSON between systems is UTF-8 (RFC 8259 §8.1); json.loads would sniff the others."""
    with pytest.raises(InvalidInput, match=f"not UTF-8 \\({named}.*RFC 8259"):
        decode_request(TEXT.encode(encoding))


def test_decode_when_shape_has_no_dims_or_a_zero_dim_takes_it() -> None:
    scalar = decode_request(b'{"inputs": [{"name": "x", "shape": [], "datatype": "FP32",'
                            b' "data": [2]}]}')
    empty = decode_request(b'{"inputs": [{"name": "x", "shape": [0, 3], "datatype": "FP32",'
                           b' "data": []}]}')
    assert scalar.inputs["x"].shape == () and empty.inputs["x"].shape == (0, 3)


def test_decode_when_data_is_nested_very_deeply_stays_a_clean_error() -> None:
    deep = "[" * 100000 + "]" * 100000
    body = ('{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": ' + deep +
            "}]}").encode()
    with pytest.raises(InvalidInput, match="nesting depth exceeds"):
        decode_request(body)


def test_encode_when_binary_requested_puts_data_after_json_with_its_length() -> None:
    outputs = {"prob": np.array([[0.25, 0.75]], np.float32), "label": np.array([1], np.int64)}
    parts, length = encode_response("cls", 3, "r1", outputs,
                                   [RequestedOutput("prob", binary=True),
                                    RequestedOutput("label")], binary_default=False)
    body = b"".join(parts)
    assert length is not None
    header = json.loads(body[:length])
    assert header["model_name"] == "cls" and header["model_version"] == "3"
    assert header["id"] == "r1"
    prob, label = header["outputs"]
    assert prob == {"name": "prob", "datatype": "FP32", "shape": [1, 2],
                    "parameters": {"binary_data_size": 8}}
    assert label == {"name": "label", "datatype": "INT64", "shape": [1], "data": [1]}
    np.testing.assert_array_equal(np.frombuffer(body[length:], np.float32), [0.25, 0.75])


def test_encode_when_nothing_binary_is_plain_json_of_every_output() -> None:
    parts, length = encode_response("m", 1, None, {"a": np.array([1.5], np.float16),
                                                  "s": np.array([b"x"], np.object_)}, [], False)
    body = b"".join(parts)
    assert length is None
    outputs = json.loads(body)["outputs"]
    assert outputs == [{"name": "a", "datatype": "FP16", "shape": [1], "data": [1.5]},
                       {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["x"]}]
    assert "id" not in json.loads(body)


def test_encode_when_output_goes_to_shared_memory_writes_it_and_sends_no_data() -> None:
    written: dict[ShmRef, np.ndarray] = {}

    def write(ref: ShmRef, array: np.ndarray) -> int:
        written[ref] = array
        return array.nbytes

    ref = ShmRef("out", 0, 64)
    parts, length = encode_response("m", 1, None, {"y": np.ones(2, np.float32)},
                                   [RequestedOutput("y", shm=ref)], True, write_shm=write)
    body = b"".join(parts)
    assert length is None and list(written) == [ref]
    # The bytes the output took, as Triton reports them, not the room the client gave.
    assert json.loads(body)["outputs"][0]["parameters"] == {"shared_memory_region": "out",
                                                            "shared_memory_byte_size": 8}


def test_encode_when_unknown_output_requested_names_the_real_ones() -> None:
    with pytest.raises(InvalidInput, match=r"no output 'nope' \(outputs: y\)"):
        encode_response("m", 1, None, {"y": np.ones(1)}, [RequestedOutput("nope")], False)


def test_round_trip_when_request_encoded_like_a_client_decodes_to_the_same_arrays() -> None:
    rng = np.random.default_rng(0)
    arrays = {"f16": rng.random((2, 3)).astype(np.float16), "u8": np.arange(5, dtype=np.uint8),
              "f64": rng.random(4)}
    header = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": triton_dtype(a.dtype),
                          "parameters": {"binary_data_size": a.nbytes}}
                         for n, a in arrays.items()]}
    body, length = binary_body(header, *(a.tobytes() for a in arrays.values()))
    decoded = decode_request(body, length).inputs
    for name, array in arrays.items():
        np.testing.assert_array_equal(decoded[name], array)
        assert decoded[name].dtype == array.dtype


def test_decode_when_bytes_elements_are_empty_or_not_utf8_keeps_them_exactly() -> None:
    items = [b"", b"\xff\xfe\x00", b"a\x00"]  # a trailing NUL must not be dropped
    raw = b"".join(struct.pack("<I", len(x)) + x for x in items)
    body, length = binary_body({"inputs": [{"name": "s", "shape": [1, 3], "datatype": "BYTES",
                                            "parameters": {"binary_data_size": len(raw)}}]}, raw)
    decoded = decode_request(body, length).inputs["s"]
    assert decoded.dtype == np.object_ and decoded.shape == (1, 3)
    assert list(decoded.reshape(-1)) == items
    as_json = json.dumps({"inputs": [{"name": "s", "shape": [1, 2], "datatype": "BYTES",
                                      "data": [["", "héllo"]]}]}).encode()
    assert list(decode_request(as_json).inputs["s"].reshape(-1)) == [b"", "héllo".encode()]


@pytest.mark.parametrize("data, match", [
    ([1, "a"], "must be strings, element 0 is int"),
    ([None, "a"], "must be strings, element 0 is NoneType"),
    (["\ud800", "a"], "not encodable text"),  # a lone surrogate: JSON allows it, UTF-8 not
], ids=["number", "null", "surrogate"])
def test_decode_when_bytes_json_data_is_not_text_refuses_it(data: list[Any], match: str) -> None:
    body = json.dumps({"inputs": [{"name": "s", "shape": [2], "datatype": "BYTES",
                                   "data": data}]}).encode()
    with pytest.raises(InvalidInput, match=match):
        decode_request(body)


def test_encode_when_bytes_output_is_binary_sends_length_prefixed_elements_exactly() -> None:
    values = np.array([[b"\xff\x00", b"", "héllo"]], dtype=np.object_)  # str: ORT's output
    parts, length = encode_response("m", 1, None, {"s": values},
                                   [RequestedOutput("s", binary=True)], False)
    body = b"".join(parts)
    entry = json.loads(body[:length])["outputs"][0]
    assert entry["datatype"] == "BYTES" and entry["shape"] == [1, 3]
    raw = body[length:]
    assert entry["parameters"] == {"binary_data_size": len(raw)}
    assert raw == b"\x02\x00\x00\x00\xff\x00" + b"\x00" * 4 + b"\x06\x00\x00\x00h\xc3\xa9llo"


def test_encode_when_bytes_output_is_json_sends_text_and_refuses_non_utf8() -> None:
    text = np.array(["", "héllo", b"ok"], dtype=np.object_)
    parts, length = encode_response("m", 1, None, {"s": text}, [], False)
    assert length is None
    assert json.loads(parts[0])["outputs"][0]["data"] == ["", "héllo", "ok"]
    binary = np.array([b"ok", b"\xff"], dtype=np.object_)
    with pytest.raises(InvalidInput, match=r"output s: element 1 is not UTF-8.*binary_data"):
        encode_response("m", 1, None, {"s": binary}, [], False)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.object_])
def test_encode_when_binary_output_has_no_elements_sends_zero_bytes(dtype: Any) -> None:
    # Triton's L0_infer_zero: shape [1, 0] asked for as binary data is a 200, size 0.
    parts, length = encode_response("m", 1, None, {"y": np.zeros((1, 0), dtype)},
                                   [RequestedOutput("y", binary=True)], False)
    body = b"".join(parts)
    assert length == len(body)  # nothing after the JSON
    entry = json.loads(body[:length])["outputs"][0]
    assert entry["shape"] == [1, 0] and entry["parameters"] == {"binary_data_size": 0}


def test_decode_when_an_output_is_requested_twice_refuses_it() -> None:
    body = json.dumps({"inputs": [{"name": "a", "shape": [1], "datatype": "FP32",
                                   "data": [1]}],
                       "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"},
                                   {"name": "OUTPUT0", "parameters": {"binary_data": True}}],
                       }).encode()
    with pytest.raises(InvalidInput, match="output 'OUTPUT0' is requested twice"):
        decode_request(body)


def test_encode_when_binary_data_output_is_set_binary_only_for_outputs_not_named() -> None:
    outputs = {"a": np.ones(2, np.float32), "b": np.zeros(2, np.float32)}
    # Named outputs: binary_data_output does not reach them, only their own binary_data.
    parts, length = encode_response("m", 1, None, outputs,
                                   [RequestedOutput("a"), RequestedOutput("b", binary=True)],
                                   True)
    body = b"".join(parts)
    a, b = json.loads(body[:length])["outputs"]
    assert a["data"] == [1, 1] and "parameters" not in a
    assert b["parameters"] == {"binary_data_size": 8} and len(body) - length == 8
    # No outputs named: every output binary.
    parts, length = encode_response("m", 1, None, outputs, [], True)
    entries = json.loads(b"".join(parts)[:length])["outputs"]
    assert [e["parameters"] for e in entries] == [{"binary_data_size": 8}] * 2


def test_encode_request_when_binary_asks_each_named_output_for_binary_data() -> None:
    parts, length = encode_request({"x": np.ones(1, np.float32)},
                                   [RequestedOutput("a"), RequestedOutput("b", binary=False)])
    header = json.loads(b"".join(parts)[:length])
    assert header["outputs"] == [{"name": "a", "parameters": {"binary_data": True}},
                                 {"name": "b", "parameters": {"binary_data": False}}]


@pytest.mark.parametrize("where, params, match", [
    ("request", {"sequence_id": 7, "sequence_start": True}, "'sequence_id' needs the sequence"),
    ("request", {"sequence_end": True}, "'sequence_end' needs the sequence batcher"),
    ("output", {"classification": 3}, "output y: parameter 'classification' needs"),
])
def test_decode_when_a_parameter_needs_an_unclaimed_feature_refuses_it(
        where: str, params: dict[str, Any], match: str) -> None:
    header: dict[str, Any] = {"inputs": [{"name": "a", "shape": [1], "datatype": "FP32",
                                          "data": [1]}]}
    if where == "request":
        header["parameters"] = params
    else:
        header["outputs"] = [{"name": "y", "parameters": params}]
    with pytest.raises(InvalidInput, match=match):  # never silently ignored
        decode_request(json.dumps(header).encode())


@pytest.mark.parametrize("item", [b"1", b"0.5", b"[1]", b"{}", b'"a"', b'["a"]', b"[[]]",
                                  b'{"k":1}', b"true", b"[0.5,0.5]"])
def test_decode_charges_at_least_what_parsing_the_json_makes(item: bytes) -> None:
    """The flat weight the server charges for a JSON text plus parse_cost() is never less
    than json.loads' peak (tracemalloc) for a request full of one shape, hostile or not."""
    import tracemalloc

    from edged.api.http.budget import JSON_WEIGHT

    n = 20_000
    text = (b'{"inputs": [], "parameters": {"pad": [' + b",".join([item] * n) + b"]}}")
    charged: list[int] = []
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(InvalidInput):  # no inputs: refused, after the parse it charged
            decode_request(text, charge=charged.append)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert charged, "nothing was charged before parsing"
    assert len(text) * JSON_WEIGHT + sum(charged) >= peak, (
        f"{item!r}: parsing peaked at {peak / len(text):.1f}x the text, charged "
        f"{(len(text) * JSON_WEIGHT + sum(charged)) / len(text):.1f}x")
