"""MQTT 5 request/response inference on a real mosquitto, the daemon in-process: bodies built
by tritonclient's own encoder (JSON and binary) answer what tritonclient gets over HTTP, on the
response topic with the correlation data; errors carry the socket API's codes; a response
topic outside the allowlist gets nothing; the per-client rate holds; and a stream keeps its
frame rate while 8 remote clients (in a process of their own) keep asking."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
from onnx import TensorProto, helper
from support.broker import Broker
from support.daemon import Served, ServeFactory
from support.mqtt_requests import HEADER_LENGTH, Requester, tensor_request
from support.ota import X
from support.polling import wait_until

from tools.assets.demo import write_color_video

TESTS = Path(__file__).parents[1]


def requests_config(*clients: str, models: str = "[]", extra: str = "") -> str:
    entries = ", ".join(f"{{name: {c}, response_topics: ['replies/{c}/#'], models: {models}}}"
                        for c in clients)
    return f"requests: {{enabled: true, clients: [{entries}]{', ' + extra if extra else ''}}}"


@pytest.fixture
def asker(broker: Broker, make_served: ServeFactory
          ) -> Iterator[Callable[..., tuple[Served, Requester, str]]]:
    """`asker(prefix, requests_yaml)`: a daemon answering MQTT requests under `prefix`, and a
    requester for the allowlist's client `a`."""
    opened: list[Requester] = []

    def make(prefix: str, requests: str, name: str = "a") -> tuple[Served, Requester, str]:
        served = make_served(mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, "
                                  f"{requests}")
        assert served.daemon.mqtt is not None and served.daemon.mqtt.wait_connected(10)
        assert served.daemon.mqtt.wait_subscribed([f"{prefix}/infer/+"], 10)
        requester = Requester(broker.port, name)
        opened.append(requester)
        return served, requester, f"{prefix}/infer"

    try:
        yield make
    finally:
        for requester in opened:
            requester.close()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_request_when_asked_answers_what_tritonclient_gets_over_http(
        asker: Callable[..., tuple[Served, Requester, str]], binary: bool) -> None:
    served, requester, infer = asker(f"t/req/{int(binary)}", requests_config("a"))
    body, json_length = tensor_request(X, binary=binary, request_id="r-1",
                                       outputs=[triton.InferRequestedOutput(
                                           "prob", binary_data=binary)])
    assert (json_length is not None) == binary
    answer = requester.call(f"{infer}/tiny_cls", body, json_length=json_length)
    assert answer.status == 200
    length = answer.properties.get(HEADER_LENGTH)
    assert (length is not None) == binary
    assert answer.content_type == ("application/octet-stream" if binary else "application/json")
    got = triton.InferenceServerClient.parse_response_body(
        answer.payload, header_length=int(length) if length else None)
    with triton.InferenceServerClient(served.http) as client:
        tensor = triton.InferInput("x", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X, binary_data=binary)
        expected = client.infer("tiny_cls", [tensor], request_id="r-1", outputs=[
            triton.InferRequestedOutput("prob", binary_data=binary)])
    assert got.get_response()["id"] == "r-1"
    assert got.get_response()["model_version"] == expected.get_response()["model_version"]
    np.testing.assert_array_equal(got.as_numpy("prob"), expected.as_numpy("prob"))


