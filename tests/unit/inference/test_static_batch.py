"""Graphs with a fixed batch dim, as exporters write them by default (Ultralytics'
`dynamic=False`: [1, 3, H, W] in, [1, 84, 8400] out): the repository serves them batched with
max_batch_size N, the batcher never sends the graph another batch size (fewer rows are padded
with zero rows and cut off again), and the TensorRT profiles and the warm-up run exactly N."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from support.backends import GateBackend, hold_worker
from support.models import write_yaml

from edged.api.describe import model_config, model_metadata
from edged.backends.config import OrtConfig
from edged.backends.onnxruntime import provider_chain
from edged.backends.profiles import InputProfile, derive_profile
from edged.core.errors import InvalidInput, InvalidModel
from edged.inference.batching import validate
from edged.inference.cache import ModelCache
from edged.inference.loadspec import backend_options, engine_hints, load_spec, warmup_inputs
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.model.tensor import TensorSpec
from tools.assets import models as test_models

Core = tuple[ModelCache, Scheduler]
TRT, CPU = "TensorrtExecutionProvider", "CPUExecutionProvider"


@pytest.fixture
def static_dir(repo_dir: Path) -> Path:
    """The test repository plus colors_b1 ([1, 3, 64, 64]) and tiny_cnn_b4 ([4, 3, H, W])."""
    test_models.write_repository(repo_dir, names=["colors_b1", "tiny_cnn_b4"])
    return repo_dir


def images(seed: int, rows: int = 1, size: int = 64) -> np.ndarray:
    # Strictly positive: a row of zeros in a backend call is padding, never a request's row.
    return np.random.default_rng(seed).uniform(0.1, 1, (rows, 3, size, size)).astype(np.float32)


def unbatched(repo: ModelRepository, name: str, x: np.ndarray) -> np.ndarray:
    """What ONNX Runtime computes from `name`'s file for `x` alone (a dynamic-batch twin)."""
    session = ort.InferenceSession(str(repo.resolve(name).onnx_path),
                                   providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {session.get_inputs()[0].name: x})[0])


def submit_at_once(scheduler: Scheduler, model: str, inputs: list[np.ndarray]) -> list:
    """Submit every input from its own thread, all released together."""
    start = threading.Barrier(len(inputs))
    futures: list = [None] * len(inputs)

    def submit(i: int) -> None:
        start.wait(10)
        futures[i] = scheduler.submit(model, {"image": inputs[i]})

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return futures


# -- the repository ---------------------------------------------------------------------------
def test_repository_when_graph_has_a_static_batch_serves_it_batched_up_to_that_size(
        static_dir: Path) -> None:
    repo = ModelRepository(static_dir)
    one, four = repo.resolve("colors_b1"), repo.resolve("tiny_cnn_b4")
    assert (one.max_batch_size, one.fixed_batch) == (1, 1)
    assert (four.max_batch_size, four.fixed_batch) == (4, 4)
    assert [s.shape for s in one.inputs + one.outputs] == [(1, 3, 64, 64), (1, 3)]
    assert [s.shape for s in four.inputs + four.outputs] == [(4, 3, -1, -1), (4, 5)]
    config = model_config(one)
    assert config["max_batch_size"] == 1 and config["input"][0]["dims"] == [3, 64, 64]
    assert config["edged"]["fixed_batch_size"] == 1
    assert model_config(four)["edged"]["fixed_batch_size"] == 4
    assert model_metadata(one, [1])["inputs"] == [
        {"name": "image", "datatype": "FP32", "shape": [-1, 3, 64, 64]}]
    assert model_config(repo.resolve("tiny_cls"))["edged"]["fixed_batch_size"] is None


def test_repository_when_yaml_says_max_batch_size_0_keeps_the_full_static_shape(
        static_dir: Path) -> None:
    write_yaml(static_dir, "colors_b1", "max_batch_size: 0\n")
    model = ModelRepository(static_dir).resolve("colors_b1")
    assert (model.max_batch_size, model.fixed_batch) == (0, None)
    assert model.inputs[0].shape == (1, 3, 64, 64)
    assert model_config(model)["input"][0]["dims"] == [1, 3, 64, 64]


def test_repository_when_yaml_max_batch_exceeds_the_fixed_batch_names_file_dim_and_line(
        static_dir: Path) -> None:
    write_yaml(static_dir, "tiny_cnn_b4", "instances: 1\nmax_batch_size: 8\n")
    with pytest.raises(InvalidModel) as caught:
        ModelRepository(static_dir).resolve("tiny_cnn_b4")
    assert (f"{static_dir / 'tiny_cnn_b4' / 'model.yaml'}: max_batch_size: is 8, but image in "
            "model.onnx has a fixed batch dim of 4 (shape [4, 3, -1, -1]); use max_batch_size: "
            "4 or less, or 0 for no batch dim (line 2)") in str(caught.value)


