"""The schema of a model's `model.yaml` (Triton-like), before it is merged with the ONNX file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from edged.core.errors import ConfigIssue
from edged.core.schema import Parsed, at_least, between, each, setting

DTYPES = {
    "float32": np.float32, "float16": np.float16, "float64": np.float64,
    "int8": np.int8, "uint8": np.uint8, "int16": np.int16, "uint16": np.uint16,
    "int32": np.int32, "int64": np.int64, "uint32": np.uint32, "uint64": np.uint64,
    "bool": np.bool_,
}


def _check_dtype(value: str) -> str | None:
    return None if value in DTYPES else f"unknown dtype {value!r} (one of {', '.join(DTYPES)})"


def _check_dims(dims: list[int]) -> str | None:
    bad = [d for d in dims if d < -1 or d == 0]
    return f"dims must be positive or -1 (dynamic), got {bad}" if bad else None


@dataclass(frozen=True)
class TensorConfig:
    """One input or output; dtype and shape may be left out and are then read from the ONNX file."""

    name: str = setting(help="tensor name as in the ONNX graph")
    dtype: str | None = setting(None, "element type, e.g. float32", check=_check_dtype)
    shape: list[int] | None = setting(None, "dims without the batch dim; -1 is dynamic",
                                      check=_check_dims)


@dataclass(frozen=True)
class BatchingConfig:
    """Triton's dynamic batcher parameters."""

    preferred_batch_sizes: list[int] = setting(factory=list, help="batch sizes to aim for",
                                               check=each(at_least(1)))
    max_queue_delay_us: int = setting(0, "how long a batch may wait to grow", check=at_least(0))
    max_queue_size: int = setting(256, "queued requests before QueueFull", check=at_least(1))
    priority_levels: int = setting(1, "number of priority levels; 1 is the highest",
                                   check=between(1, 16))
    default_priority: int = setting(0, "priority of requests that name none; 0 = the lowest",
                                    check=at_least(0))
    default_timeout_ms: int = setting(0, "queue timeout of requests that name none; 0 = none",
                                      check=at_least(0))


@dataclass(frozen=True)
class VersionPolicy:
    """Which versions on disk are served: the latest N, a specific list, or all."""

    latest: int | None = setting(None, "serve the newest N versions", check=at_least(1))
    specific: list[int] | None = setting(None, "serve exactly these versions",
                                         check=each(at_least(1)))
    all: bool = setting(False, "serve every version on disk")


@dataclass(frozen=True)
class WarmupConfig:
    enabled: bool = setting(True, "run one inference before the model is reported ready")
    batch_size: int = setting(1, "batch size of the warm-up request", check=at_least(1))
    shapes: dict[str, list[int]] = setting(factory=dict,
                                           help="per input: the dims (without the batch dim) of "
                                                "its warm-up tensor; a dynamic dim not given "
                                                "here is 32")


@dataclass(frozen=True)
class OrtOverrides:
    """Per-model overrides of the daemon's ONNX Runtime options."""

    providers: list[Literal["tensorrt", "cuda", "cpu"]] | None = setting(
        None, "provider chain for this model, best first; null = backends.onnxruntime's")
    intra_op_threads: int | None = setting(None, "threads inside one operator (0 = timed per "
                                           "model); null = backends.onnxruntime's",
                                           check=at_least(0))
    inter_op_threads: int | None = setting(None, "threads across operators; null = "
                                           "backends.onnxruntime's", check=at_least(0))
    allow_spinning: bool | None = setting(None, "let idle ORT threads spin; null = "
                                          "backends.onnxruntime's")
    gpu_mem_limit_mb: int | None = setting(None, "CUDA EP: arena limit in MiB; null = none",
                                           check=at_least(1))
    cudnn_conv_algo_search: Literal["exhaustive", "heuristic", "default"] | None = setting(
        None, "CUDA EP: how convolution algorithms are picked (ORT's default: exhaustive)")
    workspace_mb: int | None = setting(None, "TensorRT EP (and the TensorRT backend): builder "
                                       "workspace in MiB", check=at_least(16))


