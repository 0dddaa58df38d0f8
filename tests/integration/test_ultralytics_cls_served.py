"""An Ultralytics classify export with no model.yaml (the exporter-faithful YOLO-cls stand-in:
no wheel ships a trained one) served by the daemon: through `edged infer -i` on real pictures
and a frame whose middle differs from its sides, and through a stream (a lossless video, so
the frames decoded are the ones written), the probabilities are the ones the same ONNX file
gives on the tensor of the reference port of Ultralytics' ClassificationPredictor
(tests/support/ultralytics_classify.py): the top-1 equal, the probabilities within 1e-6."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from support import ultralytics_classify as ref
from support.broker import Broker, Received, Subscriber
from support.daemon import ServeFactory
from support.video import lossless_video

from edged.cli import main
from tools.assets import tasks as task_models

IMAGES = ("astronaut.png", "page.png", "alpr_plates.jpg")
IMGSZ = (224, 224)


def reference_probs(onnx_path: Path, frame: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    [out] = session.run(None, {"images": ref.classify_tensor(frame, IMGSZ)})
    return np.asarray(out[0], np.float32)


def scenes() -> list[np.ndarray]:
    """480 x 160 frames: red in the middle third and blue at the sides (red cropped, blue
    squashed), and the same turned to green, then a textured one."""
    frames = []
    for middle, sides in (((0, 0, 255), (255, 0, 0)), ((0, 255, 0), (0, 0, 255))):
        frame = np.zeros((160, 480, 3), np.uint8)
        frame[:, :] = sides
        frame[:, 160:320] = middle
        frames.append(frame)
    frames.append(ref.pattern(480, 160))
    return frames


def test_ultralytics_classifier_when_served_with_no_model_yaml_answers_as_its_predictor(
        real_models: Path, make_served: ServeFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root = task_models.write_task_models(tmp_path / "models", ["cls_yolo"])
    onnx_path = root / "cls_yolo" / "1" / "model.onnx"
    served = make_served(cache="preload: [cls_yolo]", models_dir=root)
    with served.client() as client:
        config = client.model_config("cls_yolo")["edged"]
    pre = config["preprocess"]
    assert (pre["resize_short"], pre["crop"], pre["crop_offset"], pre["interpolation"],
            pre["color"]) == (224, "center", "round", "pillow_bilinear", "rgb")
    assert "classify_transforms: short side 224" in config["reasons"]["preprocess"]
    frames = [cv2.imread(str(real_models / name), cv2.IMREAD_COLOR) for name in IMAGES]
    frames += scenes()
    tops = []
    for i, frame in enumerate(frames):
        path = tmp_path / f"frame-{i}.png"  # lossless
        cv2.imwrite(str(path), frame)
        code = main(["infer", "cls_yolo", "-i", str(path), "--json", "--socket",
                     str(served.socket)])
        out, err = capsys.readouterr()
        assert code == 0, err
        [(_, probs)] = json.loads(out)["outputs"].items()
        expected = reference_probs(onnx_path, frame)
        got = np.asarray(probs, np.float32).reshape(-1)
        assert int(np.argmax(got)) == int(np.argmax(expected)), i
        np.testing.assert_allclose(got, expected, atol=1e-6, err_msg=f"frame {i}")
        tops.append(int(np.argmax(expected)))
    assert tops[3:5] == [0, 1]  # the middles (red, then green), not the sides


def test_ultralytics_classifier_stream_when_the_middle_differs_publishes_the_predictors_answer(
        make_served: ServeFactory, broker: Broker, tmp_path: Path) -> None:
    frames = scenes()
    video = tmp_path / "scenes.avi"
    lossless_video(video, frames)  # what the stream reads is what was written
    root = task_models.write_task_models(tmp_path / "models", ["cls_yolo"])
    (root / "cls_yolo" / "model.yaml").write_text("postprocess: {top_k: 3}\n")
    onnx_path = root / "cls_yolo" / "1" / "model.onnx"
    prefix = "t/ulcls"
    sub = Subscriber(broker, f"{prefix}/#")
    topic = f"{prefix}/streams/cam/results"

    def all_frames(got: list[Received]) -> bool:
        return sum(m.topic == topic for m in got) >= len(frames)
    try:
        make_served(cache="preload: [cls_yolo]", models_dir=root,
                    streams=f"[{{name: cam, source: 'file://{video}', model: cls_yolo, "
                            "backpressure: block, publish: {frames: true}}]",
                    mqtt=f"host: 127.0.0.1, port: {broker.port}, prefix: {prefix}")
        got = sub.collect(until=all_frames, timeout=60, what="the frames' results")
    finally:
        sub.close()
    results = [json.loads(m.payload) for m in got if m.topic == topic][:len(frames)]
    labels = []
    for frame, message in zip(frames, results, strict=True):
        expected = reference_probs(onnx_path, frame)
        classes = message["results"]["classes"]
        assert classes[0]["index"] == int(np.argmax(expected))
        scores = {c["index"]: c["score"] for c in classes}
        np.testing.assert_allclose([scores[i] for i in range(3)], expected, atol=1e-6)
        labels.append(classes[0]["label"])
    assert labels[:2] == ["red", "green"]
