"""A stock detector served end to end with no model.yaml: the real repository reads its head,
labels and letterbox from the file, the cache loads it on ONNX Runtime, the scheduler batches
its frames, and a stream pipeline plays a video OpenCV wrote (a dark 160x120 frame, then a lit
square at a known place) and publishes boxes in frame pixels. An SSD or a DETR pair whose file
says nothing of its pre-processing has it stated in a model.yaml (edged guesses none)."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from support.backends import options

from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.sources import SensorLink, open_source
from edged.streams.config import StreamConfig
from edged.streams.pipeline import StreamPipeline
from tools.assets import models as test_models

SQUARE = (60, 40, 100, 80)  # x1, y1, x2, y2
DARK_FRAMES, LIT_FRAMES = 2, 4


def write_square_video(path: Path) -> Path:
    """MJPG (OpenCV's own writer): dark frames, then a green square on black."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 60.0, (160, 120))
    assert writer.isOpened(), f"OpenCV cannot write {path}"
    try:
        for i in range(DARK_FRAMES + LIT_FRAMES):
            frame = np.zeros((120, 160, 3), np.uint8)
            if i >= DARK_FRAMES:
                x1, y1, x2, y2 = SQUARE
                frame[y1:y2, x1:x2] = (0, 255, 0)
            writer.write(frame)
    finally:
        writer.release()
    return path


@pytest.fixture
def scheduler(tmp_path: Path) -> Iterator[Scheduler]:
    names = ["det_yolov8", "det_yolov5", "det_end2end", "det_ssd_background", "det_detr_pair"]
    root = test_models.write_repository(tmp_path / "models", names=names)
    for name in ("det_ssd_background", "det_detr_pair"):  # no metadata to read it from
        (root / name / "model.yaml").write_text("preprocess: {color: rgb}\n")
    cache = ModelCache(ModelRepository(root), budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    try:
        yield scheduler
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)


@pytest.mark.parametrize("name", ["det_yolov8", "det_yolov5", "det_end2end",
                                  "det_ssd_background", "det_detr_pair"])
def test_stream_when_a_stock_detector_has_no_model_yaml_publishes_the_square_in_frame_pixels(
        scheduler: Scheduler, tmp_path: Path, name: str) -> None:
    video = write_square_video(tmp_path / "square.avi")
    cfg = StreamConfig(name="cam", source=f"file://{video}", model=name, backpressure="block")
    published: queue.Queue[dict[str, Any]] = queue.Queue()
    pipeline = StreamPipeline(cfg, open_source(cfg, SensorLink(None, None, (), np.dtype("f4"))),
                              scheduler, lambda _stream, payload: published.put(
                                  json.loads(payload)))
    pipeline.start()
    try:
        messages = [published.get(timeout=30) for _ in range(DARK_FRAMES + LIT_FRAMES)]
    finally:
        pipeline.stop(5)
    assert pipeline.stats.failed == 0, pipeline.stats.last_error
    for message in messages:
        assert message["frame"] == {"width": 160, "height": 120}
        found = message["results"]["detections"]
        if message["seq"] <= DARK_FRAMES:
            assert found == [], f"frame {message['seq']} is dark"
            continue
        assert [(d["class"], d["label"]) for d in found] == [(1, "bicycle")]
        assert found[0]["box"] == pytest.approx(SQUARE, abs=4)  # JPEG blurs the edges
