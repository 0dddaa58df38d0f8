"""Cascades on real models: crops of the chosen detections go to a secondary model as one
batch per frame (split only where the model's batch limit says so), a classify model's top
label lands on the detection as sub_label, any other model's results as attributes, and a
secondary model that cannot take crops is refused with the reason."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from support.backends import GateBackend
from support.models import write_yaml

from edged.config import DaemonConfig, parse_config
from edged.core.errors import ConfigError, InvalidModel
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.processing.detections import Detections
from edged.streams.cascade import Cascade, crop, run_all
from edged.streams.config import SecondaryConfig

Core = tuple[ModelCache, Scheduler]
BGR = {"red": (0, 0, 255), "green": (0, 255, 0), "blue": (255, 0, 0)}


def squares(**boxes: tuple[int, int, int, int]) -> np.ndarray:
    """A black 240x320 BGR frame with a square of each named colour at its x1, y1, x2, y2."""
    frame = np.zeros((240, 320, 3), np.uint8)
    for colour, (x1, y1, x2, y2) in boxes.items():
        frame[y1:y2, x1:x2] = BGR[colour]
    return frame


def detection(label: str, box: tuple[int, int, int, int], score: float = 0.9) -> dict:
    return {"class": 0, "label": label, "score": score, "box": [float(v) for v in box]}


def config(text: str) -> DaemonConfig:
    return parse_config(f"streams:\n  - {{name: s, source: 'file:///x.avi', model: grid_det,\n"
                        f"     secondary: [{text}]}}\n")


def test_secondary_config_when_given_reads_as_and_defaults() -> None:
    (secondary,) = config("{model: colors, labels: [car], as: attributes}").streams[0].secondary
    assert secondary == SecondaryConfig("colors", ["car"], "attributes", min_score=0.0,
                                        crop_margin=0.1, max_crops=8)


def test_secondary_config_when_as_is_unknown_names_the_key_and_choices() -> None:
    with pytest.raises(ConfigError) as caught:
        config("{model: colors, as: label}")
    (issue,) = caught.value.issues
    assert issue.path == "streams[0].secondary[0].as"
    assert "'sub_label', 'attributes'" in issue.message


def test_crop_when_the_margin_reaches_past_the_frame_clips_to_it() -> None:
    frame = np.arange(100 * 200).reshape(100, 200)
    assert crop(frame, [10, 20, 30, 60], 0.5).shape == (80, 40)  # 20x40 box, +10/+20 a side
    assert crop(frame, [190, 90, 200, 100], 1.0).shape == (20, 20)  # clipped at the corner
    assert crop(frame, [50, 50, 50, 50], 0.0).shape == (1, 1)  # never empty


def test_cascade_when_labels_and_scores_filter_crops_the_best_first(core: Core) -> None:
    _, scheduler = core
    cascade = Cascade(SecondaryConfig("colors", ["car"], min_score=0.5, max_crops=2),
                      scheduler)
    found = Detections.from_rows([
        detection("car", (0, 0, 8, 8), 0.6), detection("person", (0, 0, 8, 8), 0.99),
        detection("car", (0, 0, 8, 8), 0.4), detection("car", (0, 0, 8, 8), 0.8),
        detection("car", (0, 0, 8, 8), 0.7)])
    assert [d["score"] for d in found.take(cascade.select(found)).rows()] == [0.8, 0.7]


def test_cascade_when_run_puts_the_crops_top_label_on_the_chosen_detections_only(
        core: Core) -> None:
    _, scheduler = core
    frame = squares(red=(20, 20, 80, 80), green=(200, 100, 260, 160), blue=(120, 30, 170, 80))
    found = Detections.from_rows([
        detection("car", (20, 20, 80, 80)), detection("car", (200, 100, 260, 160)),
        detection("person", (120, 30, 170, 80))])
    cascade = Cascade(SecondaryConfig("colors", ["car"]), scheduler)
    assert cascade.run(frame, found) == 2
    found = found.rows()
    assert [(d.get("sub_label"), d["label"]) for d in found] == [
        ("red", "car"), ("green", "car"), (None, "person")]
    assert all(0.9 < d["sub_label_score"] <= 1.0 for d in found[:2])


def test_cascade_when_crops_outnumber_the_batch_limit_splits_and_keeps_the_order(
        core: Core, gate: GateBackend, repo_dir: Path) -> None:
    write_yaml(repo_dir, "colors", "max_batch_size: 2\npreprocess: {resize: [64, 64]}\n"
                                   "postprocess: {kind: classify, labels: labels.txt}\n")
    cache, scheduler = core
    boxes = {"red": (0, 0, 40, 40), "green": (50, 0, 90, 40), "blue": (100, 0, 140, 40)}
    found = Detections.from_rows(detection("car", box) for box in boxes.values())
    cache.load("colors")
    gate.reset()  # the warm-up is not a crop
    Cascade(SecondaryConfig("colors"), scheduler).run(squares(**boxes), found)
    found = found.rows()
    assert [d["sub_label"] for d in found] == ["red", "green", "blue"]
    assert sorted(len(call["image"]) for call in gate.calls) == [1, 2]  # 3 crops, limit 2


def test_cascade_when_as_attributes_keeps_the_models_results_under_its_name(
        core: Core) -> None:
    _, scheduler = core
    detected = Detections.from_rows([detection("car", (20, 20, 80, 80))])
    cascade = Cascade(SecondaryConfig("colors", as_="attributes"), scheduler)
    run_all([cascade], squares(blue=(20, 20, 80, 80)), {"detections": detected})
    found = detected.rows()
    (best,) = found[0]["attributes"]["colors"]["classes"]
    assert best["label"] == "blue" and "sub_label" not in found[0]


@pytest.mark.parametrize(("model", "reason"), [
    ("tiny_cls", "is not a classify model (postprocess.kind: raw): use `as: attributes`"),
    ("tiny_cnn", "has a dynamic input size [-1, 3, -1, -1]: set preprocess.resize"),
    ("tiny_two_input", "has 2 inputs; a cascade feeds one image input"),
])
def test_cascade_when_the_model_cannot_take_crops_is_refused_with_the_reason(
        core: Core, model: str, reason: str) -> None:
    _, scheduler = core
    with pytest.raises(InvalidModel, match=f"secondary model {model}:1 " + reason.replace(
            "[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        Cascade(SecondaryConfig(model), scheduler)