def _check_range(shape_range: ShapeRangeConfig) -> str | None:
    dims = (shape_range.min, shape_range.opt, shape_range.max)
    if len({len(d) for d in dims}) != 1:
        return "min, opt and max must have the same number of dims"
    if any(d < 1 for d in shape_range.min) or not all(
            lo <= mid <= hi for lo, mid, hi in zip(*dims, strict=True)):
        return "needs 1 <= min <= opt <= max in every dim"
    return None


def _check_ranges(ranges: dict[str, ShapeRangeConfig]) -> str | None:
    for name, shape_range in ranges.items():
        message = _check_range(shape_range)
        if message:
            return f"{name}: {message}"
    return None


@dataclass(frozen=True)
class ShapeRangeConfig:
    """The dims (without the batch dim) one input with dynamic dims may take on TensorRT."""

    min: list[int] = setting(help="smallest dims")
    opt: list[int] = setting(help="dims the engine is tuned for")
    max: list[int] = setting(help="largest dims")


@dataclass(frozen=True)
class TensorRTOverrides:
    """Per-model TensorRT engine settings."""

    shapes: dict[str, ShapeRangeConfig] = setting(
        factory=dict, help="per input with dynamic non-batch dims: their min/opt/max; without "
        "one such a model stays on ONNX Runtime", check=_check_ranges)
    dla_core: int | None = setting(
        None, "Jetson: build this model's engine for DLA core 0 or 1 (Orin AGX/NX have two); "
        "null = the daemon's backends.tensorrt.dla_core. Without that core: the GPU, logged",
        check=between(0, 15))
    gpu_fallback: bool = setting(True, "on a DLA: layers the DLA cannot run go to the GPU "
                                       "(false: the build fails instead, and the model stays "
                                       "on ONNX Runtime)")


# Candidates above the score threshold that go on to NMS, best first (tools/bench/post.py).
PRE_NMS_TOP_K = 1000


def _check_size(size: list[int]) -> str | None:
    return None if len(size) == 2 and min(size) > 0 else "resize must be [width, height] > 0"


def _check_triple(values: list[float]) -> str | None:
    return None if len(values) in (1, 3) else "give one value or one per channel (3)"


@dataclass(frozen=True)
class PreprocessConfig:
    """How a frame becomes an input tensor: resize (or letterbox), colour order, scale, mean/std
    normalisation, layout. The result is ((pixel * scale) - mean) / std per channel."""

    resize: list[int] | None = setting(None, "[width, height]; null = the input's own H and W",
                                       check=_check_size)
    resize_short: int | None = setting(
        None, "resize so that the shorter side is this many pixels, the ratio kept (PaddleClas' "
        "ResizeImage resize_short, torchvision's Resize(int)); then `crop: center` cuts the "
        "tensor's size out of it. null = resize to the tensor's size", check=at_least(1))
    crop: Literal["none", "center"] = setting(
        "none", "center: the tensor's size is cut from the middle of the resized image "
        "(PaddleClas' CropImage, torchvision's CenterCrop; offsets by crop_offset); the "
        "rest of the image is not seen")
    crop_offset: Literal["floor", "round"] = setting(
        "floor", "crop: center: how the offset (w - W) / 2 is made whole: floor (PaddleClas' "
        "CropImage) or round, half to even (torchvision's CenterCrop, Ultralytics' "
        "classifiers)")
    keep_ratio: bool = setting(False, "letterbox: keep the aspect ratio, pad the rest")
    pad: Literal["center", "end"] = setting("center", "letterbox padding: both sides, or "
                                            "right/bottom only (PP-OCR)")
    pad_value: float = setting(0.0, "value of padded pixels, before scaling (0-255)")
    color: Literal["rgb", "bgr", "gray"] = setting("rgb", "channel order the model expects")
    scale: float = setting(1 / 255, "pixels are multiplied by this first")
    mean: list[float] = setting(factory=lambda: [0.0], help="subtracted after scaling",
                                check=_check_triple)
    std: list[float] = setting(factory=lambda: [1.0], help="divided by after the mean",
                               check=_check_triple)
    layout: Literal["nchw", "nhwc"] = setting(
        "nchw", "tensor layout; unset: told from the input's shape (a last dim of 1, 3 or 4 "
        "after the spatial dims is nhwc)")
    interpolation: Literal["auto", "linear", "area", "nearest", "cubic", "lanczos",
                           "pillow_bilinear"] = setting(
        "auto", "how the image is resized (OpenCV's INTER_*; lanczos = INTER_LANCZOS4, "
        "RapidAI's PaddleClas classifiers; pillow_bilinear = Pillow's antialiased bilinear "
        "`Image.resize`, to the bit: torchvision's Resize on PIL images, Ultralytics' "
        "classifiers); auto = area when shrinking, linear when growing. An exporter's own rule "
        "where edged knows it (YOLOX, Ultralytics' detectors: linear)")
    rounding: Literal["round", "floor", "ceil"] = setting(
        "round", "how a scaled size is made whole. keep_ratio: round (Ultralytics, YOLO-NAS), "
        "floor (YOLOX truncates), ceil (PaddleOCR's text lines). resize_short: round "
        "(PaddleClas: each side round(side * S / short)); floor (torchvision's Resize(S): the "
        "short side S, the long int(S * long / short))")


