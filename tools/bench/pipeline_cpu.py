"""The stream pipeline's own CPU per frame, outside decode and the model: a 640x480 frame of a
detect stream through edged's `StreamPipeline` stages (pre-processing into the stream's pooled
buffer, letterboxed to a YOLOv8 input of 640x640; post-processing of a YOLOv8 head [1, 84, 8400]
holding 20 objects; the result JSON; publishing it at QoS 0 through edged's `MqttLink` to a
private mosquitto). The head is made as a real one looks (tools/bench/post.py) instead of
running a model, and the frame is decoded once beforehand: what is timed is the pipeline alone.
CPU is the bench process's (all threads: paho's network thread included) over N frames. The
process takes the daemon's malloc settings first (`edged.hardware.host`, as `edged run` does): they
decide whether per-frame buffers are reused or faulted in afresh (a trim threshold of 1 MiB
made pre-processing 3.4x dearer), so the bench must run under them to measure the daemon."""

from __future__ import annotations

import time
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from edged.hardware import host
from edged.model.repository import ModelRepository
from edged.mqtt.config import MqttConfig
from edged.mqtt.link import MqttLink
from edged.processing.detections import Detections
from edged.sources import Frame
from edged.streams.config import StreamConfig
from edged.streams.pipeline import StreamPipeline, _InFlight
from tools.bench.broker import loopback_broker
from tools.bench.post import yolov8_head

OBJECTS = 16  # objects in the scene: ~20 detections a frame after NMS (some split in two)
MODEL_YAML = """max_batch_size: 1
preprocess: {keep_ratio: true, pad_value: 114}
postprocess: {kind: detect, score_threshold: 0.25}
"""


def write_detector(root: Path) -> None:
    """An ONNX file with YOLOv8n's signature and Ultralytics metadata (its graph is a stand-in:
    the model is not what is timed)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1),
             helper.make_node("Mul", ["m", "zero"], ["z"]),
             helper.make_node("Add", ["head", "z"], ["output0"])]
    inits = [numpy_helper.from_array(np.zeros((1, 84, 8400), np.float32), "head"),
             numpy_helper.from_array(np.zeros((1, 1, 1, 1), np.float32), "zero")]
    graph = helper.make_graph(
        nodes, "yolov8_stand_in",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 640, 640])],
        [helper.make_tensor_value_info("output0", onnx.TensorProto.FLOAT, [1, 84, 8400])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    names = {i: f"class{i}" for i in range(80)}
    helper.set_model_props(model, {"author": "Ultralytics", "task": "detect", "stride": "32",
                                   "batch": "1", "imgsz": "[640, 640]", "names": str(names)})
    (root / "det" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "det" / "1" / "model.onnx"))
    (root / "det" / "model.yaml").write_text(MODEL_YAML)


def measure(workdir: Path, *, frames: int) -> dict[str, Any]:
    host.limit_heap_arenas()
    host.fix_heap_thresholds()
    root = workdir / "pipeline-models"
    write_detector(root)
    model = ModelRepository(root).resolve("det")
    rng = np.random.default_rng(0)
    heads = [{"output0": yolov8_head(rng, OBJECTS, (40, 200), 60)} for _ in range(8)]
    image = rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)
    with loopback_broker(workdir / "pipeline-broker") as (port, _):
        link = MqttLink(MqttConfig(port=port), prefix="edged/bench", client_id="bench-pipe")
        link.start()
        if not link.wait_connected(10):
            raise RuntimeError("the bench's MQTT link did not connect")
        try:
            cfg = StreamConfig(name="cam", source="file:///dev/null", model="det")
            source = SimpleNamespace(kind="file")
            pipeline = StreamPipeline(cfg, source, None,  # type: ignore[arg-type]
                                      lambda stream, payload: link.publish(
                                          "results", f"streams/{stream}/results", payload))
            boxes = []

            def one(seq: int) -> None:
                frame = Frame("cam", seq, time.time(), time.monotonic(), image)
                _, geometry, buffer = pipeline._inputs(frame, model)
                done: Future[Any] = Future()
                pipeline._finish(_InFlight(frame, geometry, done, buffer, model,
                                           time.monotonic()), heads[seq % len(heads)])

            for seq in range(20):  # warm
                one(seq)
            began_cpu, began = time.process_time(), time.perf_counter()
            for seq in range(frames):
                one(seq)
            cpu = time.process_time() - began_cpu
            wall = time.perf_counter() - began
            boxes = [len(_detections(pipeline, model, h, image)) for h in heads]
        finally:
            link.stop()
    return {"cpu_ms_per_frame": cpu / frames * 1e3, "wall_ms_per_frame": wall / frames * 1e3,
            "frames": frames, "boxes_per_frame": boxes}


def _detections(pipeline: StreamPipeline, model: Any, head: dict[str, np.ndarray],
                image: np.ndarray) -> Detections:
    frame = Frame("cam", 0, time.time(), time.monotonic(), image)
    _, geometry, buffer = pipeline._inputs(frame, model)
    pipeline._release(buffer)
    post, _ = pipeline._per_version(model)
    return post(head, geometry).get("detections", Detections.empty())
