"""Request bodies within one memory budget (issue 20 #6): past `api.max_bodies_mb` in flight a
request gets 503 `overloaded` and the held ones are answered; JSON tensors are charged at what
parsing makes of them; large JSON is parsed off the event loop, also when it comes before
binary data; a gzip bomb is inflated off the loop and no further than `api.max_request_mb`."""

from __future__ import annotations

import gzip
import json
import threading
import tracemalloc
import zlib

import numpy as np
import pytest
from support.backends import GateBackend
from support.daemon import LOOP_THREAD, ServeFactory, decode_threads
from support.polling import wait_until

from edged.api import kserve as kserve_module
from edged.api.protocol import HEADER_LENGTH

INFER = "/v2/models/tiny_cls/infer"
X = np.zeros((1, 3, 8, 8), np.float32)


def json_infer(batch: int = 1, pad: int = 0) -> bytes:
    """A JSON infer request for tiny_cls; `pad` spaces make its text (not its tensor) larger."""
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [batch, 3, 8, 8],
                        "data": [0.5] * (batch * 192)}]}
    return json.dumps(body).encode() + b" " * pad


def test_api_when_bodies_in_flight_exceed_the_budget_answers_503_and_the_held_ones_go_on(
        gate: GateBackend, make_served: ServeFactory) -> None:
    served = make_served(api="max_bodies_mb: 1")
    budget = served.daemon.api.bodies
    body = json_infer(pad=60_000)  # ~61 kB of JSON, charged ~0.6 MB: one fits, two do not
    gate.reset()
    gate.gate.clear()
    answers: list[int] = []

    def call() -> None:
        with served.client() as client:
            answers.append(client.request("POST", INFER, body)[0])

    held = threading.Thread(target=call)
    held.start()
    gate.wait_calls(1)  # the first is at the model, its body still charged
    assert budget.held >= len(body)
    with served.client() as client:
        status, _, raw = client.request("POST", INFER, body)
        answer = json.loads(raw)
        assert status == 503 and answer["code"] == "overloaded", answer
        assert "max_bodies_mb" in answer["error"]
    gate.gate.set()
    held.join(30)
    assert answers == [200]
    wait_until(lambda: budget.held == 0, what="every charge given back")
    assert budget.refused == 1
    with served.client() as client:
        assert client.request("POST", INFER, body)[0] == 200


def test_api_when_a_body_can_never_fit_the_budget_answers_413(
        make_served: ServeFactory) -> None:
    served = make_served(api="max_bodies_mb: 1")
    with served.client() as client:
        status, _, raw = client.request("POST", INFER, json_infer(pad=200_000))  # ~2 MB charged
        assert status == 413 and json.loads(raw)["code"] == "too_large"
        assert client.request("POST", INFER, json_infer())[0] == 200
    assert served.daemon.api.bodies.held == 0


def test_api_when_json_comes_before_binary_data_parses_it_off_the_loop(
        make_served: ServeFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    served = make_served()
    threads = decode_threads(monkeypatch)
    big = json_infer(pad=kserve_module.DECODE_ON_THREAD_BYTES)
    small = json_infer()
    with served.client() as client:
        for body in (big, small):  # JSON data, announced as the JSON part of a binary request
            status, _, raw = client.request("POST", INFER, body, {HEADER_LENGTH: str(len(body))})
            assert status == 200, raw
    loop = LOOP_THREAD
    assert threads[0] != loop  # the large one: on a worker thread
    assert threads[1] == loop  # a small one is not worth the hand-off


def test_api_when_a_gzip_bomb_arrives_inflates_no_further_than_the_limit_off_the_loop(
        make_served: ServeFactory) -> None:
    served = make_served(api="max_request_mb: 1")
    bomb = gzip.compress(b"\0" * (256 << 20), 9)  # 256 MiB of zeros in ~250 kB
    tracemalloc.start()
    try:
        with served.client() as client:
            status, _, raw = client.request("POST", INFER, bomb, {"Content-Encoding": "gzip"})
            _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    answer = json.loads(raw)
    assert status == 413 and "inflates past" in answer["error"], answer
    assert peak < 32 << 20, f"{peak >> 20} MiB held while refusing a 256 MiB bomb"
    with served.client() as client:
        assert client.ready()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_api_when_a_body_is_compressed_inflates_and_serves_it(
        served: object, encoding: str) -> None:
    body = json_infer(batch=2)
    packed = gzip.compress(body) if encoding == "gzip" else zlib.compress(body)
    with served.client() as client:  # type: ignore[attr-defined]
        status, _, raw = client.request("POST", INFER, packed, {"Content-Encoding": encoding})
        assert status == 200, raw
        assert json.loads(raw)["outputs"][0]["shape"] == [2, 4]


def test_api_when_a_small_json_route_gets_a_large_body_answers_413(served: object) -> None:
    with served.client() as client:  # type: ignore[attr-defined]
        body = b'{"ready": true' + b" " * (1 << 20) + b"}"
        status, _, raw = client.request("POST", "/v2/repository/index", body)
        assert status == 413 and json.loads(raw)["code"] == "too_large"
        assert client.ready()


def test_api_when_json_nests_deeper_than_its_weight_charges_what_parsing_makes(
        make_served: ServeFactory) -> None:
    """~60 kB of `[[1],[1],...]` parses to ~25x its text: past a 1 MB budget that flat 10x
    would have let it into (413 before json.loads runs); as many plain numbers still fit."""
    served = make_served(api="max_bodies_mb: 1")
    nested = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8],
                          "data": [0.5] * 192}],
              "parameters": {"note": [[1]] * 15_000}}
    flat = {**nested, "parameters": {"note": [1] * 30_000}}
    with served.client() as client:
        body = json.dumps(nested, separators=(",", ":")).encode()
        status, _, raw = client.request("POST", INFER, body)
        answer = json.loads(raw)
        assert status == 413 and answer["code"] == "too_large", answer
        status, _, raw = client.request("POST", INFER,
                                        json.dumps(flat, separators=(",", ":")).encode())
        assert status != 413 and json.loads(raw).get("code") != "overloaded", raw[:200]
        assert client.ready()
    assert served.daemon.api.bodies.held == 0
