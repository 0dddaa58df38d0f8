"""Request plans on the served API: a header sent again for the same model version skips the
parse and the checks (the plan is their result), gets the same answer, and anything new or
different (a header byte, the binary part's size, the model version after a swap) takes the
full path, which refuses bad input exactly as it always has."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from support.daemon import Served, record_threads

from edged.api import kserve as kserve_module
from edged.api.plans import PlanTable
from edged.api.protocol import HEADER_LENGTH, RequestedOutput, decode_response, encode_request
from edged.inference import batcher
from tools.assets import models as test_models

PATH = "/v2/models/tiny_cls/infer"


def x_of(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, 3, 8, 8), dtype=np.float32)


def request_body(x: np.ndarray, **extra: Any) -> tuple[bytes, int]:
    parts, json_length = encode_request({"x": x}, [RequestedOutput("prob", binary=True)],
                                        **extra)
    assert json_length is not None
    return b"".join(parts), json_length


@pytest.fixture(autouse=True)
def cheap_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiny_cls's rows count as cheap and its batches as quick whatever this box's load
    (replays run only such models' requests: a run on a slow, shared VM can take longer)."""
    monkeypatch.setattr(batcher, "TOGETHER_MAX_NS", 1 << 60)
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)


@pytest.fixture
def plans(served: Served) -> PlanTable:
    return served.daemon.api.kserve.plans