def _check_kpt_shape(shape: list[int]) -> str | None:
    return None if len(shape) == 2 and shape[0] > 0 and shape[1] in (2, 3) else \
        "kpt_shape must be [points, 2 or 3]"


HeadFormat = Literal["auto", "yolo", "yolov5", "yolov8", "yolox", "end2end", "ssd", "yolonas",
                     "detr", "priorbox", "scrfd", "yunet"]
# RetinaFace's priors (Pytorch_Retinaface's cfg_mnet / cfg_re50): two sizes a cell per step
RETINAFACE_PRIOR_SIZES = [[16.0, 32.0], [64.0, 128.0], [256.0, 512.0]]


def _check_prior_sizes(sizes: list[list[float]]) -> str | None:
    return None if sizes and all(s and min(s) > 0 for s in sizes) else \
        "prior_sizes must be one non-empty list of positive sizes per step"


@dataclass(frozen=True)
class PostprocessConfig:
    """What a stream publishes from the outputs: top-k classes, detections (boxes in frame
    pixels, after a score threshold and NMS), or the raw tensors (small ones in full)."""

    kind: Literal["classify", "detect", "segment", "pose", "text", "semantic", "embed",
                  "raw"] = setting(
        "raw", "what the outputs are read as (the task): classify (top-k classes), detect "
        "(boxes in frame pixels), segment (boxes with a mask polygon each: a detection table "
        "with mask coefficients + a prototypes output), pose (boxes with keypoints), text "
        "(a CTC recogniser: [N, T, C] over `names`, the character set, blank first), "
        "semantic (a class map [N, C, H, W]: per class its share of the frame and its "
        "regions as polygons), embed (an embedder's [N, D] vectors: a stream publishes their "
        "size, galleries match them) or raw "
        "(the tensors); unset: told by edged.tasks from the ONNX metadata and outputs, else "
        "raw with the reason")
    output: str | None = setting(None, "output to read (classify; detect: the one table); "
                                 "null = the first")
    labels: str | None = setting(None, "labels file, one per line, beside model.yaml")
    names: list[str] | None = setting(None, "class names in order; null = the labels file, "
                                      "else the ONNX file's metadata")
    top_k: int = setting(1, "classes reported (classify)", check=at_least(1))
    format: HeadFormat = setting(
        "auto", "detect head: auto = told by the output shapes and the ONNX metadata, at load; "
        "yolov5 = [N, 5+C] (objectness); yolov8 = [4+C, N]; yolox = [N, 5+C] raw grid offsets, "
        "one row per cell of the stride 8/16/32 grids; end2end = [K, 6] (x1, y1, x2, y2, "
        "score, class; no NMS); ssd = boxes [N, 4] + scores [N, C] or scores [N] + classes "
        "[N] (TF's detection_* outputs: y1, x1, y2, x2 0..1, ids from 1); yolonas = boxes "
        "[N, 4] x1, y1, x2, y2 pixels + scores [N, C]; detr = [Q, 4+C] or logits [Q, C] + "
        "boxes [Q, 4] (0..1 cx, cy, w, h; no NMS), or labels + boxes + scores (D-FINE); "
        "priorbox = RetinaFace-style loc [N, 4] + conf [N, 2] + landmarks [N, 2K] over prior "
        "boxes (prior_sizes, prior_steps, variance); scrfd = InsightFace's SCRFD: per stride "
        "8/16/32 scores [N, 1] + boxes [N, 4] (+ landmarks [N, 10]) as distances from anchor "
        "centres; yunet = OpenCV's YuNet: cls_, obj_, bbox_, kps_ per stride 8/16/32; yolo = "
        "yolov5 or yolov8 by `objectness` and `transposed`")
    objectness: bool = setting(False, "yolo: a 5th column scales the class scores")
    transposed: bool | None = setting(None, "yolo: the head is [4+C, N] (YOLOv8); null = "
                                      "guess: fewer rows than columns")
    background: bool | None = setting(None, "ssd: column 0 of the scores is the background "
                                      "class; null = guess (a Softmax, or one column more "
                                      "than names)")
    box: Literal["cxcywh", "xyxy", "yxyx"] = setting("cxcywh", "box encoding (when unset: "
                                                     "the head's own)")
    normalized: bool = setting(False, "boxes are 0..1 of the input size, not input pixels "
                               "(when unset: the head's own)")
    score_threshold: float = setting(0.25, "detections below are dropped", check=between(0, 1))
    iou_threshold: float = setting(0.45, "NMS overlap threshold", check=between(0, 1))
    pre_nms_top_k: int = setting(PRE_NMS_TOP_K, "best-scoring candidates kept for NMS",
                                 check=at_least(1))
    max_detections: int = setting(100, "most detections kept", check=at_least(1))
    max_values: int = setting(64, "raw: tensors up to this many values go in full",
                              check=at_least(0))
    proto: str | None = setting(None, "segment: the mask prototypes output [M, H, W]; null = "
                                "the one 4-d output")
    mask_threshold: float = setting(0.5, "segment: a pixel is in the mask at this probability "
                                    "(Ultralytics: 0.5)", check=between(0, 1))
    mask_points: int = setting(64, "segment: most points of a mask's polygon (the outer "
                               "contour, simplified until it fits)", check=between(4, 4096))
    kpt_shape: list[int] | None = setting(None, "pose: [points, 2 or 3] per detection (x, y "
                                          "and a score); null = the metadata's kpt_shape",
                                          check=_check_kpt_shape)
    keypoint_names: list[str] | None = setting(None, "pose: the points' names; null = the "
                                               "metadata's kpt_names, COCO's 17 for 17 points, "
                                               "a face's 5 landmarks for 5, else their index")
    prior_sizes: list[list[float]] = setting(
        factory=lambda: [list(s) for s in RETINAFACE_PRIOR_SIZES],
        help="priorbox: the prior boxes' sizes (input pixels) at each step, as the exporter's "
             "config has them (RetinaFace's: [[16, 32], [64, 128], [256, 512]])",
        check=_check_prior_sizes)
    prior_steps: list[int] = setting(factory=lambda: [8, 16, 32],
                                     help="priorbox: the feature maps' strides",
                                     check=each(at_least(1)))
    variance: list[float] = setting(factory=lambda: [0.1, 0.2],
                                    help="priorbox: the centre and size variances the boxes and "
                                         "landmarks are encoded with")


