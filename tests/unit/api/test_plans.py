"""Request plans: a header seen before (same bytes, same body length, same model version)
reuses what the full path made of it, and the plan's request and answer are exactly what the
full path would make; anything new or different finds no plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edged.api.plans import MAX_HEADER_BYTES, PlanTable, infer_answer
from edged.api.protocol import (
    RequestedOutput,
    decode_request,
    encode_request,
    encode_response,
)
from edged.inference.batching import Checked
from edged.model.repository import ModelRepository, ModelVersion


@pytest.fixture
def tiny(repo: ModelRepository) -> ModelVersion:
    return repo.get("tiny_cls", 1)


def body_of(inputs: dict[str, Any], outputs: list[RequestedOutput] | None = None,
            binary: bool = True, **extra: Any) -> tuple[memoryview, int | None]:
    parts, json_length = encode_request(inputs, outputs or [], binary=binary, **extra)
    return memoryview(bytearray(b"".join(parts))), json_length


def learned(table: PlanTable, model: ModelVersion, body: memoryview,
            json_length: int | None) -> None:
    parsed = decode_request(body, json_length)
    checked = Checked(model, 1, ((3, 8, 8),), 1, None)
    table.learn("tiny_cls", None, body, json_length, parsed, checked)


def x_of(seed: float) -> np.ndarray:
    return np.random.default_rng(int(seed)).random((1, 3, 8, 8), dtype=np.float32)


def test_plans_when_the_same_header_comes_again_views_the_new_bytes_as_the_full_path_would(
        tiny: ModelVersion) -> None:
    table = PlanTable()
    first, json_length = body_of({"x": x_of(1)}, request_id="r1", parameters={"priority": 1})
    learned(table, tiny, first, json_length)
    again, _ = body_of({"x": x_of(2)}, request_id="r1", parameters={"priority": 1})
    plan = table.find("tiny_cls", None, again, json_length, tiny)
    assert plan is not None and table.hits == 1
    planned, full = plan.request(again), decode_request(again, json_length)
    assert (planned.id, planned.priority, planned.binary_default, planned.outputs) == \
        (full.id, full.priority, full.binary_default, full.outputs)
    np.testing.assert_array_equal(planned.inputs["x"], x_of(2))
    assert planned.inputs["x"].dtype == full.inputs["x"].dtype
    assert np.shares_memory(planned.inputs["x"], np.frombuffer(again, np.uint8))  # no copy


@pytest.mark.parametrize("change", ["header byte", "body length", "model", "version asked"])
def test_plans_when_anything_differs_finds_none(tiny: ModelVersion, repo: ModelRepository,
                                                change: str) -> None:
    table = PlanTable()
    body, json_length = body_of({"x": x_of(1)}, request_id="r1")
    learned(table, tiny, body, json_length)
    model, version = tiny, None
    if change == "header byte":
        body, _ = body_of({"x": x_of(1)}, request_id="r2")
    elif change == "body length":
        body = memoryview(bytearray(bytes(body) + b"\0\0\0\0"))
    elif change == "model":  # a swap or a config change: another ModelVersion
        model = ModelRepository(repo.root).get("tiny_cls", 1)
        assert model is not tiny
    else:
        version = 1
    assert table.find("tiny_cls", version, body, json_length, model) is None
    if change == "model":
        assert len(table) == 0  # a stale plan goes


def test_plans_when_inputs_are_json_reuse_a_read_only_copy_of_the_values(
        tiny: ModelVersion) -> None:
    table = PlanTable()
    body, json_length = body_of({"x": x_of(3)}, binary=False)
    assert json_length is None
    learned(table, tiny, body, json_length)
    plan = table.find("tiny_cls", None, memoryview(bytearray(body)), None, tiny)
    assert plan is not None
    x = plan.request(body).inputs["x"]
    np.testing.assert_array_equal(x, x_of(3))
    assert not x.flags.writeable


@pytest.mark.parametrize("what", ["bytes input", "empty input", "large header"])
def test_plans_when_an_input_cannot_be_planned_learns_nothing(tiny: ModelVersion,
                                                              what: str) -> None:
    table = PlanTable()
    if what == "bytes input":
        body, json_length = body_of({"x": np.array([[b"a", b"bc"]], dtype=object)})
    elif what == "empty input":
        body, json_length = body_of({"x": np.zeros((0, 3, 8, 8), np.float32)})
    else:
        body, json_length = body_of({"x": x_of(1)}, request_id="r" * MAX_HEADER_BYTES)
    learned(table, tiny, body, json_length)
    assert len(table) == 0


def test_plans_when_more_headers_come_than_it_holds_keeps_the_last_used(
        tiny: ModelVersion) -> None:
    table = PlanTable(max_plans=2)
    bodies = [body_of({"x": x_of(1)}, request_id=f"r{i}") for i in range(3)]
    for body, json_length in bodies[:2]:
        learned(table, tiny, body, json_length)
    assert table.find("tiny_cls", None, *bodies[0], tiny) is not None
    learned(table, tiny, *bodies[2])
    assert len(table) == 2
    assert table.find("tiny_cls", None, *bodies[1], tiny) is None
    assert table.find("tiny_cls", None, *bodies[0], tiny) is not None


@pytest.mark.parametrize("outputs,binary", [
    ([], True), ([RequestedOutput("prob", binary=True)], False),
    ([RequestedOutput("prob", binary=False)], True), ([], False)])
def test_plan_encode_when_answering_sends_what_encode_response_sends(
        tiny: ModelVersion, outputs: list[RequestedOutput], binary: bool) -> None:
    table = PlanTable()
    body, json_length = body_of({"x": x_of(1)}, outputs, binary=binary, request_id="r9")
    learned(table, tiny, body, json_length)
    plan = table.find("tiny_cls", None, body, json_length, tiny)
    assert plan is not None
    parsed = decode_request(body, json_length)
    for seed in (1, 2, 3):  # the first makes the template, the rest use it
        answer = {"prob": np.random.default_rng(seed).random((1, 4), dtype=np.float32)}
        got, got_length = plan.encode("tiny_cls", 1, answer)
        want, want_length = encode_response("tiny_cls", 1, "r9", answer, parsed.outputs,
                                            parsed.binary_default)
        assert b"".join(got) == b"".join(want) and got_length == want_length
    other_shape = {"prob": np.zeros((1, 5), np.float32)}  # not the template's: in full
    got, _ = plan.encode("tiny_cls", 2, other_shape)
    want, _ = encode_response("tiny_cls", 2, "r9", other_shape, parsed.outputs,
                              parsed.binary_default)
    assert b"".join(got) == b"".join(want)


def test_plan_encode_when_an_output_is_missing_refuses_as_encode_response(
        tiny: ModelVersion) -> None:
    table = PlanTable()
    body, json_length = body_of({"x": x_of(1)}, [RequestedOutput("prob", binary=True)])
    learned(table, tiny, body, json_length)
    plan = table.find("tiny_cls", None, body, json_length, tiny)
    assert plan is not None
    with pytest.raises(Exception, match="has no output 'prob'"):
        plan.encode("tiny_cls", 1, {"other": np.zeros(1, np.float32)})



@pytest.mark.parametrize("outputs,binary", [([], True), ([RequestedOutput("prob", True)], False),
                                            ([], False)])
def test_plan_answer_when_answering_again_sends_what_the_full_path_sends(
        tiny: ModelVersion, outputs: list[RequestedOutput], binary: bool) -> None:
    table = PlanTable()
    body, json_length = body_of({"x": x_of(1)}, outputs, binary=binary, request_id="r3")
    learned(table, tiny, body, json_length)
    plan = table.find("tiny_cls", None, body, json_length, tiny)
    assert plan is not None
    parsed = decode_request(body, json_length)
    answers = [{"prob": np.random.default_rng(seed).random((1, 4), dtype=np.float32)}
               for seed in (1, 2)]
    answers += [{"prob": np.zeros((2, 4), np.float32)},  # another shape
                {"prob": np.zeros((1, 4), np.float64)},  # another dtype
                {"prob": np.zeros((1, 4), ">f4")}]  # big-endian: swapped on the way out
    for version, answer in [(1, a) for a in answers] + [(2, answers[0])]:
        got = plan.answer("tiny_cls", version, answer)
        want = infer_answer(*encode_response("tiny_cls", version, "r3", answer,
                                             parsed.outputs, parsed.binary_default))
        assert (got.length, got.headers, got.content_type) == \
            (want.length, want.headers, want.content_type)
        assert b"".join(got.parts or [got.body]) == b"".join(want.parts or [want.body])
