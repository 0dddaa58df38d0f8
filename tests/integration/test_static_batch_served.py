"""Models exported with a static batch dim, served end to end: Triton's own client reads
max_batch_size N from the daemon and infers with requests of 1..N rows (JSON, binary, shared
memory), `edged infer` takes an .npy of one sample, and a stream of real video written by
OpenCV runs on a batch-1 classifier without a failed frame."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from support.broker import Broker, Subscriber
from support.daemon import Served, ServeFactory

from edged.api.protocol import RequestedOutput, ShmRef
from edged.cli import main
from edged.model.int8_report import read_report
from edged.ops.client import SharedRegion
from tools.assets import models as test_models
from tools.assets.demo import color_of, write_color_video


@pytest.fixture
def static_served(repo_dir: Path, make_served: ServeFactory) -> Served:
    test_models.write_repository(repo_dir, names=["colors_b1", "tiny_cnn_b4"])
    return make_served(cache="preload: [colors_b1]")


@pytest.fixture
def triton_client(static_served: Served) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(static_served.http, connection_timeout=30,
                                          network_timeout=30)
    yield client
    client.close()


def images(seed: int, rows: int = 1, size: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 3, size, size), dtype=np.float32)


def reference(served: Served, model: str, x: np.ndarray) -> np.ndarray:
    """What ONNX Runtime itself computes from `model`'s file for `x` alone."""
    path = served.daemon.config.models_dir / model / "1" / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: x})[0])


def test_tritonclient_when_the_graph_has_a_static_batch_reads_max_batch_size_n(
        triton_client: triton.InferenceServerClient) -> None:
    meta = triton_client.get_model_metadata("colors_b1")
    assert meta["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]
    assert meta["outputs"] == [{"name": "prob", "datatype": "FP32", "shape": [-1, 3]}]
    config = triton_client.get_model_config("colors_b1")
    assert (config["max_batch_size"], config["input"][0]["dims"],
            config["edged"]["fixed_batch_size"]) == (1, [3, 64, 64], 1)
    config = triton_client.get_model_config("tiny_cnn_b4")
    assert (config["max_batch_size"], config["input"][0]["dims"],
            config["edged"]["fixed_batch_size"]) == (4, [3, -1, -1], 4)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_when_a_request_fits_the_static_batch_gets_the_models_outputs(
        triton_client: triton.InferenceServerClient, static_served: Served,
        binary: bool) -> None:
    x = images(1)
    given = triton.InferInput("image", [1, 3, 64, 64], "FP32")
    given.set_data_from_numpy(x, binary_data=binary)
    result = triton_client.infer("colors_b1", [given], outputs=[
        triton.InferRequestedOutput("prob", binary_data=binary)])
    np.testing.assert_allclose(result.as_numpy("prob"), reference(static_served, "colors_b1", x),
                               rtol=1e-5, atol=1e-6)


def test_tritonclient_when_a_request_brings_more_rows_than_the_static_batch_is_refused(
        triton_client: triton.InferenceServerClient) -> None:
    given = triton.InferInput("image", [2, 3, 64, 64], "FP32")
    given.set_data_from_numpy(images(2, rows=2), binary_data=True)
    with pytest.raises(triton.InferenceServerException) as refused:
        triton_client.infer("colors_b1", [given])
    assert refused.value.status() == "400"
    assert "batch of 2 is outside 1..1 (its ONNX graph has a fixed batch dim of 1" in \
        refused.value.message()


def test_client_when_a_static_batch_4_model_gets_two_rows_answers_two_by_json_binary_and_shm(
        static_served: Served) -> None:
    x = images(4, rows=2, size=8)  # 1536 bytes in, 40 out
    # tiny_cnn has the same weights with a dynamic batch: the two rows run on their own.
    expected = reference(static_served, "tiny_cnn", x)
    with static_served.client() as client, \
            SharedRegion(f"edged-sb-{os.getpid()}", 4096) as region:
        for binary in (True, False):
            got = client.infer("tiny_cnn_b4", {"image": x}, binary=binary).outputs["logits"]
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        client.register_shm("r", region.key, 4096)
        tensor = region.tensor("r", x)
        result = client.infer("tiny_cnn_b4", {"image": tensor},
                              outputs=[RequestedOutput("logits", shm=ShmRef("r", 3072, 40))])
        assert result.in_shm == {"logits": ("FP32", (2, 5))}
        np.testing.assert_allclose(region.read("FP32", (2, 5), 3072), expected, rtol=1e-5,
                                   atol=1e-6)
        client.unregister_shm("r")


def test_cli_when_inferring_an_npy_without_the_batch_dim_adds_it(
        static_served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = images(5)
    np.save(tmp_path / "one.npy", x[0])  # [3, 64, 64]: one sample, as a user has it
    assert main(["infer", "colors_b1", "-i", str(tmp_path / "one.npy"), "--json",
                 "--socket", str(static_served.socket)]) == 0
    answer = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(answer["outputs"]["prob"],
                               reference(static_served, "colors_b1", x), rtol=1e-5)
    np.save(tmp_path / "bad.npy", images(5, size=32)[0])
    assert main(["infer", "colors_b1", "-i", str(tmp_path / "bad.npy"),
                 "--socket", str(static_served.socket)]) == 1
    assert (f"{tmp_path / 'bad.npy'}: image has shape [3, 32, 32]; the model takes "
            "[-1, 3, 64, 64] or one sample [3, 64, 64]") in capsys.readouterr().err


def test_stream_when_the_model_has_a_static_batch_of_one_classifies_every_frame(
        broker: Broker, repo_dir: Path, make_served: ServeFactory, tmp_path: Path) -> None:
    test_models.write_repository(repo_dir, names=["colors_b1"])
    video = write_color_video(tmp_path / "colors.avi", fps=60, frames_per_color=10)
    topic = "t/static/streams/cam/results"
    sub = Subscriber(broker, topic)
    try:
        served = make_served(
            cache="preload: [colors_b1]",
            mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: t/static, qos_results: 1",
            streams=f"[{{name: cam, source: 'file://{video}', model: colors_b1, loop: true, "
                    "backpressure: block}]")
        messages = sub.collect(topic, until=lambda got: len(got) >= 40, timeout=20,
                               what="40 results")
    finally:
        sub.close()
    for message in (json.loads(m.payload) for m in messages):
        assert message["model"] == "colors_b1"
        assert message["results"]["classes"][0]["label"] == color_of((message["seq"] - 1) % 30,
                                                                     10)
    snapshot = served.daemon.pipelines[0].read_stats().as_dict()
    assert snapshot["failed"] == 0 and snapshot["last_error"] is None


def test_quantize_when_the_graph_has_a_static_batch_of_four_calibrates_and_gates_it(
        repo_dir: Path, tmp_path: Path) -> None:
    test_models.write_repository(repo_dir, names=["tiny_cnn_b4"])
    rng = np.random.default_rng(0)
    np.save(tmp_path / "samples.npy", rng.standard_normal((24, 3, 8, 8)).astype(np.float32))
    # One sample at a time, each filling the graph's four rows: the run gets to the gate.
    code = main(["quantize", "tiny_cnn_b4", "--models-dir", str(repo_dir), "--calibration",
                 str(tmp_path / "samples.npy")])
    report = read_report(repo_dir / "tiny_cnn_b4" / "1")
    assert report is not None
    assert report.calibration["samples"] + report.calibration["held_out"] == 24
    assert report.metrics["top1_agreement"] is not None
    assert code == (0 if report.accepted else 1)
