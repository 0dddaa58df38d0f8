"""A quick model asked by one client at a time runs on the API's own loop thread (no hop to
a worker and back), and the answers are the model's."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from support.backends import GateBackend
from support.daemon import ServeFactory

from edged.inference import batcher


def test_api_when_one_client_asks_a_quick_model_runs_it_on_the_loop(
        gate: GateBackend, make_served: ServeFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batcher, "INLINE_MAX_NS", 1 << 60)  # quick, whatever this box's load
    served = make_served()
    session = ort.InferenceSession(str(served.daemon.cache.describe("tiny_cls").onnx_path),
                                   providers=["CPUExecutionProvider"])
    gate.reset()
    rng = np.random.default_rng(3)
    with served.client() as client:
        for _ in range(3):
            x = rng.random((1, 3, 8, 8), dtype=np.float32)
            got = client.infer("tiny_cls", {"x": x}).outputs["prob"]
            np.testing.assert_allclose(got, session.run(None, {"x": x})[0], rtol=1e-5)
    assert gate.threads[0].startswith("edged-tiny_cls")  # the first one times the model
    assert gate.threads[1:] == ["edged-test-daemon"] * 2  # then on the loop's own thread
