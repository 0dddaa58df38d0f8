"""What Triton's own client tests (L0_http, L0_shared_memory, L0_infer_zero) expect of the wire
protocol, wherever edged claims the feature: driven by `tritonclient[http]` on the loopback
listener, and by raw HTTP where that client cannot say the request (a raw binary body,
`binary_data_output` beside named outputs, a malformed framing).

The models are Triton's identity models as ONNX (tools/test_models.py): INPUT0
[batch, n] → OUTPUT0, one of strings (BYTES) and one of FP32."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as triton_shm
from support.backends import GateBackend
from support.daemon import LOOP_THREAD, Served, ServeFactory, record_threads
from support.polling import wait_until
from tritonclient.utils import (
    InferenceServerException,
    serialize_byte_tensor,
    serialized_byte_size,
)

from edged.api import kserve as kserve_module
from edged.api.protocol import HEADER_LENGTH
from tools.assets import models as test_models

IDENTITIES = ["identity_bytes", "identity_bytes_1", "identity_fp32"]
TEXT = np.array([[b"hello", b"", "héllo".encode()]], dtype=np.object_)


@pytest.fixture
def identities(make_served: ServeFactory, repo_dir: Path) -> Served:
    test_models.write_repository(repo_dir, names=IDENTITIES)
    return make_served(cache=f"preload: [tiny_cls, {', '.join(IDENTITIES)}]")


@pytest.fixture
def client(identities: Served) -> Iterator[triton.InferenceServerClient]:
    made = triton.InferenceServerClient(identities.http, connection_timeout=30,
                                        network_timeout=30)
    yield made
    made.close()


def identity(client: triton.InferenceServerClient, model: str, data: np.ndarray, *,
             binary_in: bool, binary_out: bool, datatype: str = "BYTES") -> triton.InferResult:
    given = triton.InferInput("INPUT0", list(data.shape), datatype)
    given.set_data_from_numpy(data, binary_data=binary_in)
    return client.infer(model, [given],
                        outputs=[triton.InferRequestedOutput("OUTPUT0", binary_data=binary_out)])


def as_bytes(array: np.ndarray) -> list[bytes]:
    """tritonclient gives JSON BYTES as str and binary ones as bytes."""
    return [v.encode() if isinstance(v, str) else bytes(v) for v in array.reshape(-1)]


@pytest.mark.parametrize("binary_in", [False, True], ids=["json_in", "binary_in"])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json_out", "binary_out"])
def test_bytes_when_sent_through_a_string_identity_come_back_unchanged(
        client: triton.InferenceServerClient, binary_in: bool, binary_out: bool) -> None:
    # Case 1: ["hello", "ab"] came back as ["b'hello'", "b'ab'"] (repr of Python bytes).
    result = identity(client, "identity_bytes", TEXT, binary_in=binary_in,
                      binary_out=binary_out)
    out = result.as_numpy("OUTPUT0")
    assert out.shape == (1, 3) and as_bytes(out) == as_bytes(TEXT)
    entry = result.get_output("OUTPUT0")
    assert entry["datatype"] == "BYTES"
    assert ("binary_data_size" in entry.get("parameters", {})) == binary_out


def test_bytes_when_not_utf8_answers_400_for_that_request_and_keeps_serving(
        client: triton.InferenceServerClient) -> None:
    bad = np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_)
    with pytest.raises(InferenceServerException) as refused:
        identity(client, "identity_bytes", bad, binary_in=True, binary_out=True)
    assert refused.value.status() == "400"
    assert "element 1 is not UTF-8" in str(refused.value)
    good = identity(client, "identity_bytes", TEXT, binary_in=True, binary_out=True)
    assert as_bytes(good.as_numpy("OUTPUT0")) == as_bytes(TEXT)


def test_bytes_when_in_and_out_of_system_shared_memory_round_trip(
        client: triton.InferenceServerClient) -> None:
    # Case 3: a BYTES output to shared memory was a 400; Triton writes it length-prefixed.
    serialized = serialize_byte_tensor(TEXT)  # Triton's length-prefixed elements
    size = serialized_byte_size(serialized)
    key = f"/edged-bytes-{os.getpid()}"
    region_in = triton_shm.create_shared_memory_region("in", key + "-in", size)
    region_out = triton_shm.create_shared_memory_region("out", key + "-out", 256)
    try:
        triton_shm.set_shared_memory_region(region_in, [serialized])
        client.register_system_shared_memory("in", key + "-in", size)
        client.register_system_shared_memory("out", key + "-out", 256)
        given = triton.InferInput("INPUT0", [1, 3], "BYTES")
        given.set_shared_memory("in", size)
        wanted = triton.InferRequestedOutput("OUTPUT0")
        wanted.set_shared_memory("out", 256)
        result = client.infer("identity_bytes", [given], outputs=[wanted])
        params = result.get_output("OUTPUT0")["parameters"]
        assert params == {"shared_memory_region": "out", "shared_memory_byte_size": size}
        got = triton_shm.get_contents_as_numpy(region_out, np.object_, [1, 3])
        assert as_bytes(got) == as_bytes(TEXT)
        client.unregister_system_shared_memory()
    finally:
        triton_shm.destroy_shared_memory_region(region_in)
        triton_shm.destroy_shared_memory_region(region_out)


@pytest.mark.parametrize("model, datatype, dtype", [
    ("identity_fp32", "FP32", np.float32), ("identity_bytes", "BYTES", np.object_)])
@pytest.mark.parametrize("binary_out", [False, True], ids=["json_out", "binary_out"])
def test_zero_element_tensors_when_inferred_come_back_empty(
        client: triton.InferenceServerClient, model: str, datatype: str, dtype: type,
        binary_out: bool) -> None:
    # Case 2: shape [1, 0] asked for as binary was a 500 (memoryview cannot cast it).
    result = identity(client, model, np.zeros((1, 0), dtype), binary_in=True,
                      binary_out=binary_out, datatype=datatype)
    entry = result.get_output("OUTPUT0")
    assert entry["shape"] == [1, 0]
    if binary_out:
        assert entry["parameters"] == {"binary_data_size": 0}
    assert result.as_numpy("OUTPUT0").shape == (1, 0)


def test_outputs_when_one_is_requested_twice_answers_400(
        client: triton.InferenceServerClient) -> None:
    # Case 5: two OUTPUT0 entries came back with a 200.
    given = triton.InferInput("INPUT0", [1, 2], "FP32")
    given.set_data_from_numpy(np.ones((1, 2), np.float32))
    twice = [triton.InferRequestedOutput("OUTPUT0"), triton.InferRequestedOutput("OUTPUT0")]
    with pytest.raises(InferenceServerException) as refused:
        client.infer("identity_fp32", [given], outputs=twice)
    assert refused.value.status() == "400" and "requested twice" in str(refused.value)


def post(served: Served, path: str, body: bytes,
         headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    with served.client() as edged:
        status, got, raw = edged.request("POST", path, body, headers)
    return status, dict(got), raw


def raw_outputs(headers: dict[str, str], raw: bytes) -> tuple[dict, bytes]:
    """A binary answer's one output entry and its bytes, as Triton's clients read them: the
    JSON's length from Inference-Header-Content-Length (issue 41 #3: it was missing)."""
    assert HEADER_LENGTH in headers, headers
    length = int(headers[HEADER_LENGTH])
    (out,) = json.loads(raw[:length])["outputs"]
    assert out["parameters"]["binary_data_size"] == len(raw) - length
    return out, raw[length:]


