"""Which file a model loads: `precision` in model.yaml against the INT8 variant and its gate
report, the measured auto choice (timings injected, so it is deterministic) and its memo in
the cache directory, and the cache loading what was chosen."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.backends import options
from support.models import write_yaml

from edged.backends import LoadSpec
from edged.backends.onnxruntime import OrtBackend
from edged.backends.tensorrt import TensorRTBackend  # its rules need no tensorrt module
from edged.core.errors import ModelLoadError
from edged.core.fsutil import file_sha256
from edged.inference.cache import ModelCache
from edged.inference.precision import (
    choose_precision,
    int8_status,
    int8_variant,
    measure_sessions,
    sample_inputs,
)
from edged.model.int8_report import (
    ACCEPTED_FILE,
    REFUSED_FILE,
    Check,
    QuantReport,
    write_report,
)
from edged.model.repository import ModelRepository, ModelVersion
from tools.assets import models as test_models


def make_variant(model: ModelVersion, *, accepted: bool = True,
                 source: Path | None = None) -> Path:
    """A stand-in INT8 variant (a copy of model.onnx, or of `source`: loaders do not care)
    and its report."""
    path = model.dir / (ACCEPTED_FILE if accepted else REFUSED_FILE)
    shutil.copyfile(source or model.onnx_path, path)
    path.write_bytes(path.read_bytes())  # a file of its own (new inode) for the digest memo
    write_report(model.dir, QuantReport(
        model=model.name, version=model.version, accepted=accepted, file=path.name,
        sha256=file_sha256(path), source_sha256=file_sha256(model.onnx_path), kind="classify",
        checks=[Check("min_top1_agreement", 0.98, 0.99 if accepted else 0.5, accepted)],
        metrics={}, latency={}, calibration={}, settings={}, onnxruntime="1.31.1",
        created="2026-01-01T00:00:00+00:00",
        reasons=[] if accepted else ["min_top1_agreement: 0.5 < 0.98"]))
    return path


class Timings:
    """An injected measurement: fixed p50s, and a record of each call."""

    def __init__(self, fp32_ms: float, int8_ms: float) -> None:
        self.result = (fp32_ms, int8_ms)
        self.calls: list[tuple[Path, Path]] = []

    def __call__(self, fp32: LoadSpec, int8: LoadSpec) -> tuple[float, float]:
        self.calls.append((fp32.path, int8.path))
        return self.result


@pytest.fixture
def model(repo: ModelRepository) -> ModelVersion:
    return repo.resolve("tiny_cls")


@pytest.fixture
def ort() -> OrtBackend:
    return OrtBackend()


def test_choose_when_auto_and_int8_is_faster_loads_the_variant(
        model: ModelVersion, ort: OrtBackend, tmp_path: Path) -> None:
    variant = make_variant(model)
    timings = Timings(2.0, 1.0)
    choice = choose_precision(model, ort, options(tmp_path), measure=timings)
    assert (choice.path, choice.precision) == (variant, "int8")
    assert timings.calls == [(model.onnx_path, variant)]
    assert "measured" in choice.reason and "2.00x" in choice.reason


def test_choose_when_auto_and_int8_is_slower_keeps_fp32(
        model: ModelVersion, ort: OrtBackend, tmp_path: Path) -> None:
    make_variant(model)
    choice = choose_precision(model, ort, options(tmp_path), measure=Timings(1.0, 1.7))
    assert (choice.path, choice.precision) == (model.onnx_path, "fp32")


def test_choose_when_int8_gain_is_below_auto_min_speedup_keeps_fp32(
        repo: ModelRepository, ort: OrtBackend, tmp_path: Path) -> None:
    write_yaml(repo.root, "tiny_cls", test_models.MODEL_YAML["tiny_cls"] +
               "quantization: {auto_min_speedup: 1.2}\n")
    model = repo.resolve("tiny_cls")
    make_variant(model)
    assert choose_precision(model, ort, options(tmp_path),
                            measure=Timings(1.1, 1.0)).precision == "fp32"
    assert choose_precision(model, ort, options(tmp_path),  # remembered, judged again
                            measure=Timings(9, 9)).precision == "fp32"


def test_choose_when_remembered_does_not_measure_again(
        model: ModelVersion, ort: OrtBackend, tmp_path: Path) -> None:
    make_variant(model)
    first, second = Timings(2.0, 1.0), Timings(1.0, 2.0)
    assert choose_precision(model, ort, options(tmp_path), measure=first).precision == "int8"
    choice = choose_precision(model, ort, options(tmp_path), measure=second)
    assert (choice.precision, len(second.calls)) == ("int8", 0)
    assert "remembered" in choice.reason
    memo = json.loads((tmp_path / "cache" / "precision" / "tiny_cls.1.json").read_text())
    assert memo["key"]["model_sha256"] == file_sha256(model.onnx_path)
    assert (memo["fp32_ms"], memo["int8_ms"]) == (2.0, 1.0)


def test_choose_when_the_model_changes_measures_again(
        repo: ModelRepository, ort: OrtBackend, tmp_path: Path) -> None:
    make_variant(repo.resolve("tiny_cls"))
    choose_precision(repo.resolve("tiny_cls"), ort, options(tmp_path), measure=Timings(2, 1))
    test_models.write_model(test_models.make_tiny_cls(seed=5),
                                 repo.root / "tiny_cls" / "1" / "model.onnx")
    changed = repo.resolve("tiny_cls")
    make_variant(changed)  # quantized again for the new bytes
    again = Timings(1, 2)
    assert choose_precision(changed, ort, options(tmp_path), measure=again).precision == "fp32"
    assert len(again.calls) == 1


def test_choose_when_the_memo_is_for_another_cpu_or_unreadable_measures_again(
        model: ModelVersion, ort: OrtBackend, tmp_path: Path) -> None:
    make_variant(model)
    choose_precision(model, ort, options(tmp_path), measure=Timings(2, 1))
    memo_path = tmp_path / "cache" / "precision" / "tiny_cls.1.json"
    memo = json.loads(memo_path.read_text())
    memo["key"]["cpu"] = "some other CPU"
    memo_path.write_text(json.dumps(memo))
    again = Timings(2, 1)
    choose_precision(model, ort, options(tmp_path), measure=again)
    memo_path.write_text("{broken")
    choose_precision(model, ort, options(tmp_path), measure=again)
    assert len(again.calls) == 2


def test_choose_when_timing_fails_falls_back_to_fp32_and_remembers_nothing(
        model: ModelVersion, ort: OrtBackend, tmp_path: Path) -> None:
    make_variant(model)

    def broken(fp32: LoadSpec, int8: LoadSpec) -> tuple[float, float]:
        raise RuntimeError("INT8 kernel missing")

    choice = choose_precision(model, ort, options(tmp_path), measure=broken)
    assert choice.precision == "fp32" and "INT8 kernel missing" in choice.reason
    assert not (tmp_path / "cache" / "precision").exists()


def test_choose_when_auto_without_a_variant_loads_fp32_without_measuring(
        model: ModelVersion, ort: OrtBackend, tmp_path: Path) -> None:
    timings = Timings(2, 1)
    choice = choose_precision(model, ort, options(tmp_path), measure=timings)
    assert (choice.path, choice.precision, timings.calls) == (model.onnx_path, "fp32", [])
    assert "edged quantize tiny_cls" in choice.reason


def test_choose_when_auto_on_tensorrt_takes_the_accepted_variant_unmeasured(
        model: ModelVersion, tmp_path: Path) -> None:
    variant = make_variant(model)
    timings = Timings(1, 2)
    choice = choose_precision(model, TensorRTBackend(), options(tmp_path),
                              measure=timings)
    assert (choice.path, choice.precision, timings.calls) == (variant, "int8", [])


def test_choose_when_auto_on_tensorrt_and_the_variant_is_asymmetric_builds_fp16(
        model: ModelVersion, tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(  # what a CPU-minded quantization writes: uint8 zero points
        [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
         helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])], "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("s", TensorProto.FLOAT, [], [0.1]),
         helper.make_tensor("z", TensorProto.UINT8, [], [128])])
    onnx.save(helper.make_model(graph), str(tmp_path / "qdq.onnx"))
    make_variant(model, source=tmp_path / "qdq.onnx")
    choice = choose_precision(model, TensorRTBackend(), options(tmp_path))
    assert (choice.path, choice.precision) == (model.onnx_path, "fp16")
    assert "not TensorRT's kind" in choice.reason and "uint8" in choice.reason


def test_choose_when_auto_on_tensorrt_without_a_variant_builds_fp16(
        model: ModelVersion, tmp_path: Path) -> None:
    choice = choose_precision(model, TensorRTBackend(), options(tmp_path))
    assert (choice.path, choice.precision) == (model.onnx_path, "fp16")


def test_choose_when_fp32_or_fp16_asked_ignores_the_variant(
        repo: ModelRepository, ort: OrtBackend, tmp_path: Path) -> None:
    make_variant(repo.resolve("tiny_cls"))
    for wanted in ("fp32", "fp16"):
        write_yaml(repo.root, "tiny_cls", test_models.MODEL_YAML["tiny_cls"] +
                   f"precision: {wanted}\n")
        choice = choose_precision(repo.resolve("tiny_cls"), ort, options(tmp_path),
                                  measure=Timings(9, 1))
        assert (choice.path.name, choice.precision) == ("model.onnx", wanted)


def test_choose_when_int8_forced_and_refused_raises_naming_the_report(
        repo: ModelRepository, ort: OrtBackend, tmp_path: Path) -> None:
    write_yaml(repo.root, "tiny_cls", test_models.MODEL_YAML["tiny_cls"] +
               "precision: int8\n")
    model = repo.resolve("tiny_cls")
    with pytest.raises(ModelLoadError, match="edged quantize tiny_cls"):
        choose_precision(model, ort, options(tmp_path))
    make_variant(model, accepted=False)
    with pytest.raises(ModelLoadError, match=r"refused.*min_top1_agreement: 0\.5 < 0\.98.*"
                                             r"model\.int8\.report\.json"):
        choose_precision(model, ort, options(tmp_path))
    variant = make_variant(model)
    assert choose_precision(model, ort, options(tmp_path)).path == variant


def test_int8_variant_when_the_file_or_the_model_is_not_what_the_report_names(
        model: ModelVersion) -> None:
    variant = make_variant(model)
    assert int8_variant(model) == variant
    variant.write_bytes(variant.read_bytes() + b"\0")
    assert int8_variant(model) is None and "sha256 differs" in int8_status(model)[1]
    make_variant(model)
    model.onnx_path.write_bytes(model.onnx_path.read_bytes() + b"\0")
    path, why = int8_status(model)
    assert path is None and "made from another model.onnx" in why
    make_variant(model)
    variant.unlink()
    assert int8_variant(model) is None and "missing" in int8_status(model)[1]


def test_measure_sessions_times_both_files_on_real_sessions(
        model: ModelVersion, ort: OrtBackend, tmp_path: Path) -> None:
    variant = make_variant(model)
    spec = LoadSpec(model.name, model.version, model.onnx_path, model.inputs, model.outputs,
                    model.max_batch_size)
    inputs = sample_inputs(model)
    assert inputs["x"].shape == (1, 3, 8, 8) and np.abs(inputs["x"]).sum() > 0
    fp32_ms, int8_ms = measure_sessions(ort, options(tmp_path), inputs)(
        spec, LoadSpec(**{**spec.__dict__, "path": variant, "precision": "int8"}))
    assert fp32_ms > 0 and int8_ms > 0


def test_cache_when_int8_asked_loads_the_variant_and_reports_its_precision(
        repo: ModelRepository, tmp_path: Path) -> None:
    write_yaml(repo.root, "tiny_cls", test_models.MODEL_YAML["tiny_cls"] +
               "precision: int8\n")
    variant = make_variant(repo.resolve("tiny_cls"))
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    try:
        with cache.acquire("tiny_cls") as lease:
            assert lease.session.spec.path == variant  # type: ignore[attr-defined]
        row = next(s for s in cache.status() if s.name == "tiny_cls")
        assert (row.state, row.precision) == ("READY", "int8")
    finally:
        cache.close()


def test_cache_when_int8_asked_but_refused_fails_the_load_naming_the_report(
        repo: ModelRepository, tmp_path: Path) -> None:
    write_yaml(repo.root, "tiny_cls", test_models.MODEL_YAML["tiny_cls"] +
               "precision: int8\n")
    make_variant(repo.resolve("tiny_cls"), accepted=False)
    cache = ModelCache(repo, budget_bytes=1 << 30, options=options(tmp_path))
    try:
        with pytest.raises(ModelLoadError, match=r"model\.int8\.report\.json"):
            cache.load("tiny_cls")
        row = next(s for s in cache.status() if s.name == "tiny_cls")
        assert row.state == "UNAVAILABLE" and "refused" in (row.reason or "")
    finally:
        cache.close()
