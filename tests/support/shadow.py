"""Shadow-rollout tests share: a tiny_cls candidate that agrees with the serving version (its
weights nudged: other bytes, the same top-1 answers), and live socket traffic on a thread whose
every answer is checked against the version that must be serving."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from onnx import numpy_helper

from support.daemon import Served
from support.ota import expected
from tools.assets import models as test_models

INPUTS = np.random.default_rng(7).random((16, 1, 3, 8, 8), dtype=np.float32)


def nudged_cls_bytes(seed: int, scale: float = 1.02) -> bytes:
    """tiny_cls(seed) with its weights scaled a little: other bytes, the same top-1 answers."""
    model = test_models.make_tiny_cls(seed)
    for init in model.graph.initializer:
        if init.name == "W":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * scale, "W"))
    return model.SerializeToString()


class Traffic:
    """Socket requests on a thread until stopped: every answer checked against the version
    that must be serving (v1 until `switch_to` says otherwise), every failure kept."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.answers = 0
        self.failures: list[str] = []
        self.mismatches = 0
        self.stop = threading.Event()
        self.want = [expected(0, x) for x in INPUTS]
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.served.client() as client:
            i = 0
            while not self.stop.is_set():
                x = INPUTS[i % len(INPUTS)]
                try:
                    got = client.infer("tiny_cls", {"x": x}).outputs["prob"]
                except Exception as exc:  # every failure is a finding
                    self.failures.append(repr(exc))
                else:
                    self.answers += 1
                    if not np.allclose(got, self.want[i % len(INPUTS)], rtol=1e-5):
                        self.mismatches += 1
                i += 1


@contextmanager
def traffic(served: Served) -> Iterator[Traffic]:
    live = Traffic(served)
    live.thread.start()
    try:
        yield live
    finally:
        live.stop.set()
        live.thread.join(30)