def test_repository_when_yaml_max_batch_is_below_the_fixed_batch_keeps_both(
        static_dir: Path) -> None:
    write_yaml(static_dir, "tiny_cnn_b4", "max_batch_size: 2\n")
    model = ModelRepository(static_dir).resolve("tiny_cnn_b4")
    assert (model.max_batch_size, model.fixed_batch) == (2, 4)


def test_repository_when_only_some_first_dims_are_fixed_infers_no_batch_dim(
        repo_dir: Path) -> None:
    model = test_models.make_tiny_cls()
    test_models.fix_first_dim(model.graph.input, 1)  # output stays [batch, 4]
    test_models.write_model(model, repo_dir / "tiny_cls" / "1" / "model.onnx")
    (repo_dir / "tiny_cls" / "model.yaml").unlink()
    assert ModelRepository(repo_dir).resolve("tiny_cls").max_batch_size == 0
    write_yaml(repo_dir, "tiny_cls", "max_batch_size: 1\n")
    with pytest.raises(InvalidModel, match=r"max_batch_size: is 1, but x in model.onnx has no "
                                           r"dynamic first dim \(shape \[1, 3, 8, 8\]\), nor "
                                           r"one fixed batch dim shared by every input"):
        ModelRepository(repo_dir).resolve("tiny_cls")


# -- what backends are handed -----------------------------------------------------------------
def test_profiles_when_the_batch_is_fixed_are_that_batch_at_min_opt_and_max(
        static_dir: Path) -> None:
    repo = ModelRepository(static_dir)
    four = repo.resolve("tiny_cnn_b4")
    assert engine_hints(four)["opt_batch_size"] == 4
    assert derive_profile(load_spec(four)) == (
        InputProfile("image", (4, 3, 8, 8), (4, 3, 16, 16), (4, 3, 32, 32)),)
    (p,) = derive_profile(load_spec(repo.resolve("colors_b1")))
    assert p.min == p.opt == p.max == (1, 3, 64, 64)


def test_trt_ep_options_when_the_batch_is_fixed_profile_only_dynamic_inputs_at_that_batch(
        static_dir: Path, tmp_path: Path) -> None:
    repo = ModelRepository(static_dir)
    options = backend_options(OrtConfig(), tmp_path)
    (_, trt), *_ = provider_chain(load_spec(repo.resolve("tiny_cnn_b4")), options, [TRT, CPU])
    assert (trt["trt_profile_min_shapes"], trt["trt_profile_opt_shapes"],
            trt["trt_profile_max_shapes"]) == ("image:4x3x8x8", "image:4x3x16x16",
                                               "image:4x3x32x32")
    (_, trt), *_ = provider_chain(load_spec(repo.resolve("colors_b1")), options, [TRT, CPU])
    assert not any(key.startswith("trt_profile") for key in trt)  # a static graph takes none


def test_warmup_when_the_batch_is_fixed_runs_the_graphs_batch(
        static_dir: Path, core: Core) -> None:
    write_yaml(static_dir, "tiny_cnn_b4", "warmup: {batch_size: 2, shapes: {image: [3, 8, 8]}}\n")
    repo = ModelRepository(static_dir)
    assert warmup_inputs(repo.resolve("tiny_cnn_b4"))["image"].shape == (4, 3, 8, 8)
    assert warmup_inputs(repo.resolve("colors_b1"))["image"].shape == (1, 3, 64, 64)
    cache, _ = core
    cache.load("tiny_cnn_b4")  # the warm-up runs on a real session, which takes 4 rows only
    assert cache.ready("tiny_cnn_b4")


# -- the batcher ------------------------------------------------------------------------------
def test_batcher_when_the_batch_is_fixed_at_one_runs_every_request_alone(
        static_dir: Path, core: Core, gate: GateBackend, repo: ModelRepository) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "colors_b1", {"image": images(0)})
    inputs = [images(seed) for seed in range(1, 9)]
    futures = submit_at_once(scheduler, "colors_b1", inputs)
    gate.gate.set()
    results = [f.result(10)["prob"] for f in futures]
    first.result(10)
    assert [call["image"].shape for call in gate.calls] == [(1, 3, 64, 64)] * 9
    for x, got in zip(inputs, results, strict=True):
        np.testing.assert_allclose(got, unbatched(repo, "colors_b1", x), rtol=1e-5, atol=1e-6)


