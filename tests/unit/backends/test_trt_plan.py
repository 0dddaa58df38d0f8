"""What a TensorRT engine is built as, before any TensorRT runs: the optimisation profiles the
batcher's settings give, the precision and builder flags, and the engine cache's key and its
refusal of stale or damaged files."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from support.models import qdq_model

from edged.backends import LoadSpec, ShapeRange
from edged.backends import engine_cache as ec
from edged.backends.engine_cache import EngineKey
from edged.backends.profiles import (
    InputProfile,
    ProfileError,
    derive_profile,
    opt_batch_size,
    ort_trt_profile_options,
)
from edged.backends.trt_build import inspect_qdq, plan_precision
from edged.inference.loadspec import engine_hints
from edged.model.repository import ModelRepository
from edged.model.tensor import TensorSpec

F32 = np.dtype(np.float32)


def spec(inputs: tuple[TensorSpec, ...], max_batch: int, **hints: object) -> LoadSpec:
    return LoadSpec("m", 1, Path("m.onnx"), inputs, (), max_batch, **hints)


# -- profiles ---------------------------------------------------------------------------------
def test_opt_batch_size_is_the_largest_preferred_that_fits_else_max() -> None:
    assert opt_batch_size(16, [4, 8]) == 8
    assert opt_batch_size(16, [4, 32]) == 4
    assert opt_batch_size(16, []) == 16


def test_profile_when_batched_spans_one_to_max_tuned_for_opt() -> None:
    x = TensorSpec("x", F32, (-1, 3, 8, 8))
    (p,) = derive_profile(spec((x,), 16, opt_batch_size=8))
    assert p == InputProfile("x", (1, 3, 8, 8), (8, 3, 8, 8), (16, 3, 8, 8))


def test_profile_from_model_yaml_takes_batching_and_instances(repo_dir: Path) -> None:
    (repo_dir / "tiny_cls" / "model.yaml").write_text(
        "max_batch_size: 16\ninstances: 3\nbatching: {preferred_batch_sizes: [2, 4]}\n")
    model = ModelRepository(repo_dir).resolve("tiny_cls")
    hints = engine_hints(model)
    assert hints["opt_batch_size"] == 4 and hints["instances"] == 3
    (p,) = derive_profile(spec(model.inputs, model.max_batch_size, **hints))
    assert (p.min[0], p.opt[0], p.max[0]) == (1, 4, 16)


def test_profile_when_no_batch_dim_is_the_fixed_shape() -> None:
    (p,) = derive_profile(spec((TensorSpec("v", F32, (4,)),), 0))
    assert p.min == p.opt == p.max == (4,)


def test_profile_when_dynamic_dims_takes_the_model_yaml_range() -> None:
    image = TensorSpec("image", F32, (-1, 3, -1, -1))
    ranges = {"image": ShapeRange((3, 16, 16), (3, 32, 48), (3, 64, 64))}
    (p,) = derive_profile(spec((image,), 8, shape_ranges=ranges))
    assert p == InputProfile("image", (1, 3, 16, 16), (8, 3, 32, 48), (8, 3, 64, 64))


def test_profile_when_dynamic_dims_have_no_range_names_the_key_to_set() -> None:
    image = TensorSpec("image", F32, (-1, 3, -1, -1))
    with pytest.raises(ProfileError, match=r"no tensorrt.shapes.image range"):
        derive_profile(spec((image,), 8))


def test_profile_when_range_contradicts_fixed_dims_raises() -> None:
    image = TensorSpec("image", F32, (-1, 3, -1, -1))
    ranges = {"image": ShapeRange((1, 16, 16), (3, 32, 32), (3, 64, 64))}
    with pytest.raises(ProfileError, match=r"tensorrt.shapes.image.min \[1, 16, 16\]"):
        derive_profile(spec((image,), 8, shape_ranges=ranges))


def test_profile_when_a_range_names_no_input_raises() -> None:
    ranges = {"imgae": ShapeRange((3, 16, 16), (3, 32, 32), (3, 64, 64))}
    with pytest.raises(ProfileError, match="names imgae, which the model does not take"):
        derive_profile(spec((TensorSpec("image", F32, (-1, 3, 8, 8)),), 8, shape_ranges=ranges))


def test_ort_trt_profile_options_use_the_ep_shape_syntax() -> None:
    profile = (InputProfile("a", (1, 4), (8, 4), (16, 4)),
               InputProfile("b", (1, 2), (8, 2), (16, 2)))
    assert ort_trt_profile_options(profile) == {
        "trt_profile_min_shapes": "a:1x4,b:1x2", "trt_profile_opt_shapes": "a:8x4,b:8x2",
        "trt_profile_max_shapes": "a:16x4,b:16x2"}


# -- precision --------------------------------------------------------------------------------
@pytest.mark.parametrize(("asked", "qdq", "weak", "dla", "precision", "flags", "noted"), [
    ("fp32", False, True, False, "fp32", (), False),
    ("fp16", False, True, False, "fp16", ("FP16",), False),
    ("fp16", False, False, False, "fp32", (), True),  # TensorRT 11: no FP16 flag
    # TensorRT 10 needs INT8 for Q/DQ, and FP16 for the layers between them (as ORT's EP sets)
    ("int8", True, True, False, "int8", ("INT8", "FP16"), False),
    ("int8", True, False, False, "int8", (), False),  # TensorRT 11: Q/DQ alone
    ("int8", False, True, False, "fp16", ("FP16",), True),  # no Q/DQ: no implicit INT8
    ("fp32", True, True, False, "int8", ("INT8",), False),  # a Q/DQ file is INT8 anyway
    ("fp32", False, True, True, "fp16", ("FP16", "GPU_FALLBACK"), True),  # DLA: no fp32
])
def test_plan_precision(asked: str, qdq: bool, weak: bool, dla: bool, precision: str,
                        flags: tuple[str, ...], noted: bool) -> None:
    plan = plan_precision(asked, has_qdq=qdq, weak_typing=weak, dla=dla)
    assert (plan.precision, plan.flags, plan.note is not None) == (precision, flags, noted)


def test_inspect_qdq_tells_plain_symmetric_and_cpu_style_files(
        tmp_path: Path, repo: ModelRepository) -> None:
    assert inspect_qdq(repo.resolve("tiny_cls").onnx_path) == (False, None)
    assert inspect_qdq(qdq_model(tmp_path / "s.onnx", np.array(0, np.int8))) == (True, None)
    assert inspect_qdq(qdq_model(tmp_path / "u.onnx", np.array(128, np.uint8))) == (
        True, "QuantizeLinear q0 is uint8")
    assert inspect_qdq(qdq_model(tmp_path / "a.onnx", np.array(3, np.int8))) == (
        True, "QuantizeLinear q0 has non-zero zero points")


# -- the engine cache -------------------------------------------------------------------------
PROFILE = (InputProfile("x", (1, 4), (8, 4), (16, 4)),)
KEY = EngineKey("ab" * 32, "10.13.0", "Orin", "8.7", "fp16", (PROFILE, PROFILE), None, 1024)


@pytest.mark.parametrize("change", [
    {"model_sha256": "cd" * 32}, {"tensorrt": "10.14.1"}, {"gpu": "RTX 4090"},
    {"compute_capability": "8.9"}, {"precision": "int8"}, {"profiles": (PROFILE,)},
    {"profiles": ((InputProfile("x", (1, 4), (4, 4), (16, 4)),),) * 2}, {"dla_core": 0},
    {"workspace_mb": 2048}, {"flags": ("-TF32",)},
])
def test_engine_key_when_any_field_changes_names_another_file(change: dict[str, object],
                                                               tmp_path: Path) -> None:
    other = dataclasses.replace(KEY, **change)
    assert other.digest != KEY.digest
    assert ec.files_for(tmp_path, "m", 1, other) != ec.files_for(tmp_path, "m", 1, KEY)


def test_engine_cache_when_written_reads_back_and_drops_older_keys(tmp_path: Path) -> None:
    old = dataclasses.replace(KEY, tensorrt="10.0.1")
    ec.write_engine(ec.files_for(tmp_path, "m", 1, old), old, b"old", label="m:1",
                    build_seconds=1.0)
    files = ec.files_for(tmp_path, "m", 1, KEY)
    ec.write_engine(files, KEY, b"engine bytes", label="m:1", build_seconds=2.5, note="n")
    assert ec.read_engine(files, KEY) == b"engine bytes"
    sidecar = json.loads(files.sidecar.read_text())
    assert sidecar["fields"] == KEY.fields() and sidecar["engine_bytes"] == 12
    assert sidecar["build_seconds"] == 2.5 and sidecar["model"] == "m:1"
    assert sorted(p.name for p in files.engine.parent.iterdir()) == sorted(
        [files.engine.name, files.sidecar.name])


@pytest.mark.parametrize("damage", ["truncate", "flip", "sidecar_garbage", "sidecar_missing",
                                    "sidecar_other_key"])
def test_engine_cache_when_damaged_reads_absent_and_removes_it(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    files = ec.files_for(tmp_path, "m", 1, KEY)
    ec.write_engine(files, KEY, b"0123456789" * 10, label="m:1", build_seconds=1.0)
    if damage == "truncate":
        files.engine.write_bytes(files.engine.read_bytes()[:37])
    elif damage == "flip":
        files.engine.write_bytes(b"X" + files.engine.read_bytes()[1:])
    elif damage == "sidecar_garbage":
        files.sidecar.write_text("{not json")
    elif damage == "sidecar_missing":
        files.sidecar.unlink()
    else:
        doc = json.loads(files.sidecar.read_text())
        doc["fields"]["precision"] = "fp32"
        files.sidecar.write_text(json.dumps(doc))
    assert ec.read_engine(files, KEY) is None
    assert "will be rebuilt" in caplog.text
    assert not files.engine.exists() and not files.sidecar.exists()


def test_engine_cache_when_nothing_built_reads_absent_quietly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert ec.read_engine(ec.files_for(tmp_path, "m", 1, KEY), KEY) is None
    assert caplog.text == ""


def test_timing_cache_path_is_per_tensorrt_version_and_gpu(tmp_path: Path) -> None:
    path = ec.timing_cache_path(tmp_path, KEY)
    assert path == tmp_path / "tensorrt" / "timing-10.13.0-orin-sm87.cache"
    assert ec.timing_cache_path(tmp_path, dataclasses.replace(KEY, model_sha256="x")) == path
