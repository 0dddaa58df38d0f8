"""The response cache on the served API, through Triton's own client: a model that opts in
answers a repeated request without running it, and the statistics extension and /metrics say
so as Triton would; outputs into shared memory are never cached; a swap empties the model's
entries; the byte budget holds."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.utils.shared_memory as triton_shm
from prometheus_client.parser import text_string_to_metric_families
from support.daemon import Served, ServeFactory
from support.models import write_yaml

from edged.inference.responses import ENTRY_OVERHEAD_BYTES
from tools.assets import models as test_models


def x_of(seed: int, rows: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).random((rows, 3, 8, 8), dtype=np.float32)


@pytest.fixture
def cached(repo_dir: Path, make_served: ServeFactory) -> Served:
    """tiny_cls (max_batch_size 16) with the response cache on, in a 1 MiB budget."""
    yaml = (repo_dir / "tiny_cls" / "model.yaml").read_text()
    write_yaml(repo_dir, "tiny_cls", yaml + "response_cache: true\n")
    return make_served(cache="preload: [tiny_cls], responses_mb: 1")


@pytest.fixture
def client(cached: Served) -> Iterator[triton.InferenceServerClient]:
    with triton.InferenceServerClient(cached.http, connection_timeout=30,
                                      network_timeout=30) as triton_client:
        yield triton_client


def infer(client: triton.InferenceServerClient, x: np.ndarray, binary: bool = True,
          outputs: list[triton.InferRequestedOutput] | None = None) -> triton.InferResult:
    given = triton.InferInput("x", list(x.shape), "FP32")
    given.set_data_from_numpy(x, binary_data=binary)
    return client.infer("tiny_cls", [given], outputs=outputs or [
        triton.InferRequestedOutput("prob", binary_data=binary)])


def stats(client: triton.InferenceServerClient, version: str = "1") -> dict:
    found = client.get_inference_statistics("tiny_cls")["model_stats"]
    return next(s for s in found if s["version"] == version)


def metrics(served: Served) -> dict[tuple[str, frozenset], float]:
    with triton.InferenceServerClient(served.http) as plain:
        text = plain._get("metrics", None, None).read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_tritonclient_when_a_request_repeats_gets_it_from_the_cache_counted_as_triton(
        client: triton.InferenceServerClient, cached: Served) -> None:
    first = infer(client, x_of(1)).as_numpy("prob")
    again = infer(client, x_of(1)).as_numpy("prob")
    other = infer(client, x_of(2)).as_numpy("prob")
    # The same tensor sent as JSON, asked for as JSON: the same key (what is asked, not how
    # it travels), so a hit; asking for every output (none named) is another key.
    as_json = infer(client, x_of(1), binary=False).as_numpy("prob")
    given = triton.InferInput("x", [1, 3, 8, 8], "FP32")
    given.set_data_from_numpy(x_of(1))
    every = client.infer("tiny_cls", [given]).as_numpy("prob")
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(first, as_json)
    np.testing.assert_array_equal(first, every)
    assert not np.array_equal(first, other)
    got = stats(client)
    counts = {k: v["count"] for k, v in got["inference_stats"].items()}
    assert counts["cache_hit"] == 2 and counts["cache_miss"] == 3
    assert counts["success"] == 5 and counts["fail"] == 0  # hits included
    assert counts["queue"] == 5  # hits included, as Triton counts them
    assert counts["compute_infer"] == 3  # hits ran nothing
    assert got["inference_count"] == 3 and got["execution_count"] == 3
    assert got["inference_stats"]["cache_hit"]["ns"] > 0
    assert got["inference_stats"]["cache_miss"]["ns"] > 0
    assert client.get_model_config("tiny_cls")["response_cache"] == {"enable": True}
    found = metrics(cached)
    labels = frozenset({"model": "tiny_cls", "version": "1"}.items())
    assert found[("edged_cache_num_hits_per_model_total", labels)] == 2
    assert found[("edged_cache_num_misses_per_model_total", labels)] == 3
    assert found[("edged_response_cache_entries", frozenset())] == 3


def test_tritonclient_when_outputs_go_to_shared_memory_never_uses_the_cache(
        client: triton.InferenceServerClient) -> None:
    x = x_of(3)
    key = "/edged-test-responses"
    handle = triton_shm.create_shared_memory_region("out", key, 16)
    try:
        client.register_system_shared_memory("out", key, 16)
        for _ in range(2):
            wanted = triton.InferRequestedOutput("prob", binary_data=True)
            wanted.set_shared_memory("out", 16)
            infer(client, x, outputs=[wanted])
        written = triton_shm.get_contents_as_numpy(handle, np.float32, [1, 4])
        np.testing.assert_allclose(written, infer(client, x).as_numpy("prob"), rtol=1e-6)
        client.unregister_system_shared_memory("out")
    finally:
        triton_shm.destroy_shared_memory_region(handle)
    inference = stats(client)["inference_stats"]
    assert inference["cache_hit"]["count"] == 0 and inference["cache_miss"]["count"] == 1


def test_tritonclient_when_the_model_is_swapped_its_cached_answers_go(
        client: triton.InferenceServerClient, cached: Served) -> None:
    infer(client, x_of(1))
    infer(client, x_of(1))
    assert len(cached.daemon.responses) == 1
    second = test_models.make_tiny_cls(seed=7)
    cached.daemon.repository.install("tiny_cls", 2, {"model.onnx": second.SerializeToString()})
    cached.daemon.cache.swap("tiny_cls", 2)
    assert len(cached.daemon.responses) == 0 and cached.daemon.responses.bytes == 0
    answers = [infer(client, x_of(1)) for _ in range(3)]
    assert [a.get_response()["model_version"] for a in answers] == ["2", "2", "2"]
    inference = stats(client, "2")["inference_stats"]
    # The batcher follows the swap at the first request's admission (issue 49, item 1): that
    # one misses under version 2's key and is kept; the next two find it.
    assert inference["cache_hit"]["count"] == 2 and inference["cache_miss"]["count"] == 1


def test_tritonclient_when_answers_outgrow_the_budget_the_oldest_go(
        client: triton.InferenceServerClient, cached: Served) -> None:
    responses = cached.daemon.responses
    rows = 16  # an answer of 256 bytes, keyed by a digest of the 12 KiB input
    count = 0
    while responses.evictions == 0:
        infer(client, x_of(count, rows))
        count += 1
        assert count < 4 * (1 << 20) // ENTRY_OVERHEAD_BYTES, "the budget never filled"
    assert responses.bytes <= responses.budget_bytes == 1 << 20
    found = metrics(cached)
    assert found[("edged_response_cache_bytes", frozenset())] <= 1 << 20
    assert found[("edged_response_cache_evictions_total", frozenset())] >= 1
    infer(client, x_of(count - 1, rows))  # the newest is still there
    assert stats(client)["inference_stats"]["cache_hit"]["count"] == 1