@pytest.fixture
def full_path(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per request that took the full path (parsed and checked)."""
    return record_threads(monkeypatch, kserve_module, "decode_request")


class Http:
    """One keep-alive connection to the loopback listener."""

    def __init__(self, served: Served) -> None:
        host, port = served.http.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=30)

    def post(self, body: bytes, json_length: int | None, path: str = PATH
             ) -> tuple[int, bytes, dict[str, str]]:
        headers = {"Content-Type": "application/octet-stream"}
        if json_length is not None:
            headers[HEADER_LENGTH] = str(json_length)
        self.conn.request("POST", path, body=body, headers=headers)
        response = self.conn.getresponse()
        return response.status, response.read(), dict(response.getheaders())

    def infer(self, x: np.ndarray, **extra: Any) -> dict[str, Any]:
        status, raw, headers = self.post(*request_body(x, **extra))
        assert status == 200, raw
        answer = decode_response(raw, int(headers[HEADER_LENGTH]))
        return {"version": answer.version, "id": answer.id, "prob": answer.outputs["prob"]}


@pytest.fixture
def client(served: Served) -> Iterator[Http]:
    http_client = Http(served)
    yield http_client
    http_client.conn.close()


def test_plans_when_a_header_comes_again_skip_the_parse_and_answer_the_same(
        served: Served, client: Http, plans: PlanTable, full_path: list[str]) -> None:
    answers = [client.infer(x_of(seed), request_id="r1") for seed in (1, 2, 1)]
    # The same header, other tensor bytes: its connection replays it (edged.api.replays).
    assert len(full_path) == 1 and plans.replays() == 2
    assert answers[0]["id"] == answers[1]["id"] == "r1"
    np.testing.assert_array_equal(answers[0]["prob"], answers[2]["prob"])
    assert not np.array_equal(answers[0]["prob"], answers[1]["prob"])
    checked = client.infer(x_of(2), request_id="r2")  # another header: the full path
    assert len(full_path) == 2
    np.testing.assert_array_equal(checked["prob"], answers[1]["prob"])
    other = Http(served)  # another connection: the plan, found by its header
    again = other.infer(x_of(2), request_id="r1")
    other.conn.close()
    assert len(full_path) == 2 and plans.hits == 1
    np.testing.assert_array_equal(again["prob"], answers[1]["prob"])


def test_plans_when_the_binary_part_has_another_size_refuse_it_as_the_full_path_does(
        client: Http, plans: PlanTable, full_path: list[str]) -> None:
    body, json_length = request_body(x_of(1))
    client.infer(x_of(1))
    status, raw, _ = client.post(body + b"\0" * 4, json_length)
    assert status == 400
    assert json.loads(raw)["error"] == ("the body carries 772 bytes of binary data but the "
                                        "inputs declare 768")
    status, raw, _ = client.post(body[:-4], json_length)
    assert status == 400
    assert json.loads(raw)["error"] == "input x: binary_data_size 768 runs past the body"
    assert len(full_path) == 3 and plans.hits == plans.replays() == 0
    client.infer(x_of(1))  # the plan still serves the right size
    assert len(full_path) == 3 and plans.hits + plans.replays() == 1


@pytest.mark.parametrize("bad,error", [
    ({"shape": [1, 3, 9, 9]}, "input x: 768 bytes of data for 243 FP32 elements"),
    ({"datatype": "INT32"}, "tiny_cls:1: input x has dtype int32, expected float32"),
    ({"shape": [3, 8, 8]}, "send [1, 3, 8, 8] for one sample"),
])
def test_plans_when_input_is_bad_refuse_it_every_time_and_plan_nothing(
        client: Http, plans: PlanTable, bad: dict[str, Any], error: str) -> None:
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8],
                          "parameters": {"binary_data_size": 768}, **bad}]}
    text = json.dumps(header).encode()
    for _ in range(2):
        status, raw, _ = client.post(text + x_of(1).tobytes(), len(text))
        assert status == 400 and error in json.loads(raw)["error"]
    assert len(plans) == 0 and plans.hits == plans.replays() == 0


def test_plans_when_the_model_is_swapped_check_the_new_version_afresh(
        served: Served, client: Http, plans: PlanTable, full_path: list[str]) -> None:
    client.infer(x_of(1))
    client.infer(x_of(1))
    assert len(full_path) == 1
    second = test_models.make_tiny_cls(seed=7)  # other weights: other answers
    served.daemon.repository.install("tiny_cls", 2, {"model.onnx": second.SerializeToString()})
    served.daemon.cache.swap("tiny_cls", 2)
    answers = [client.infer(x_of(1)) for _ in range(3)]
    assert [a["version"] for a in answers] == ["2", "2", "2"]
    # The batcher takes the new version on at the first request after the swap (issue 49,
    # item 1): the old plan is stale and the full path checks the header against version 2
    # once.
    assert len(full_path) == 2
    assert all(np.array_equal(a["prob"], answers[0]["prob"]) for a in answers)


def test_plans_when_outputs_go_to_shared_memory_plan_nothing(
        served: Served, client: Http, plans: PlanTable) -> None:
    header = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8],
                          "parameters": {"binary_data_size": 768}}],
              "outputs": [{"name": "prob", "parameters": {"shared_memory_region": "nope",
                                                          "shared_memory_byte_size": 16}}]}
    text = json.dumps(header).encode()
    status, raw, _ = client.post(text + x_of(1).tobytes(), len(text))
    assert status == 400 and "not registered" in json.loads(raw)["error"]
    assert len(plans) == 0


def test_plans_when_the_request_is_raw_binary_take_the_full_path(
        client: Http, plans: PlanTable, full_path: list[str]) -> None:
    for _ in range(2):
        status, raw, _ = client.post(x_of(1).tobytes(), 0)
        assert status == 200, raw
    assert len(plans) == 0



def test_replays_when_the_body_budget_is_spent_answer_503_as_the_full_path_does(
        served: Served, client: Http, plans: PlanTable) -> None:
    client.infer(x_of(1))
    bodies = served.daemon.api.bodies
    bodies.held = bodies.limit  # every byte of the budget is someone else's
    try:
        status, raw, _ = client.post(*request_body(x_of(2)))
        assert status == 503 and json.loads(raw)["code"] == "overloaded"
        fresh = Http(served)  # the same on a connection that replays nothing
        assert fresh.post(*request_body(x_of(2)))[:2] == (status, raw)
        fresh.conn.close()
    finally:
        bodies.held = 0
    assert plans.replays() == 0  # refused, not run
    client.infer(x_of(2))
    assert plans.replays() == 1 and bodies.held == 0


def test_replays_when_inference_fails_answer_the_full_paths_error(
        served: Served, client: Http, plans: PlanTable, monkeypatch: pytest.MonkeyPatch) -> None:
    client.infer(x_of(1))
    session = served.daemon.cache.acquire_loaded("tiny_cls")
    assert session is not None
    with session:
        def broken(inputs: Any) -> Any:
            raise RuntimeError("the device went away")

        monkeypatch.setattr(session.session, "infer", broken)
        replayed = client.post(*request_body(x_of(2)))
        fresh = Http(served)
        parsed = fresh.post(*request_body(x_of(2)))
        fresh.conn.close()
    assert replayed[0] == parsed[0] == 500
    assert json.loads(replayed[1]) == json.loads(parsed[1])
    assert "the device went away" in json.loads(replayed[1])["error"]
    assert plans.replays() == 1


def test_replays_when_rows_are_not_cheap_run_as_the_usual_path_runs_them(
        served: Served, client: Http, plans: PlanTable, full_path: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batcher, "TOGETHER_MAX_NS", 0)  # as PP-OCR cls: rows too dear
    answers = [client.infer(x_of(seed)) for seed in (1, 2, 1)]
    assert len(full_path) == 1 and plans.replays() == 2  # answered after the turn's reads
    np.testing.assert_array_equal(answers[0]["prob"], answers[2]["prob"])
    fresh = Http(served)
    np.testing.assert_array_equal(fresh.infer(x_of(2), request_id="x")["prob"],
                                  answers[1]["prob"])
    fresh.conn.close()