def test_raw_binary_request_when_the_body_is_the_one_inputs_bytes_answers_binary_data(
        identities: Served) -> None:
    # Case 4: Inference-Header-Content-Length 0 was a 400 ("malformed JSON"); then its outputs
    # came back as JSON with no Inference-Header-Content-Length (L0_http test_raw_binary).
    values = np.arange(5, dtype=np.float32)
    octets = {HEADER_LENGTH: "0", "Content-Type": "application/octet-stream"}
    status, headers, raw = post(identities, "/v2/models/identity_fp32/infer",
                                values.tobytes(), octets)
    assert status == 200, raw
    out, data = raw_outputs(headers, raw)
    assert out["shape"] == [1, 5] and data == values.tobytes()  # a batch of one
    assert headers["Content-Type"] == "application/octet-stream"
    status, headers, raw = post(identities, "/v2/models/identity_bytes_1/infer",
                                b"\x00raw \xc3\xa9", octets)
    assert status == 200, raw
    out, data = raw_outputs(headers, raw)  # L0_http test_byte: the element, length-prefixed
    assert out["shape"] == [1, 1] and data == b"\x07\x00\x00\x00\x00raw \xc3\xa9"


def test_raw_binary_request_when_a_bytes_input_may_hold_more_than_one_element_answers_400(
        identities: Served) -> None:
    # L0_http test_byte_too_many_elements: a BYTES input of [-1] was answered 200.
    status, _, raw = post(identities, "/v2/models/identity_bytes/infer", b"427",
                          {HEADER_LENGTH: "0"})
    assert status == 400, raw
    assert "the model must have input shape [1]" in json.loads(raw)["error"]