@dataclass(frozen=True)
class QuantizationConfig:
    """`edged quantize`: how the INT8 (QDQ) variant is made, and the accuracy gate it must pass
    against FP32 on held-out samples before it may be loaded. Top-1 agreement is checked for
    classifiers, cosine similarity for other models, the error bounds for any model where set."""

    min_top1_agreement: float = setting(0.98, "classifiers: share of held-out samples whose "
                                        "INT8 top-1 class equals FP32's", check=between(0, 1))
    max_accuracy_drop: float | None = setting(None, "labelled held-out samples: INT8 accuracy "
                                              "may be this far below FP32's", check=between(0, 1))
    min_cosine: float = setting(0.99, "other models: mean per-sample cosine similarity of the "
                                "INT8 outputs to FP32's", check=between(-1, 1))
    max_mean_abs_error: float | None = setting(None, "mean |INT8 - FP32| over the outputs",
                                               check=at_least(0))
    max_abs_error: float | None = setting(None, "largest |INT8 - FP32|", check=at_least(0))
    max_relative_error: float | None = setting(None, "||INT8 - FP32|| / ||FP32|| (L2)",
                                               check=at_least(0))
    calibration_samples: int = setting(128, "most calibration samples used (`--samples`)",
                                       check=at_least(1))
    held_out_fraction: float = setting(0.25, "share of the samples kept back for the gate "
                                       "when no held-out set is given", check=between(0.01, 0.9))
    activation_type: Literal["uint8", "int8"] = setting("uint8", "activations (U8S8 is the "
                                                        "faster kernel on x86 CPUs)")
    weight_type: Literal["int8", "uint8"] = setting("int8", "weights")
    per_channel: bool = setting(True, "one weight scale per output channel")
    symmetric: bool = setting(False, "zero points of 0 (set with activation_type: int8): the only "
                              "INT8 TensorRT runs; the asymmetric default suits CPUs")
    calibration_method: Literal["minmax", "entropy", "percentile"] = setting(
        "minmax", "how activation ranges are taken from the calibration samples")
    opset: int = setting(17, "the graph is converted to at least this opset first (ONNX "
                         "Runtime's pre-processing breaks older PP-OCR graphs)", check=at_least(13))
    auto_min_speedup: float = setting(1.05, "precision auto on CPU picks INT8 only when its "
                                      "measured p50 is this many times faster than FP32's",
                                      check=at_least(1))