ERRORS = {
    "unknown-model": ("nope_model", lambda: tensor_request(X, binary=True), 404,
                      "model_not_found"),
    "not-json": ("tiny_cls", lambda: (b"{not json", None), 400, "invalid_input"),
    "wrong-input": ("tiny_cls", lambda: tensor_request(X, binary=False, name="y"), 400,
                    "invalid_input"),
    "bad-json-length": ("tiny_cls", lambda: (tensor_request(X, binary=True)[0], 10 ** 9),
                        400, "invalid_input"),
    # The socket's priority rule: tiny_cls has one level, so priority 5 is refused as there.
    "priority-out-of-range": ("tiny_cls", lambda: tensor_request(X, binary=True, priority=5),
                              400, "invalid_input"),
    "oversize": ("tiny_cls", lambda: (b"{" + b" " * (1024 * 1024 + 10) + b"}", None), 413,
                 "too_large"),
    "model-not-allowed": ("tiny_cnn", lambda: tensor_request(X, binary=True), 403,
                          "forbidden"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_request_when_bad_answers_with_the_socket_apis_code(
        asker: Callable[..., tuple[Served, Requester, str]], case: str) -> None:
    model, make, status, code = ERRORS[case]
    _, requester, infer = asker(
        f"t/req/err-{case}", requests_config(
            "a", models="[tiny_cls, nope_model]", extra="max_request_mb: 1"))
    body, json_length = make()
    answer = requester.call(f"{infer}/{model}", body, json_length=json_length)
    assert (answer.status, answer.json()["code"]) == (status, code), answer.json()
    assert answer.content_type == "application/json"
    # The daemon goes on answering.
    good, length = tensor_request(X, binary=True)
    assert requester.call(f"{infer}/tiny_cls", good, json_length=length).status == 200


def test_request_when_the_response_topic_is_not_allowlisted_gets_no_answer(
        broker: Broker, asker: Callable[..., tuple[Served, Requester, str]]) -> None:
    served, requester, infer = asker("t/req/acl", requests_config("a"))
    outsider = Requester(broker.port, "mallory")
    try:
        body, length = tensor_request(X, binary=True)
        outsider.ask(f"{infer}/tiny_cls", body, json_length=length)
        requests = served.daemon.requests
        assert requests is not None
        wait_until(lambda: requests.stats()["not_allowed"] == 1, timeout=10,
                   what="the outsider's request refused")
        # Decided on receipt, before any work: nothing was or will be sent to its topic.
        stats = requests.stats()
        assert stats["answered"] == 0 and stats["errors"] == {} and stats["in_flight"] == 0
        assert requester.call(f"{infer}/tiny_cls", body, json_length=length).status == 200
        assert outsider.other == [] and outsider._answers == {}
        # Nor is a request without a response topic answered (there is nowhere to).
        requester.client.publish(f"{infer}/tiny_cls", body, qos=1).wait_for_publish(5)
        wait_until(lambda: requests.stats()["no_response_topic"] == 1, timeout=10,
                   what="the request without a response topic counted")
    finally:
        outsider.close()


def test_request_when_a_client_exceeds_its_rate_is_answered_rate_limited(
        asker: Callable[..., tuple[Served, Requester, str]]) -> None:
    served, requester, infer = asker("t/req/rate", requests_config(
        "a", extra="rate_per_s: 0.01, burst: 3"))
    body, length = tensor_request(X, binary=True)
    asked = [requester.ask(f"{infer}/tiny_cls", body, json_length=length) for _ in range(5)]
    statuses = [requester.answer(c).status for c in asked]
    assert statuses == [200, 200, 200, 429, 429]
    assert served.daemon.requests is not None
    assert served.daemon.requests.stats()["errors"] == {"rate_limited": 2}


def custom_op_model() -> bytes:
    """A model that ONNX's checker takes and ONNX Runtime cannot load (an op of a domain it
    does not know): its error names the file it was loading."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node("NoSuchOp", ["x"], ["prob"],
                                                domain="com.example")], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                   helper.make_opsetid("com.example", 1)]
                             ).SerializeToString()


def write_broken_models(repo: Path) -> None:
    """Models of the repository that fail on the way to an answer, each with a path in its
    error: not an ONNX file, a folder without versions, a bad model.yaml, an op ORT lacks."""
    for name, files in {"corrupt": {"1/model.onnx": b"not onnx at all"},
                        "empty": {},
                        "badyaml": {"model.yaml": b"max_batch_size: lots\n",
                                    "1/model.onnx": (repo / "tiny_cls/1/model.onnx").read_bytes()},
                        "custom": {"1/model.onnx": custom_op_model()}}.items():
        (repo / name).mkdir()
        for relative, data in files.items():
            (repo / name / relative).parent.mkdir(parents=True, exist_ok=True)
            (repo / name / relative).write_bytes(data)


# An answer's error, by model: its code and what it still says. Each named the file or folder
# on the device (issue 49 #9); the socket's answers, for the device's own users, still do.
BROKEN = {"nope_model": (404, "model_not_found", "model 'nope_model' is not in the repository"),
          "empty": (404, "model_not_found", "model 'empty' has no servable version"),
          "corrupt": (400, "model_invalid", "corrupt/1/model.onnx: not a valid ONNX model"),
          "badyaml": (400, "model_invalid", "badyaml/model.yaml: max_batch_size: expected an "
                                            "integer, got 'lots' (line 1)"),
          "custom": (500, "model_load_failed", "custom/1/model.onnx: ONNX Runtime cannot load "
                                               "it")}
LOCAL_PATH = re.compile(r"(^|[\s'\"(=])(~|\.{1,2})?/[\w.-]")  # a path from a root, home or here


def test_request_when_the_model_fails_answers_its_code_with_no_path_of_the_device(
        asker: Callable[..., tuple[Served, Requester, str]], repo_dir: Path) -> None:
    write_broken_models(repo_dir)
    served, requester, infer = asker("t/req/paths", requests_config("a"))
    body, length = tensor_request(X, binary=True)
    for model, (status, code, says) in BROKEN.items():
        answer = requester.call(f"{infer}/{model}", body, json_length=length)
        error = answer.json()["error"]
        assert (answer.status, answer.json()["code"]) == (status, code), error
        assert says in error, error
        assert str(repo_dir) not in error and "/tmp" not in error, error
        assert not LOCAL_PATH.search(error), error
    with served.client() as client:  # the device's own users are told where
        _, _, raw = client.request("POST", "/v2/models/nope_model/infer", body,
                                   {HEADER_LENGTH: str(length)})
        assert str(repo_dir) in json.loads(raw)["error"]


def other_digits(length: int) -> list[str]:
    """`length` written as int() would also take it, but a header's number is not: its
    Arabic-Indic digits, a sign, an underscore; and "²", a digit to str.isdigit() that int()
    refuses (issue 49 #7: that one was never answered and logged a traceback each time)."""
    text = str(length)
    return ["\u00b2", text.translate(str.maketrans("0123456789", "\u0660\u0661\u0662\u0663"
                                                  "\u0664\u0665\u0666\u0667\u0668\u0669")),
            f"+{text}", f"{text[:-1]}_{text[-1]}"]


def test_request_when_the_json_length_is_not_ascii_digits_is_answered_invalid_input_in_its_rate(
        asker: Callable[..., tuple[Served, Requester, str]],
        caplog: pytest.LogCaptureFixture) -> None:
    served, requester, infer = asker("t/req/digits", requests_config(
        "a", extra="rate_per_s: 0.01, burst: 4"))
    body, length = tensor_request(X, binary=True)
    assert length is not None and length >= 10
    caplog.set_level(logging.INFO)
    answers = [requester.call(f"{infer}/tiny_cls", body, json_length=value)
               for value in other_digits(length)]
    for value, answer in zip(other_digits(length), answers, strict=True):
        assert (answer.status, answer.json()["code"]) == (400, "invalid_input"), value
        assert HEADER_LENGTH in answer.json()["error"]
    # Each took its token like any request: the burst of 4 is spent, the next is refused.
    assert requester.call(f"{infer}/tiny_cls", body, json_length=length).status == 429
    assert served.daemon.requests is not None and served.daemon.mqtt is not None
    assert served.daemon.requests.stats()["errors"] == {"invalid_input": 4, "rate_limited": 1}
    assert served.daemon.mqtt.stats()["handler_errors"] == 0
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


@pytest.mark.slow
def test_request_when_8_remote_clients_keep_asking_a_stream_keeps_its_frame_rate(
        broker: Broker, make_served: ServeFactory, tmp_path: Path) -> None:
    video = write_color_video(tmp_path / "colors.avi", fps=60, frames_per_color=10)
    clients = [f"load-{i}" for i in range(8)]
    prefix = "t/req/load"
    served = make_served(
        cache="preload: [colors]",
        mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}, "
             + requests_config(*clients, extra="rate_per_s: 50, burst: 10"),
        streams=f"[{{name: cam, source: 'file://{video}', model: colors, loop: true, "
                "fps: 20}]")
    pipeline = served.daemon.pipelines[0]
    assert served.daemon.mqtt is not None
    assert served.daemon.mqtt.wait_subscribed([f"{prefix}/infer/+"], 10)

    def frames_in(seconds: float) -> float:
        """The stream's frame rate over a window (a rate needs time to pass: nothing to wait
        on instead)."""
        start, began = pipeline.read_stats().processed, time.monotonic()
        time.sleep(seconds)
        return (pipeline.read_stats().processed - start) / (time.monotonic() - began)

    wait_until(lambda: pipeline.read_stats().processed >= 20, timeout=30,
               what="the stream running")
    alone = frames_in(3.0)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    load = subprocess.Popen([sys.executable, "-m", "support.mqtt_requests", str(broker.port),
                             prefix, "colors", "8", "8"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, text=True)
    try:
        wait_until(lambda: served.daemon.requests is not None and
                   served.daemon.requests.stats()["answered"] >= 50, timeout=30,
                   what="the remote clients being answered", alive=lambda: load.poll() is None,
                   details=lambda: load.stderr.read() if load.poll() is not None and load.stderr
                   else "")
        loaded = frames_in(3.0)
        out, _ = load.communicate(timeout=60)
    finally:
        if load.poll() is None:
            load.kill()
    answered = json.loads(out)["clients"]
    assert all(c.get("200", 0) > 0 for c in answered), answered  # every client was served
    print(f"stream fps alone {alone:.1f}, with 8 remote clients {loaded:.1f}; answers {answered}")
    assert loaded >= 0.8 * alone, (alone, loaded)


def test_request_example_when_run_against_the_demo_model_prints_red(
        broker: Broker, make_served: ServeFactory) -> None:
    """tools/examples/mqtt_request.py, the README's example, as a user runs it."""
    make_served(cache="preload: [colors]",
                mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/req/example, "
                     + requests_config("hmi-1"))
    done = subprocess.run([sys.executable, str(TESTS.parent / "tools/examples/mqtt_request.py"),
                           "--broker", f"127.0.0.1:{broker.port}", "--device", "t/req/example",
                           "--reply", "replies/hmi-1/colors"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    red, green, blue = json.loads(done.stdout.split(":", 1)[1])
    assert red > 0.99 and green < 0.01 and blue < 0.01