def test_batcher_when_the_batch_is_fixed_at_four_pads_and_returns_each_requests_rows(
        static_dir: Path, core: Core, gate: GateBackend, repo: ModelRepository) -> None:
    _, scheduler = core
    first = hold_worker(scheduler, gate, "tiny_cnn_b4", {"image": images(0, size=8)})
    inputs = [images(seed, rows=1 + seed % 3, size=8) for seed in range(1, 9)]  # 17 rows
    futures = submit_at_once(scheduler, "tiny_cnn_b4", inputs)
    gate.gate.set()
    results = [f.result(10)["logits"] for f in futures]
    first.result(10)
    sent = [call["image"] for call in gate.calls]
    assert all(batch.shape == (4, 3, 8, 8) for batch in sent)
    real = [int(np.count_nonzero(batch.reshape(4, -1).any(axis=1))) for batch in sent]
    for batch, rows in zip(sent, real, strict=True):
        assert not batch[rows:].any()  # the real rows first, zero rows after them
    assert sum(real) == 1 + 17 and max(real) <= 4
    assert any(rows < 4 for rows in real[1:])  # the story covers padding a queued batch too
    for x, got in zip(inputs, results, strict=True):
        assert got.shape == (len(x), 5)
        # tiny_cnn has the same weights with a dynamic batch: the request run on its own.
        np.testing.assert_allclose(got, unbatched(repo, "tiny_cnn", x), rtol=1e-5, atol=1e-6)


def test_scheduler_infer_when_the_batch_is_fixed_pads_a_request_run_inline(
        static_dir: Path, core: Core, repo: ModelRepository) -> None:
    _, scheduler = core
    x = images(3, rows=3, size=16)
    got = scheduler.infer("tiny_cnn_b4", {"image": x})["logits"]
    assert got.shape == (3, 5)
    np.testing.assert_allclose(got, unbatched(repo, "tiny_cnn", x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("model", "x", "message"), [
    ("colors_b1", images(0, rows=2), r"colors_b1:1: batch of 2 is outside 1..1 \(its ONNX "
                                     r"graph has a fixed batch dim of 1: a request brings at "
                                     r"most 1 row\)"),
    ("tiny_cnn_b4", images(0, rows=5, size=8), r"batch of 5 is outside 1..4 \(its ONNX graph "
                                               r"has a fixed batch dim of 4: a request brings "
                                               r"at most 4 rows\)"),
    ("colors_b1", images(0)[0], r"input image has shape \[3, 64, 64\], expected \[-1, 3, 64, "
                                r"64\]; the first dim is the batch dim: send \[1, 3, 64, 64\]"),
])
def test_scheduler_when_a_request_does_not_fit_the_fixed_batch_raises_invalid_input(
        static_dir: Path, core: Core, model: str, x: np.ndarray, message: str) -> None:
    _, scheduler = core
    with pytest.raises(InvalidInput, match=message):
        scheduler.submit(model, {"image": x})


def _model(shape: tuple[int, ...], max_batch_size: int) -> Any:
    """What `validate` reads of a ModelVersion."""
    return SimpleNamespace(inputs=(TensorSpec("x", np.dtype(np.float32), shape),),
                           max_batch_size=max_batch_size, fixed_batch=None, label="m:1",
                           is_language=False)


@pytest.mark.parametrize(("shape", "max_batch", "given", "rows"), [
    ((-1, 3), 8, (2, 3), 2),  # every dim after the batch one as the spec has it
    ((-1,), 8, (5,), 5),  # nothing after the batch dim
    ((-1, -1), 8, (1, 7), 1),  # a dynamic dim
    ((2, 3), 0, (2, 3), 1),  # not batched: the whole shape
])
def test_validate_when_the_shape_fits_gives_its_rows(shape: tuple[int, ...], max_batch: int,
                                                     given: tuple[int, ...], rows: int) -> None:
    assert validate(_model(shape, max_batch), {"x": np.zeros(given, np.float32)})[0] == rows


@pytest.mark.parametrize(("shape", "max_batch", "given"), [
    ((-1,), 8, ()),  # no batch dim at all: the dims after it match, the rank does not
    ((-1, 3), 8, (3,)),
    ((-1, 3), 8, (2, 4)),
    ((2, 3), 0, (3, 2)),
    ((2, 3), 0, (1, 2, 3)),
])
def test_validate_when_the_shape_does_not_fit_refuses_it(shape: tuple[int, ...], max_batch: int,
                                                         given: tuple[int, ...]) -> None:
    with pytest.raises(InvalidInput, match="input x has shape"):
        validate(_model(shape, max_batch), {"x": np.zeros(given, np.float32)})