def test_raw_binary_request_when_a_large_bytes_element_comes_copies_it_off_the_loop(
        identities: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """A BYTES element is copied out of the body (charged to the body budget): for a large
    one, on a worker thread; a small one is not worth the hand-off."""
    threads = record_threads(monkeypatch, kserve_module, "decode_raw")
    octets = {HEADER_LENGTH: "0", "Content-Type": "application/octet-stream"}
    large = b"edge" * (kserve_module.DECODE_ON_THREAD_BYTES // 4 + 1)
    for body in (large, b"small"):
        status, headers, raw = post(identities, "/v2/models/identity_bytes_1/infer", body,
                                    octets)
        assert status == 200, raw[:300]
        assert raw_outputs(headers, raw)[1][4:] == body
    assert threads[0] != LOOP_THREAD and threads[1] == LOOP_THREAD
    assert identities.daemon.api.bodies.held == 0


@pytest.mark.parametrize("model, body, match", [
    ("tiny_two_input", b"\x00" * 16, "needs a model with one input; this one has 2"),
    ("tiny_cnn", b"\x00" * 12, "2 dynamic dims"),
    ("tiny_cls", b"\x00" * 16, r"16 bytes for input x \[3, 8, 8\] \(768 expected\)"),
    ("identity_fp32", b"\x00" * 6, "not a whole number of float32 elements"),
])
def test_raw_binary_request_when_the_shape_cannot_be_told_answers_400(
        make_served: ServeFactory, repo_dir: Path, model: str, body: bytes,
        match: str) -> None:
    test_models.write_repository(repo_dir, names=["identity_fp32"])
    served = make_served(cache="")
    status, headers, raw = post(served, f"/v2/models/{model}/infer", body,
                                {HEADER_LENGTH: "0"})
    assert status == 400 and headers["Content-Type"].startswith("application/json")
    assert re.search(match, json.loads(raw)["error"]), raw


@pytest.mark.parametrize("model, datatype, value", [("identity_fp32", "FP32", 123),
                                                    ("identity_bytes", "BYTES", "hello")])
def test_json_when_data_nests_deeper_than_100_answers_400_as_triton(
        identities: Served, model: str, datatype: str, value: object) -> None:
    # L0_http test_json_recursion_depth_limit: 120 levels were accepted (200).
    def request(depth: int) -> tuple[int, dict[str, str], bytes]:
        data: object = value
        for _ in range(depth):
            data = [data]
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": datatype,
                                       "shape": [1, 1], "data": data}]}).encode()
        return post(identities, f"/v2/models/{model}/infer", body,
                    {"Content-Type": "application/json"})

    status, _, raw = request(120)
    assert status == 400, raw[:200]
    assert "JSON nesting depth exceeds maximum allowed limit (100)" in json.loads(raw)["error"]
    status, _, raw = request(50)
    assert status == 200, raw[:200]
    assert json.loads(raw)["outputs"][0]["shape"] == [1, 1]


def test_binary_data_output_when_outputs_are_named_answers_those_without_binary_data_as_json(
        identities: Served) -> None:
    # Case 7: an output named without its own binary_data came back binary.
    body = json.dumps({
        "inputs": [{"name": "a", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]},
                   {"name": "b", "datatype": "FP32", "shape": [1, 4], "data": [1, 1, 1, 1]}],
        "outputs": [{"name": "sum"}, {"name": "dot", "parameters": {"binary_data": True}}],
        "parameters": {"binary_data_output": True}}).encode()
    status, headers, raw = post(identities, "/v2/models/tiny_two_input/infer", body,
                                {"Content-Type": "application/json"})
    assert status == 200
    length = int(headers[HEADER_LENGTH])
    total, dot = json.loads(raw[:length])["outputs"]
    assert len(total["data"]) == 4 and "parameters" not in total  # JSON, not binary
    assert dot["parameters"] == {"binary_data_size": 4} and len(raw) == length + 4