@dataclass(frozen=True)
class LanguageConfig:
    """A language model's (model.gguf on llama.cpp, a trtllm/ folder on TensorRT-LLM) context,
    sequences, threads and request queue."""

    context: int = setting(2048, "tokens of context (prompt + answer) one sequence holds; its "
                           "KV cache is charged to the cache budget with the weights",
                           check=between(16, 131072))
    threads: int = setting(2, "CPU threads that generate (one token after another); the rest "
                           "of the cores stay with the cameras' models", check=between(1, 256))
    nice: int = setting(10, "OS niceness (0-19) of the threads that generate: above the "
                        "cameras' (0), so their inference wins the CPU when both want it",
                        check=between(0, 19))
    yield_to_streams: bool = setting(True, "between two tokens, wait while the cameras' "
                                     "(and the API's) vision inference is queued or running, "
                                     "at most yield_max_ms a token (decision 040)")
    yield_max_ms: int = setting(50, "the longest a token waits for vision inference to "
                                "finish (yield_to_streams): a chat beside busy cameras still "
                                "gets a token this often", check=between(1, 10000))
    preempt: bool = setting(True, "a request of a higher priority that finds every sequence "
                            "busy pauses the lowest-priority answer (it resumes where it was "
                            "when a slot frees, its prompt and tokens read again)")
    batch_threads: int | None = setting(None, "CPU threads that read the prompt; null = "
                                        "`threads`", check=between(1, 256))
    batch_size: int = setting(512, "prompt tokens evaluated per step (llama.cpp's n_batch); "
                              "with several sequences, the tokens of one step (a token per "
                              "answer and the prompts that join)", check=between(1, 8192))
    sequences: int = setting(4, "answers generated at once in one batched decode (continuous "
                             "batching; each holds `context` tokens of KV cache, charged to "
                             "the cache budget); 1 = one at a time, llama-cpp-python's own "
                             "generate", check=between(1, 64))
    gpu_layers: int = setting(0, "layers offloaded to the GPU where llama.cpp was built with "
                              "CUDA (-1 = all); 0 = the CPU only", check=at_least(-1))
    max_tokens: int = setting(256, "answer tokens of a request that names no max_tokens",
                              check=at_least(1))
    max_queue: int = setting(16, "requests queued (not yet generating) before QueueFull",
                             check=between(1, 4096))
    priority_levels: int = setting(2, "priority levels; 1 is the highest", check=between(1, 16))
    default_priority: int = setting(0, "priority of requests that name none; 0 = the lowest",
                                    check=at_least(0))
    default_timeout_ms: int = setting(0, "how long a request that names no timeout may wait in "
                                      "the queue before it starts; 0 = no limit",
                                      check=at_least(0))


