"""The bench's floor server answers perf_analyzer's requests as edged does: the same outputs for
the same binary or JSON request, the statistics perf_analyzer and the CPU meter read counting
what it served, and the metadata it was given replayed."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edged.api.protocol import HEADER_LENGTH, decode_response, encode_request
from tools.assets import models as test_models
from tools.bench import floor
from tools.bench.broker import free_port
from tools.bench.load import Target, http_request, one

STATS = {"model_stats": [{"name": "tiny_cls", "version": "1", "last_inference": 0,
                          "inference_count": 0, "execution_count": 0,
                          "inference_stats": {k: {"count": 0, "ns": 0} for k in (
                              "success", "fail", "queue", "compute_input", "compute_infer",
                              "compute_output")}}]}


@pytest.fixture
def served(tmp_path: Path) -> tuple[int, Path]:
    models = test_models.write_repository(tmp_path / "models", names=["tiny_cls"])
    path = models / "tiny_cls" / "1" / "model.onnx"
    replies = {"/v2": json.dumps({"name": "edged"}),
               "/v2/models/tiny_cls/stats": json.dumps(STATS)}
    port = free_port()
    with floor.run_floor(tmp_path, port, {"tiny_cls": path}, replies, {"tiny_cls": 1}):
        yield port, path


def _stats(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/tiny_cls/stats") as resp:
        return json.load(resp)


def test_floor_when_sent_binary_and_json_requests_answers_what_the_session_computes(
        served: tuple[int, Path]) -> None:
    port, path = served
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).random((2, 3, 8, 8), dtype=np.float32)
    want = session.run(None, {"x": x})[0]
    before = _stats(port)["model_stats"][0]["inference_stats"]["success"]["count"]
    parts, json_length = encode_request({"x": x}, [], binary=True)
    binary = http_request("/v2/models/tiny_cls/infer", b"".join(parts),
                          {"Content-Type": "application/octet-stream",
                           HEADER_LENGTH: str(json_length)})
    as_json = http_request("/v2/models/tiny_cls/infer", json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 3, 8, 8],
                     "data": x.reshape(-1).tolist()}]}).encode())
    # The first run goes to the pool (its time is not known yet), the next ones run inline.
    for request in (binary, binary, as_json):
        body = one(Target(port=port), request)
        # The JSON header is ASCII: where it ends in the text is where it ends in the bytes.
        _, json_length = json.JSONDecoder().raw_decode(body.decode("latin-1"))
        got = decode_response(body, json_length).outputs["prob"]
        assert (json_length < len(body)) == (request is binary)
        np.testing.assert_allclose(got, want, rtol=1e-6)
    after = _stats(port)["model_stats"][0]
    assert after["inference_stats"]["success"]["count"] == before + 3
    assert after["inference_count"] == before + 3


def test_floor_when_asked_for_what_it_was_not_given_answers_404(
        served: tuple[int, Path]) -> None:
    port, _ = served
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2") as resp:
        assert json.load(resp) == {"name": "edged"}
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/tiny_cls/config")
    assert caught.value.code == 404
    caught.value.close()