def test_request_when_chunked_and_content_length_both_answers_a_json_400(
        identities: Served) -> None:
    request = (b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: edged\r\n"
               b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(identities.socket))
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)  # all sent: the daemon need not linger for more
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 400 ", head), head
    assert b"content-type: application/json" in head.lower()
    error = json.loads(body)
    assert error["code"] == "http" and "Content-Length" in error["error"]
    with identities.client() as edged:
        assert edged.request("GET", "/v2/health/ready")[0] == 200  # and it still serves


def test_shm_when_unregistered_with_requests_in_flight_serves_each_then_goes(
        gate: GateBackend, make_served: ServeFactory) -> None:
    # Case 6: the in-flight request failed after the model ran ("... is not registered").
    # Issue 41 #3: requests on the region placed after the unregister, while the first still
    # held it, were refused ("being unregistered"): 1 of 4 results (L0_shared_memory
    # test_unregister_shm_during_inference_multiple_req_http counts them all).
    served = make_served()
    x = np.random.default_rng(6).random((1, 3, 8, 8), dtype=np.float32)
    key = f"/edged-hold-{os.getpid()}"
    region_in = triton_shm.create_shared_memory_region("in", key + "-in", x.nbytes)
    region_out = triton_shm.create_shared_memory_region("out", key + "-out", 16)
    client = triton.InferenceServerClient(served.http, connection_timeout=30,
                                          network_timeout=30)
    answers: list[object] = []

    def infer_in_flight() -> None:
        own = triton.InferenceServerClient(served.http, connection_timeout=30,
                                           network_timeout=30)
        try:
            given = triton.InferInput("x", [1, 3, 8, 8], "FP32")
            given.set_shared_memory("in", x.nbytes)
            wanted = triton.InferRequestedOutput("prob")
            wanted.set_shared_memory("out", 16)
            answers.append(own.infer("tiny_cls", [given], outputs=[wanted]).get_response())
        except Exception as exc:  # reported by the main thread's asserts
            answers.append(exc)
        finally:
            own.close()

    workers = [threading.Thread(target=infer_in_flight) for _ in range(4)]
    try:
        triton_shm.set_shared_memory_region(region_in, [x])
        client.register_system_shared_memory("in", key + "-in", x.nbytes)
        client.register_system_shared_memory("out", key + "-out", 16)
        gate.reset()
        gate.gate.clear()
        workers[0].start()
        gate.wait_calls(1)  # the model is running the first request now
        client.unregister_system_shared_memory()
        # As in Triton: still listed while requests hold them, and theirs to use.
        assert {r["name"] for r in client.get_system_shared_memory_status()} == {"in", "out"}
        for worker in workers[1:]:
            worker.start()
        batcher = served.daemon.scheduler.batchers()[0]
        wait_until(lambda: batcher.depth == 3, what="three more requests queued")
        gate.gate.set()
        for worker in workers:
            worker.join(30)
            assert not worker.is_alive()
        assert len(answers) == 4 and all(isinstance(a, dict) for a in answers), answers
        assert all(a["outputs"][0]["parameters"]["shared_memory_region"] == "out"  # type: ignore[index]
                   for a in answers)
        model = served.daemon.config.models_dir / "tiny_cls" / "1" / "model.onnx"
        session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        got = triton_shm.get_contents_as_numpy(region_out, np.float32, [1, 4])
        np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5)
        assert client.get_system_shared_memory_status() == []  # gone with the last of them
        with pytest.raises(InferenceServerException, match="not registered"):
            late = triton.InferInput("x", [1, 3, 8, 8], "FP32")
            late.set_shared_memory("in", x.nbytes)
            client.infer("tiny_cls", [late])
    finally:
        gate.gate.set()
        client.close()
        triton_shm.destroy_shared_memory_region(region_in)
        triton_shm.destroy_shared_memory_region(region_out)