@dataclass(frozen=True)
class ModelConfig:
    """`models/<name>/model.yaml`; every key optional where the ONNX file can tell."""

    max_batch_size: int | None = setting(
        None, "most rows a request or batch holds (the first dim); 0 = the model has no batch "
        "dim; unset = inferred: 8 when every first dim is dynamic, N when every one is a fixed "
        "N (a static export)", check=at_least(0))
    inputs: list[TensorConfig] = setting(factory=list, help="the inputs (without the batch dim), "
                                         "checked against the ONNX file; empty = read from it")
    outputs: list[TensorConfig] = setting(factory=list, help="the outputs (without the batch "
                                          "dim), checked likewise; empty = read from the file")
    batching: bool | BatchingConfig = setting(
        True, "dynamic batching, on whenever max_batch_size > 0: a batch is whatever queued "
        "while the instance was busy (no delay unless max_queue_delay_us says so); `off` "
        "disables it, a mapping sets its parameters")
    instances: int | Literal["auto"] = setting(
        "auto", "execution instances (worker threads; TensorRT contexts): auto = one per core "
        "on the CPU, two on a GPU (edged.inference.instances)", check=lambda v: None if v == "auto"
        else between(1, 64)(v))
    backend: Literal["auto", "tensorrt", "onnxruntime", "llamacpp", "tensorrt_llm"] = setting(
        "auto", "which backend runs the model: auto = the daemon's backends.default (itself "
        "auto: TensorRT where it can run, else ONNX Runtime); a model.gguf is always "
        "llamacpp's, a trtllm/ folder tensorrt_llm's (language models)")
    precision: Literal["auto", "fp32", "fp16", "int8"] = setting(
        "auto", "auto: INT8 where a gated variant exists and is faster (TensorRT: always); "
        "int8: the gated variant or no load")
    preprocess: PreprocessConfig | None = setting(
        None, "how an image or frame becomes the input tensor; null = read from the ONNX "
        "file where it can tell (Ultralytics metadata, a known head's exporter, TF's uint8 "
        "image input), else unknown: images and stream frames are then refused, naming these "
        "keys, and only tensors are served")
    postprocess: PostprocessConfig | None = setting(None, "result post-processing (streams)")
    version_policy: VersionPolicy = setting(factory=lambda: VersionPolicy(latest=1),
                                            help="which versions on disk are served")
    warmup: WarmupConfig = setting(factory=WarmupConfig, help="warm-up before ready")
    onnxruntime: OrtOverrides = setting(factory=OrtOverrides, help="ONNX Runtime overrides")
    tensorrt: TensorRTOverrides = setting(factory=TensorRTOverrides, help="TensorRT settings")
    quantization: QuantizationConfig = setting(factory=QuantizationConfig,
                                               help="INT8 variant and its accuracy gate")
    response_cache: bool = setting(False, "answer API requests the same version was already "
                                   "asked (same input bytes, dtypes, shapes and outputs) from "
                                   "the response cache (cache.responses_mb), as Triton does")
    llm: LanguageConfig = setting(factory=LanguageConfig,
                                  help="a language model's (model.gguf, trtllm/) context, "
                                  "sequences, threads, queue")
    deterministic: bool = setting(True, "the same inputs always give the same outputs; false "
                                  "(a model that samples) rules out the response cache")

    @property
    def batching_params(self) -> BatchingConfig | None:
        """The batcher's parameters, or None when dynamic batching is off."""
        if self.batching is False:
            return None
        return self.batching if isinstance(self.batching, BatchingConfig) else BatchingConfig()


def check_response_cache(parsed: Parsed[ModelConfig]) -> list[ConfigIssue]:
    """A cached answer is only right for a model whose outputs the inputs alone decide."""
    config = parsed.value
    if config.response_cache and not config.deterministic:
        return [parsed.issue("response_cache", "is true, but deterministic: false says the "
                             "same inputs may give other outputs, which a cached answer would "
                             "hide; drop one of the two")]
    return []


MODEL_CHECKS = (check_response_cache,)
