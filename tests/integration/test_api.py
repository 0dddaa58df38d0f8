"""The socket API against real clients: Triton's own `tritonclient[http]` on the loopback
listener, `curl --unix-socket`, and edged's client over the Unix socket."""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as triton_shm
from support.daemon import LOOP_THREAD, Served, ServeFactory, record_threads

from edged.api.http import listeners
from edged.api.protocol import RequestedOutput, ShmRef
from edged.cli import main
from edged.ops.client import SharedRegion
from tools.assets import models as test_models


def cls_input(seed: int = 0, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 3, 8, 8), dtype=np.float32)


def reference(served: Served, x: np.ndarray, model: str = "tiny_cls") -> np.ndarray:
    """What ONNX Runtime itself computes from the model file."""
    path = served.daemon.config.models_dir / model / "1" / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: x})[0])


@pytest.fixture
def triton_client(served: Served) -> Iterator[triton.InferenceServerClient]:
    client = triton.InferenceServerClient(served.http, connection_timeout=30,
                                          network_timeout=30)
    yield client
    client.close()


def test_tritonclient_when_asking_health_and_metadata_gets_kserve_answers(
        triton_client: triton.InferenceServerClient) -> None:
    assert triton_client.is_server_live() and triton_client.is_server_ready()
    meta = triton_client.get_server_metadata()
    assert meta["name"] == "edged" and "system_shared_memory" in meta["extensions"]
    model = triton_client.get_model_metadata("tiny_cls")
    assert model["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 3, 8, 8]}]
    assert model["outputs"] == [{"name": "prob", "datatype": "FP32", "shape": [-1, 4]}]
    assert triton_client.is_model_ready("tiny_cls")
    assert not triton_client.is_model_ready("tiny_cnn")  # served, but not loaded yet
    config = triton_client.get_model_config("tiny_cls")
    assert config["max_batch_size"] == 16 and config["input"][0]["dims"] == [3, 8, 8]


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_tritonclient_when_inferring_gets_the_models_outputs(
        triton_client: triton.InferenceServerClient, served: Served, binary: bool) -> None:
    x = cls_input(1, rows=2)
    given = triton.InferInput("x", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=binary)
    result = triton_client.infer("tiny_cls", [given], request_id="req-7",
                                 outputs=[triton.InferRequestedOutput("prob",
                                                                      binary_data=binary)])
    response = result.get_response()
    assert response["id"] == "req-7" and response["model_version"] == "1"
    np.testing.assert_allclose(result.as_numpy("prob"), reference(served, x),
                               rtol=1e-5, atol=1e-6)


def test_tritonclient_when_using_system_shared_memory_reads_and_writes_regions(
        triton_client: triton.InferenceServerClient, served: Served,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over TCP, each use of a region looks its asker up in the kernel's socket table (a read
    of /proc/net/tcp): on a worker thread, never on the event loop."""
    lookups = record_threads(monkeypatch, listeners, "_tcp_peer_uid")
    x = cls_input(2)
    key = f"/edged-test-{os.getpid()}"
    region_in = triton_shm.create_shared_memory_region("in", key + "-in", x.nbytes)
    region_out = triton_shm.create_shared_memory_region("out", key + "-out", 16)
    try:
        triton_shm.set_shared_memory_region(region_in, [x])
        triton_client.register_system_shared_memory("in", key + "-in", x.nbytes)
        triton_client.register_system_shared_memory("out", key + "-out", 16)
        status = triton_client.get_system_shared_memory_status()
        assert {r["name"] for r in status} == {"in", "out"}
        given = triton.InferInput("x", list(x.shape), "FP32")
        given.set_shared_memory("in", x.nbytes)
        wanted = triton.InferRequestedOutput("prob", binary_data=True)
        wanted.set_shared_memory("out", 16)
        result = triton_client.infer("tiny_cls", [given], outputs=[wanted])
        out = result.get_output("prob")
        assert out["parameters"]["shared_memory_region"] == "out"
        got = triton_shm.get_contents_as_numpy(region_out, np.float32, [1, 4])
        np.testing.assert_allclose(got, reference(served, x), rtol=1e-5)
        triton_client.unregister_system_shared_memory()
        assert triton_client.get_system_shared_memory_status() == []
    finally:
        triton_shm.destroy_shared_memory_region(region_in)
        triton_shm.destroy_shared_memory_region(region_out)
    assert len(lookups) >= 6  # two registers, statuses, the infer, the unregister
    assert LOOP_THREAD not in lookups


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_when_calling_the_unix_socket_gets_health_and_an_inference(served: Served) -> None:
    def curl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["curl", "-sS", "--max-time", "20", "--unix-socket",
                               str(served.socket), *args], capture_output=True, text=True,
                              timeout=30, check=True)

    assert json.loads(curl("http://edged/v2/health/ready").stdout) == {"ready": True}
    x = cls_input(3)
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3, 8, 8],
                        "data": x.reshape(-1).tolist()}]}
    answer = json.loads(curl("-X", "POST", "-H", "Content-Type: application/json",
                             "-d", json.dumps(body),
                             "http://edged/v2/models/tiny_cls/infer").stdout)
    prob = answer["outputs"][0]
    assert prob["name"] == "prob" and prob["shape"] == [1, 4]
    np.testing.assert_allclose(np.array(prob["data"]).reshape(1, 4),
                               reference(served, x), rtol=1e-5)


def test_client_when_inferring_over_the_socket_by_binary_json_and_shm_agrees(
        served: Served) -> None:
    x = cls_input(4, rows=3)
    expected = reference(served, x)
    with served.client() as client, SharedRegion(f"edged-t-{os.getpid()}", 4096) as region:
        for binary in (True, False):
            got = client.infer("tiny_cls", {"x": x}, binary=binary).outputs["prob"]
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        client.register_shm("r", region.key, 4096)
        tensor = region.tensor("r", x)
        result = client.infer("tiny_cls", {"x": tensor},
                              outputs=[RequestedOutput("prob", shm=ShmRef("r", 2048, 48))])
        assert result.in_shm == {"prob": ("FP32", (3, 4))} and result.outputs == {}
        np.testing.assert_allclose(region.read("FP32", (3, 4), 2048), expected, rtol=1e-5)
        client.unregister_shm("r")
        assert client.shm_status() == []


def test_client_when_listing_models_shows_state_backend_and_providers(served: Served) -> None:
    with served.client() as client:
        rows = {r["name"]: r for r in client.models()}
        assert rows["tiny_cls"]["state"] == "READY"
        assert rows["tiny_cls"]["providers"] == ["CPUExecutionProvider"]
        assert rows["tiny_cnn"]["state"] == "UNAVAILABLE"
        client.load("tiny_cnn")
        assert client.model_ready("tiny_cnn")
        client.unload("tiny_cnn")
        assert not client.model_ready("tiny_cnn")
        assert [r["name"] for r in client.models(ready_only=True)] == ["tiny_cls"]


def test_socket_when_served_has_mode_0660_and_is_removed_on_stop(
        make_served: ServeFactory) -> None:
    served = make_served()
    assert stat.S_IMODE(os.stat(served.socket).st_mode) == 0o660
    served.daemon.request_stop()
    assert served.daemon.stopped_event.wait(30)
    assert not served.socket.exists()


def test_metrics_when_requests_ran_count_them_with_triton_names(served: Served) -> None:
    with served.client() as client:
        for seed in range(3):
            client.infer("tiny_cls", {"x": cls_input(seed)})
        text = client.metrics()
    labels = '{model="tiny_cls",version="1"}'
    assert f"edged_inference_request_success_total{labels} 3.0" in text
    assert f"edged_inference_count_total{labels} 3.0" in text
    assert f"edged_inference_exec_count_total{labels}" in text
    assert f"edged_inference_compute_infer_duration_us_total{labels}" in text
    assert f"edged_inference_queue_duration_us_total{labels}" in text
    assert f"edged_model_ready{labels} 1.0" in text
    assert f"edged_model_load_duration_seconds{labels}" in text  # tiny_cls was preloaded
    assert 'edged_model_loads_total{model="tiny_cls",outcome="ok"} 1.0' in text
    assert "process_resident_memory_bytes" in text
    assert "edged_mqtt_" not in text  # MQTT is off here


def test_cli_when_listing_models_prints_version_backend_providers_and_state(
        served: Served, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--socket", str(served.socket)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["MODEL", "VERSION", "STATE", "BACKEND", "PROVIDERS", "/", "REASON"]
    rows = {line.split()[0]: line for line in lines[1:]}
    assert rows["tiny_cls"].split() == ["tiny_cls", "1", "READY", "onnxruntime",
                                        "CPUExecutionProvider"]
    assert "loads on first request" in rows["tiny_cnn"]


def test_cli_when_inferring_an_npy_and_an_image_prints_outputs(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An image goes in as the model's stated `preprocess` says (tiny_cnn's: RGB, x1/255);
    tiny_cls states none, so an image for it is refused naming the keys (nothing guessed)."""
    (repo_dir / "tiny_cnn" / "model.yaml").write_text(
        test_models.MODEL_YAML["tiny_cnn"] + "preprocess: {color: rgb}\n")  # x1/255: the default
    served = make_served()
    x = cls_input(5)
    np.save(tmp_path / "x.npy", x)
    assert main(["infer", "tiny_cls", "-i", str(tmp_path / "x.npy"), "--json",
                 "--socket", str(served.socket)]) == 0
    answer = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(answer["outputs"]["prob"], reference(served, x), rtol=1e-5)
    frame = np.random.default_rng(0).integers(0, 255, (12, 16, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / "frame.png"), frame)  # lossless: the tensor is exactly known
    assert main(["infer", "tiny_cnn", "-i", f"image={tmp_path / 'frame.png'}",
                 "--socket", str(served.socket)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny_cnn:1\nlogits float32 [1, 5]")
    expected = reference(served, (frame[:, :, ::-1] / 255).transpose(2, 0, 1)[None]
                         .astype(np.float32), "tiny_cnn")
    printed = np.array(out.split("[[")[1].split("]]")[0].split(), np.float32)
    np.testing.assert_allclose(printed, expected[0], atol=1e-4)
    assert main(["infer", "tiny_cls", "-i", str(tmp_path / "frame.png"),
                 "--socket", str(served.socket)]) == 1
    assert "tiny_cls:1: no pre-processing is known for images" in capsys.readouterr().err


def test_cli_when_daemon_is_not_running_says_so(
        short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "--socket", str(short_dir / "none.sock")]) == 1
    assert "No such file or directory" in capsys.readouterr().err


def test_tritonclient_when_asking_statistics_gets_tritons_schema_with_real_counts(
        triton_client: triton.InferenceServerClient, served: Served) -> None:
    assert "statistics" in triton_client.get_server_metadata()["extensions"]
    x = cls_input(3, rows=2)
    given = triton.InferInput("x", list(x.shape), "FP32")
    given.set_data_from_numpy(x)
    for _ in range(3):
        triton_client.infer("tiny_cls", [given])
    (row,) = triton_client.get_inference_statistics("tiny_cls")["model_stats"]
    assert (row["name"], row["version"]) == ("tiny_cls", "1")
    assert row["inference_count"] == 6 and row["execution_count"] >= 3 - 1  # 2 may batch
    stats = row["inference_stats"]
    assert stats["success"]["count"] == 3 and stats["success"]["ns"] > 0
    assert stats["fail"] == {"count": 0, "ns": 0}
    assert stats["compute_infer"]["count"] == 3 and stats["queue"]["count"] == 3
    assert sum(b["compute_infer"]["count"] for b in row["batch_stats"]) == \
        row["execution_count"]
    assert row["last_inference"] > 1_700_000_000_000  # ms since the epoch
    every = triton_client.get_inference_statistics()["model_stats"]
    assert {(r["name"], r["version"]) for r in every} >= {("tiny_cls", "1"), ("colors", "1")}
    idle = next(r for r in every if r["name"] == "colors")
    assert idle["inference_stats"]["success"]["count"] == 0  # served, not run yet
    with pytest.raises(triton.InferenceServerException) as missing:
        triton_client.get_inference_statistics("no_such_model")
    assert missing.value.status() == "404"


def test_infer_when_the_model_is_unknown_answers_404_before_reading_the_body(
        served: Served) -> None:
    with served.client() as client:
        status, _headers, raw = client.request("POST", "/v2/models/no_such_model/infer",
                                               [b"{not json"])
    assert status == 404 and b"no_such_model" in raw


def test_tritonclient_when_the_config_names_no_preload_finds_every_model_ready_at_start(
        make_served: ServeFactory) -> None:
    served = make_served(cache="")  # cache.preload unset: `all`, as Triton loads everything
    client = triton.InferenceServerClient(served.http, connection_timeout=30,
                                          network_timeout=30)
    try:
        index = client.get_model_repository_index()
        assert {m["name"] for m in index} == {"colors", "tiny_cls", "tiny_cnn", "tiny_nobatch",
                                             "tiny_two_input"}
        assert all(client.is_model_ready(m["name"]) for m in index)
    finally:
        client.close()


def test_tritonclient_when_setting_log_settings_changes_the_daemons_level(
        triton_client: triton.InferenceServerClient) -> None:
    assert "logging" in triton_client.get_server_metadata()["extensions"]
    root = logging.getLogger()
    before = root.level
    try:
        settings = triton_client.update_log_settings({"log_verbose_level": 1})
        assert settings["log_verbose_level"] == 1 and root.level == logging.DEBUG
        settings = triton_client.update_log_settings({"log_verbose_level": 0,
                                                      "log_info": False})
        assert (settings["log_info"], settings["log_warning"]) == (False, True)
        assert root.level == logging.WARNING
        assert triton_client.get_log_settings() == settings
        with pytest.raises(triton.InferenceServerException) as refused:
            triton_client.update_log_settings({"log_file": "/tmp/x.log"})
        assert refused.value.status() == "400" and "journal" in str(refused.value)
    finally:
        root.setLevel(before)


def test_cli_when_an_input_file_is_missing_names_it(
        served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "gone.jpg"
    assert main(["infer", "colors", "-i", str(missing), "--socket", str(served.socket)]) == 1
    assert capsys.readouterr().err == f"edged: --input {missing}: no such file\n"


def test_cli_when_inferring_an_image_on_a_classifier_prints_its_labels_and_raw_on_request(
        served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    frame = np.zeros((48, 64, 3), np.uint8)
    frame[:] = (255, 0, 0)  # BGR blue
    cv2.imwrite(str(tmp_path / "blue.png"), frame)
    target = ["-i", str(tmp_path / "blue.png"), "--socket", str(served.socket)]
    assert main(["infer", "colors", *target]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "colors:1" and lines[1].split()[0] == "blue"  # top_k 1, the label
    assert main(["infer", "colors", *target, "--raw"]) == 0
    assert capsys.readouterr().out.startswith("colors:1\nprob float32 [1, 3]")


def test_cli_when_inferring_an_image_on_a_stock_detector_prints_boxes_and_draws_them(
        make_served: ServeFactory, repo_dir: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    test_models.write_repository(repo_dir, names=["det_yolov8"])  # no model.yaml
    served = make_served(cache="preload: [det_yolov8]")
    frame = np.zeros((120, 160, 3), np.uint8)
    frame[40:80, 60:100] = (0, 255, 0)  # a lit square: class 1 of the model's metadata
    cv2.imwrite(str(tmp_path / "square.png"), frame)
    drawn = tmp_path / "drawn.jpg"
    assert main(["infer", "det_yolov8", "-i", str(tmp_path / "square.png"), "-o", str(drawn),
                 "--socket", str(served.socket)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == ["det_yolov8:1",
                         "  1 detection(s), boxes x1,y1,x2,y2 in image pixels"]
    label, score, *box = lines[2].replace("[", "").replace("]", "").replace(",", "").split()
    assert label == "bicycle" and float(score) > 0.5
    assert np.allclose([float(v) for v in box], [60, 40, 100, 80], atol=3)
    picture = cv2.imread(str(drawn))
    assert picture.shape == frame.shape
    assert frame[39, 80].max() == 0 and picture[39, 80, 1] > 150  # the box, drawn round it
