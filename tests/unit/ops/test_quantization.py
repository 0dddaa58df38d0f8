"""The pieces of `edged quantize` on their own: the gate's numbers and decision, the report on
disk, and the calibration samples (images through the model's pre-processing, .npy/.npz
tensors, stream frames, the seeded split)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import cv2
import numpy as np
import pytest

from edged.core.errors import InvalidInput, InvalidModel
from edged.model.config import PreprocessConfig, QuantizationConfig
from edged.model.int8_report import Check, QuantReport, read_report, report_path, write_report
from edged.model.repository import ModelRepository
from edged.ops.quantize.calibration import Sample, load_samples, split, stream_samples, subset
from edged.ops.quantize.command import gather, read_labels
from edged.processing.agreement import classify_output, compare, decide
from edged.processing.pre import preprocess


def probs(*rows: list[float]) -> list[dict[str, np.ndarray]]:
    return [{"prob": np.array(r, np.float32)} for r in rows]


def test_compare_when_classifier_outputs_differ_counts_agreement_and_accuracy() -> None:
    fp32 = probs([0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7])
    int8 = probs([0.8, 0.2], [0.3, 0.7], [0.4, 0.6], [0.3, 0.7])  # the third flips
    metrics = compare(fp32, int8, labels=[0, 1, 0, 0], classify="prob")
    assert metrics["top1_agreement"] == 0.75
    assert metrics["fp32_accuracy"] == 0.75  # the fourth is wrong in both
    assert metrics["int8_accuracy"] == 0.5


def test_compare_when_a_label_is_missing_reports_agreement_without_accuracy() -> None:
    metrics = compare(probs([1, 0]), probs([1, 0]), labels=[None], classify="prob")
    assert metrics["top1_agreement"] == 1.0 and metrics["fp32_accuracy"] is None


def test_compare_error_statistics_match_hand_computed_values() -> None:
    fp32 = [{"y": np.array([3.0, 4.0])}, {"y": np.array([0.0, 0.0])}]
    int8 = [{"y": np.array([3.0, 3.0])}, {"y": np.array([0.0, 0.0])}]
    m = compare(fp32, int8)
    assert m["max_abs_error"] == 1.0 and m["mean_abs_error"] == 0.25
    assert m["relative_error"] == pytest.approx(1 / 5)
    # [3,4]·[3,3] / (5 * sqrt(18)); two all-zero outputs count as identical
    assert m["cosine_min"] == pytest.approx(21 / (5 * 18 ** 0.5))
    assert m["cosine"] == pytest.approx((21 / (5 * 18 ** 0.5) + 1) / 2)
    assert m["top1_agreement"] is None


def test_compare_ignores_integer_outputs_and_rejects_mismatched_lengths() -> None:
    fp32 = [{"y": np.array([1.0]), "ids": np.array([7])}]
    int8 = [{"y": np.array([1.0]), "ids": np.array([9])}]
    assert compare(fp32, int8)["max_abs_error"] == 0.0
    with pytest.raises(ValueError):
        compare(fp32, [])


def test_decide_when_agreement_below_threshold_refuses_with_reason() -> None:
    metrics = compare(probs([0.9, 0.1], [0.6, 0.4]), probs([0.9, 0.1], [0.4, 0.6]),
                      classify="prob")
    checks, reasons = decide(metrics, QuantizationConfig(min_top1_agreement=0.98), True)
    assert [(c.name, c.value, c.passed) for c in checks] == [("min_top1_agreement", 0.5, False)]
    assert reasons == ["min_top1_agreement: 0.5 < 0.98"]
    checks, reasons = decide(metrics, QuantizationConfig(min_top1_agreement=0.5), True)
    assert reasons == [] and checks[0].passed


def test_decide_when_other_model_checks_cosine_and_every_error_bound_set() -> None:
    metrics = compare([{"y": np.array([3.0, 4.0])}], [{"y": np.array([3.0, 3.0])}])
    cfg = QuantizationConfig(min_cosine=0.9, max_mean_abs_error=0.1, max_relative_error=0.5)
    checks, reasons = decide(metrics, cfg, classifier=False)
    assert {c.name: c.passed for c in checks} == {
        "min_cosine": True, "max_mean_abs_error": False, "max_relative_error": True}
    assert reasons == ["max_mean_abs_error: 0.5 > 0.1"]


def test_decide_when_labelled_checks_the_accuracy_drop() -> None:
    metrics = compare(probs([1, 0], [0, 1]), probs([1, 0], [1, 0]), labels=[0, 1],
                      classify="prob")
    _, reasons = decide(metrics, QuantizationConfig(min_top1_agreement=0.5,
                                                    max_accuracy_drop=0.1), True)
    assert reasons == ["max_accuracy_drop: 0.5 > 0.1"]


def test_classify_output_when_postprocess_or_shape_says_so(repo: ModelRepository) -> None:
    assert classify_output(repo.resolve("colors")) == "prob"  # postprocess: classify
    assert classify_output(repo.resolve("tiny_cls")) == "prob"  # [N, 4]
    assert classify_output(repo.resolve("tiny_nobatch")) is None
    assert classify_output(repo.resolve("tiny_two_input")) is None


def test_model_yaml_when_quantization_is_wrong_names_the_key_and_line(
        repo: ModelRepository) -> None:
    (repo.root / "tiny_cls" / "model.yaml").write_text(
        "max_batch_size: 16\nquantization:\n  min_top1_agreement: 1.5\n  per_chanel: true\n")
    with pytest.raises(InvalidModel) as caught:
        repo.resolve("tiny_cls")
    assert "quantization.min_top1_agreement: must be between 0 and 1, got 1.5 (line 3)" in \
        str(caught.value)
    assert "quantization.per_chanel: unknown key (did you mean 'per_channel'?) (line 4)" in \
        str(caught.value)


def report_of(accepted: bool) -> QuantReport:
    return QuantReport(
        model="m", version=1, accepted=accepted, file="model.int8.onnx", sha256="a" * 64,
        source_sha256="b" * 64, kind="classify",
        checks=[Check("min_top1_agreement", 0.98, 0.99, True)],
        metrics={"top1_agreement": 0.99}, latency={"fp32_ms_p50": 1.0, "int8_ms_p50": 2.0,
                                                   "ratio": 2.0},
        calibration={"samples": 8}, settings={"format": "QDQ"}, onnxruntime="1.31.1",
        created="2026-01-01T00:00:00+00:00", reasons=[] if accepted else ["x"])


def test_report_when_written_reads_back_equal_with_its_decision(tmp_path: Path) -> None:
    assert read_report(tmp_path) is None
    write_report(tmp_path, report_of(False))
    assert read_report(tmp_path) == report_of(False)
    assert '"decision": "refused"' in report_path(tmp_path).read_text()


def test_read_report_when_corrupt_raises_invalid_model_naming_it(tmp_path: Path) -> None:
    report_path(tmp_path).write_text("{not json")
    with pytest.raises(InvalidModel, match=r"model\.int8\.report\.json"):
        read_report(tmp_path)
    report_path(tmp_path).write_text('{"model": "m"}')
    with pytest.raises(InvalidModel, match="not a quantization report"):
        read_report(tmp_path)


# -- calibration samples ----------------------------------------------------------------------
def test_load_samples_when_images_in_class_folders_preprocesses_and_labels(
        repo: ModelRepository, tmp_path: Path) -> None:
    model = repo.resolve("colors")  # preprocess: resize 64x64, rgb; labels red, green, blue
    frame = np.zeros((30, 50, 3), np.uint8)
    frame[..., 1] = 200
    for folder in ("1", "green", "unlabelled"):
        (tmp_path / "cal" / folder).mkdir(parents=True)
        cv2.imwrite(str(tmp_path / "cal" / folder / "a.png"), frame)
    samples = load_samples(model, [tmp_path / "cal"], read_labels(model))
    assert [s.label for s in samples] == [1, 1, None]
    expected, _ = preprocess(frame, model.config.preprocess or PreprocessConfig(),
                             model.inputs[0])
    assert samples[0].inputs["image"].shape == (3, 64, 64)
    np.testing.assert_array_equal(samples[0].inputs["image"], expected[0])
    assert samples[0].batch(model)["image"].shape == (1, 3, 64, 64)


def test_load_samples_when_npy_holds_one_sample_or_a_stack(repo: ModelRepository,
                                                           tmp_path: Path) -> None:
    model = repo.resolve("tiny_cls")  # x: [N, 3, 8, 8]
    np.save(tmp_path / "one.npy", np.ones((3, 8, 8), np.float64))
    np.save(tmp_path / "stack.npy", np.zeros((5, 3, 8, 8), np.float32))
    samples = load_samples(model, [tmp_path / "one.npy", tmp_path / "stack.npy"])
    assert len(samples) == 6
    assert all(s.inputs["x"].shape == (3, 8, 8) and s.inputs["x"].dtype == np.float32
               for s in samples)
    np.save(tmp_path / "bad.npy", np.zeros((8, 8), np.float32))
    with pytest.raises(InvalidInput, match="rank 2"):
        load_samples(model, [tmp_path / "bad.npy"])


def test_load_samples_when_npz_feeds_each_input_by_name(repo: ModelRepository,
                                                        tmp_path: Path) -> None:
    model = repo.resolve("tiny_two_input")
    np.savez(tmp_path / "pair.npz", a=np.ones((2, 4), np.float32), b=np.zeros((2, 4)))
    samples = load_samples(model, [tmp_path])
    assert len(samples) == 2 and set(samples[0].inputs) == {"a", "b"}
    np.savez(tmp_path / "pair.npz", a=np.ones((2, 4), np.float32))
    with pytest.raises(InvalidInput, match="no array for input"):
        load_samples(model, [tmp_path])
    cv2.imwrite(str(tmp_path / "x.png"), np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(InvalidInput, match="images need a one-input model"):
        load_samples(model, [tmp_path / "x.png"])


def test_load_samples_when_path_is_missing_or_not_a_sample_raises(repo: ModelRepository,
                                                                 tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="no such file"):
        load_samples(repo.resolve("tiny_cls"), [tmp_path / "absent"])
    (tmp_path / "notes.txt").write_text("hi")
    with pytest.raises(InvalidInput, match="not an image"):
        load_samples(repo.resolve("tiny_cls"), [tmp_path / "notes.txt"])


def test_stream_samples_when_file_uri_reads_every_step_th_frame(repo: ModelRepository,
                                                                tmp_path: Path) -> None:
    video = tmp_path / "clip.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 25, (32, 24))
    for i in range(20):
        writer.write(np.full((24, 32, 3), i * 10, np.uint8))
    writer.release()
    samples = stream_samples(repo.resolve("colors"), f"file://{video}", frames=5, step=3)
    assert [s.source.rsplit("#", 1)[1] for s in samples] == ["0", "3", "6", "9", "12"]
    assert samples[0].inputs["image"].shape == (3, 64, 64)
    assert len(stream_samples(repo.resolve("colors"), f"file://{video}", frames=50)) == 20
    with pytest.raises(InvalidInput, match="calibration-stream"):
        stream_samples(repo.resolve("colors"), f"file://{tmp_path}/absent.avi", frames=5)


def test_split_when_seeded_is_deterministic_disjoint_and_keeps_both_sides() -> None:
    samples = [Sample({"x": np.array([i])}, source=str(i)) for i in range(20)]
    cal, held = split(samples, 0.25, np.random.default_rng(3))
    again = split(samples, 0.25, np.random.default_rng(3))
    assert ([s.source for s in cal], [s.source for s in held]) == \
        ([s.source for s in again[0]], [s.source for s in again[1]])
    assert len(held) == 5 and not {s.source for s in cal} & {s.source for s in held}
    assert [len(part) for part in split(samples[:2], 0.9, np.random.default_rng(0))] == [1, 1]
    with pytest.raises(InvalidInput):
        split(samples[:1], 0.25, np.random.default_rng(0))
    assert len(subset(samples, 7, np.random.default_rng(0))) == 7


def test_gather_when_nothing_given_or_found_raises_invalid_input(repo: ModelRepository,
                                                                 tmp_path: Path) -> None:
    model = repo.resolve("tiny_cls")
    with pytest.raises(InvalidInput, match="no calibration samples"):
        gather(model, [], [])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="no calibration samples"):
        gather(model, [tmp_path / "empty"], [])


def test_gather_when_no_held_out_given_splits_and_caps_calibration(repo: ModelRepository,
                                                                   tmp_path: Path) -> None:
    model = repo.resolve("tiny_cls")
    np.save(tmp_path / "stack.npy", np.zeros((40, 3, 8, 8), np.float32))
    model = dataclasses.replace(model, config=dataclasses.replace(
        model.config, quantization=QuantizationConfig(held_out_fraction=0.25)))
    cal, held, details = gather(model, [tmp_path], [], samples=10, seed=1)
    assert (len(cal), len(held), details["held_out_from"]) == (10, 10, "calibration split")
