"""What model.yaml leaves unsaid about pre- and post-processing, filled in from the ONNX file
itself, once, when a version is read.

A stock export carries its own description: Ultralytics writes the class names, the input size
and the task into `metadata_props`, and its pre-processing is always the same letterbox. Where
model.yaml is silent (key by key: the parsed YAML's lines tell which keys it gave) that is the
first source of truth; a model.yaml that speaks always wins. A detector's head is chosen here
too (`edged.model.heads`), and every choice keeps a one-line reason for the model config API.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edged.core.errors import InvalidModel
from edged.model.boxsets import landmark_outputs, tf_od_outputs
from edged.model.config import ModelConfig, PostprocessConfig, PreprocessConfig
from edged.model.heads import Head, choose_head
from edged.model.metadata import ExportMetadata, read_metadata
from edged.model.paddleclas import PADDLECLAS_CLASSIFY, paddleclas_classifier
from edged.model.scrfd import scrfd_levels, yunet_levels
from edged.model.signature import Signature
from edged.model.tensor import TensorSpec
from edged.model.ultralytics import (
    CROP_KEYS,
    SQUASH_KEYS,
    ULTRALYTICS_CLASSIFY,
    ULTRALYTICS_DETECT,
    classify_crop,
    classify_reason,
)
from edged.tasks import BOXED_TASKS as BOXED
from edged.tasks.keypoints import point_names
from edged.tasks.recognise import Layout, recognise
from edged.tasks.recognise import layout as task_layout
from edged.tasks.text import charset

logger = logging.getLogger(__name__)

# What each exporter's own pre-processing is, for heads told without Ultralytics' metadata.
# YOLOX (ValTransform, legacy=False; ddddocr's preproc): resized into the top-left corner with
# the scaled size truncated (int(w * r)) and INTER_LINEAR, grey 114, BGR, 0..255.
# YOLO-NAS (super-gradients): longest side rescaled (sizes rounded, INTER_LINEAR), padded
# bottom-right with 114, RGB, 0..1.
# RF-DETR: resized square, RGB, 0..1 with ImageNet's mean and std. D-FINE: resized, RGB, 0..1.
FAMILY_PREPROCESS: dict[str, dict[str, Any]] = {
    "yolox": {"keep_ratio": True, "pad": "end", "pad_value": 114.0, "color": "bgr",
              "scale": 1.0, "mean": [0.0], "std": [1.0], "layout": "nchw",
              "interpolation": "linear", "rounding": "floor"},
    "yolonas": {"keep_ratio": True, "pad": "end", "pad_value": 114.0, "color": "rgb",
                "scale": 1 / 255, "mean": [0.0], "std": [1.0], "layout": "nchw",
                "interpolation": "linear", "rounding": "round"},
    "rfdetr": {"keep_ratio": False, "color": "rgb", "scale": 1 / 255,
               "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225], "layout": "nchw"},
    "dfine": {"keep_ratio": False, "color": "rgb", "scale": 1 / 255, "mean": [0.0],
              "std": [1.0], "layout": "nchw"},
    # InsightFace's SCRFD.detect: the image resized into the input's top-left corner (ratio
    # kept, int() sizes), zeros around; blobFromImage(1/128, mean 127.5, swapRB)
    "scrfd": {"keep_ratio": True, "pad": "end", "pad_value": 0.0, "color": "rgb",
              "scale": 1.0, "mean": [127.5, 127.5, 127.5], "std": [128.0, 128.0, 128.0],
              "layout": "nchw", "interpolation": "linear", "rounding": "floor"},
    # OpenCV's FaceDetectorYN: BGR pixels as they are (blobFromImage with no scaling), the
    # input padded with zeros at the bottom and right
    "yunet": {"keep_ratio": True, "pad": "end", "pad_value": 0.0, "color": "bgr",
              "scale": 1.0, "mean": [0.0], "std": [1.0], "layout": "nchw",
              "interpolation": "linear", "rounding": "floor"},
}
# An NHWC image input with 3 channels last (TF's image_tensor): the model scales and resizes
# what it is given itself; uint8 pixels go in as they are.
TF_IMAGE = {"layout": "nhwc", "color": "rgb", "scale": 1.0, "mean": [0.0], "std": [1.0],
            "keep_ratio": False}
LABELS_FILE = "labels.txt"  # beside the versions: class names where nothing else gives them
BOX_NAMES = ("box", "bbox", "loc", "dets")


@dataclass(frozen=True)
class Resolved:
    config: ModelConfig  # preprocess and postprocess filled in where model.yaml was silent
    head: Head | None  # for `postprocess.kind: detect`
    reasons: Mapping[str, str] = field(default_factory=dict)  # "preprocess", "postprocess"


def resolve_processing(config: ModelConfig, lines: Mapping[str, int], signature: Signature,
                       inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                       onnx_path: Path, labels_dir: Path) -> Resolved:
    """`config` as reconciled with the signature; `lines` the parsed model.yaml's key paths;
    `labels_dir` where a `postprocess.labels` file lives. Raises InvalidModel for a detector
    whose head cannot be told."""
    metadata = read_metadata(signature.metadata, onnx_path.name)
    reasons: dict[str, str] = {}
    said_pre = _said(lines, "preprocess")
    pre = _preprocess(config.preprocess, said_pre, metadata, inputs, outputs, reasons)
    pre = _shape_layout(pre, said_pre, inputs, reasons)
    said_post = _said(lines, "postprocess")
    batched = (config.max_batch_size or 0) > 0
    post = _postprocess(config.postprocess, said_post, metadata, outputs, labels_dir, reasons,
                        signature.marks, batched)
    if post is not None:
        pre = _origin_preprocess(pre, said_pre, metadata, inputs, outputs, post.kind, reasons)
    head = None
    if post is not None and post.kind in BOXED:
        try:
            # A labels file's line count is no class count: files often carry a background
            # line or a 91-line COCO list for 80 classes.
            counted = post if "labels" not in said_post or "names" in said_post else \
                dataclasses.replace(post, names=None)
            table, extra = outputs, 0
            if post.kind == "segment" or (post.kind == "pose" and len(outputs) == 1):
                shape = post.kpt_shape if post.kpt_shape is not None else metadata.kpt_shape
                parts = task_layout(post.kind, outputs, batched, proto=post.proto,
                                    kpt_shape=shape)
                table = tuple(o for o in outputs if o.name == parts.table)
                extra = parts.extra
                post = _task_parts(post, parts, metadata)
            head = choose_head(table, metadata, counted, said=said_post,
                               input_size=_input_size(pre, inputs),
                               producers=signature.producers, batched=batched,
                               marks=signature.marks, extra=extra)
            pre = _family_preprocess(head, pre, said_pre, metadata, reasons)
            if head.format in ("priorbox", "scrfd", "yunet") and head.landmarks is not None and (
                    "kind" not in said_post or post.kind == "pose"):
                post = _landmark_task(post, head, reasons)
        except InvalidModel as exc:
            why = reasons.get("postprocess", "model.yaml")
            if "kind" in said_post or metadata.task in BOXED:
                raise InvalidModel(f"{onnx_path}: {exc} (detect: {why})") from exc
            # Only guessed from the outputs' look: serve the raw outputs, as before.
            logger.warning("%s: %s; serving raw outputs", onnx_path, exc)
            post = dataclasses.replace(post, kind="raw")
            reasons["postprocess"] = f"raw: {why}, but {exc}"
            reasons["task"] = f"raw: {exc}"
    if post is not None and post.kind == "text":
        first = [o for o in outputs if post.output in (None, o.name)][:1]
        width = first[0].shape[-1] if first else -1
        charset(post.names, width, f"{onnx_path}: text")  # a character set that misfits: no load
    resolved = dataclasses.replace(config, preprocess=pre, postprocess=post)
    return Resolved(resolved, head, reasons)


def _task_parts(post: PostprocessConfig, parts: Layout, metadata: ExportMetadata
                ) -> PostprocessConfig:
    """The segment or pose task's parts written into its post-processing, so the model config
    API (and whoever rebuilds the post-processing from it: `edged infer`) sees them."""
    if parts.proto is not None:
        return dataclasses.replace(post, proto=parts.proto)
    if parts.kpt_shape is not None:
        named = post.keypoint_names or (list(metadata.kpt_names) if metadata.kpt_names
                                        else None)
        return dataclasses.replace(post, kpt_shape=list(parts.kpt_shape),
                                   keypoint_names=point_names(parts.kpt_shape[0], named))
    return post


def _landmark_task(post: PostprocessConfig, head: Head, reasons: dict[str, str]
                   ) -> PostprocessConfig:
    """A head over priors with landmarks (RetinaFace's) is a keypoints task: its boxes, each
    with its points (x, y: the head gives no per-point score)."""
    count = head.extra // 2
    if not count:  # the landmarks' width is dynamic in the file: told frame by frame
        reasons["task"] = f"kind pose: landmarks a box ({head.landmarks})"
        return dataclasses.replace(post, kind="pose")
    reasons["task"] = f"kind pose: {count} landmarks a box ({head.landmarks})"
    return dataclasses.replace(post, kind="pose", kpt_shape=[count, 2],
                               keypoint_names=point_names(count, post.keypoint_names))


def _said(lines: Mapping[str, int], section: str) -> frozenset[str]:
    """The keys of one model.yaml section that the file gave."""
    prefix = section + "."
    return frozenset(path[len(prefix):].split(".")[0].split("[")[0]
                     for path in lines if path.startswith(prefix))


def _given(said: frozenset[str]) -> str:
    return f"; model.yaml: {', '.join(sorted(said))}" if said else ""


# -- pre-processing ----------------------------------------------------------------------------

def _preprocess(cfg: PreprocessConfig | None, said: frozenset[str], metadata: ExportMetadata,
                inputs: tuple[TensorSpec, ...], outputs: tuple[TensorSpec, ...],
                reasons: dict[str, str]) -> PreprocessConfig | None:
    derived: dict[str, Any] = {}
    why: list[str] = []
    if inputs and _tf_image(inputs[0], outputs):
        derived.update(TF_IMAGE)
        why.append(f"{inputs[0].name} {list(inputs[0].shape)} {inputs[0].dtype}: an NHWC image "
                   f"the model scales and resizes itself (RGB, pixels as they are)")
    classify = metadata.ultralytics and metadata.task == "classify"
    if metadata.ultralytics:
        derived.update(ULTRALYTICS_CLASSIFY if classify else ULTRALYTICS_DETECT)
        if not classify:
            why.append("Ultralytics export (metadata): letterbox centred, pad 114, RGB, 1/255")
    if metadata.imgsz is not None and inputs:
        height, width = metadata.imgsz
        layout = cfg.layout if cfg is not None and "layout" in said else \
            derived.get("layout", layout_of(inputs[0]) or "nchw")
        own = _spatial(inputs[0], layout)
        if own is None or own == (width, height):
            derived["resize"] = [width, height]
            why.append(f"resize {width}x{height} from imgsz {list(metadata.imgsz)}")
        else:
            logger.warning("%s: metadata imgsz %s disagrees with input %s; the input's own "
                           "size is used", inputs[0].name, list(metadata.imgsz),
                           list(inputs[0].shape))
    if classify:
        why.insert(0, _ultralytics_classify(cfg, said, derived, inputs))
    chosen = {k: v for k, v in derived.items() if k not in said}
    if not chosen:
        if cfg is not None:
            reasons["preprocess"] = "model.yaml"
        return cfg
    reasons["preprocess"] = "; ".join(why) + _given(said)
    return dataclasses.replace(cfg or PreprocessConfig(), **chosen)


def _ultralytics_classify(cfg: PreprocessConfig | None, said: frozenset[str],
                          derived: dict[str, Any], inputs: tuple[TensorSpec, ...]) -> str:
    """An Ultralytics classifier's crop keys added to `derived` (`edged.model.ultralytics`),
    unless model.yaml states its own resize (`resize`, `keep_ratio` or `crop: none`): a stated
    resize is not mixed with a crop. Returns the reason."""
    resize = derived.get("resize")
    size = (resize[0], resize[1]) if resize is not None else \
        _spatial(inputs[0], "nchw") if inputs else None
    stated = [k for k in SQUASH_KEYS if k in said]
    if "crop" in said and cfg is not None and cfg.crop == "none":
        stated.append("crop: none")
    crop = classify_crop(size)
    if stated:
        for key in CROP_KEYS:
            derived.pop(key, None)
    else:
        derived.update(crop)
    return classify_reason(size, bool(crop) and not stated, ", ".join(stated) or None)


def _origin_preprocess(pre: PreprocessConfig | None, said: frozenset[str],
                       metadata: ExportMetadata, inputs: tuple[TensorSpec, ...],
                       outputs: tuple[TensorSpec, ...], kind: str, reasons: dict[str, str]
                       ) -> PreprocessConfig | None:
    """A classifier's own pre-processing where its file says whose it is (PaddleClas' in
    RapidAI's form: `edged.model.paddleclas`); model.yaml's keys still win."""
    why = paddleclas_classifier(metadata, kind, inputs, outputs)
    if why is None:
        return pre
    chosen = {k: v for k, v in PADDLECLAS_CLASSIFY.items() if k not in said}
    if "resize" in said or "keep_ratio" in said:  # a stated resize is not mixed with a crop
        return pre
    reasons["preprocess"] = "; ".join(filter(None, [
        reasons.get("preprocess", "") if reasons.get("preprocess") != "model.yaml" else "",
        why + _given(said)]))
    return dataclasses.replace(pre or PreprocessConfig(), **chosen)


def layout_of(spec: TensorSpec) -> Literal["nchw", "nhwc"] | None:
    """What an image input's shape says of its layout: channels last when the last dim is 1,
    3 or 4 and the one before the spatial dims is not ([N, 224, 224, 3]); channels first when
    the dim after the batch is ([N, 3, H, W]); None when the shape tells neither."""
    if len(spec.shape) < 3:
        return None
    first, last = spec.shape[-3], spec.shape[-1]
    if last in (1, 3, 4) and first not in (1, 3, 4):
        return "nhwc"
    if first in (1, 3, 4):
        return "nchw"
    return None


def _shape_layout(pre: PreprocessConfig | None, said: frozenset[str],
                  inputs: tuple[TensorSpec, ...], reasons: dict[str, str]
                  ) -> PreprocessConfig | None:
    """A pre-processing that does not say its layout gets the one the input's shape tells."""
    if pre is None or "layout" in said or not inputs:
        return pre
    told = layout_of(inputs[0])
    if told is None or told == pre.layout:
        return pre
    reasons["preprocess"] = "; ".join(filter(None, [
        reasons.get("preprocess"), f"layout {told} from the input's shape "
                                   f"{list(inputs[0].shape)}"]))
    return dataclasses.replace(pre, layout=told)


def _tf_image(spec: TensorSpec, outputs: tuple[TensorSpec, ...]) -> bool:
    """A TF-style image input: [N, H, W, 3], uint8 (pixels), or float beside the TF Object
    Detection API's outputs (which take 0..255 floats as its uint8 input)."""
    shape = spec.shape
    if len(shape) != 4 or shape[3] != 3 or shape[1] == 3:
        return False
    return spec.dtype == np.uint8 or (spec.dtype.kind == "f" and
                                      tf_od_outputs(outputs) is not None)


def _family_preprocess(head: Head, pre: PreprocessConfig | None, said: frozenset[str],
                       metadata: ExportMetadata, reasons: dict[str, str]
                       ) -> PreprocessConfig | None:
    """The exporter's own pre-processing for a head told from the graph or outputs, where
    neither model.yaml nor Ultralytics' metadata said it."""
    family: str = head.format
    if head.format == "detr" and head.activation == "sigmoid" and (
            head.boxes or "").lower().startswith("dets"):
        family = "rfdetr"
    elif head.format == "detr" and head.classes is not None:  # labels + boxes + scores
        family = "dfine"
    derived = FAMILY_PREPROCESS.get(family)
    if derived is None or metadata.ultralytics:
        return pre
    chosen = {k: v for k, v in derived.items() if k not in said}
    if not chosen:
        return pre
    reasons["preprocess"] = "; ".join(filter(None, [
        reasons.get("preprocess", "") if reasons.get("preprocess") != "model.yaml" else "",
        f"{family}'s own pre-processing ({', '.join(sorted(chosen))})" + _given(said)]))
    return dataclasses.replace(pre or PreprocessConfig(), **chosen)


def _spatial(spec: TensorSpec, layout: str) -> tuple[int, int] | None:
    """The input's own (width, height) when both are fixed."""
    if len(spec.shape) < 3:
        return None
    height, width = spec.shape[-2:] if layout == "nchw" else spec.shape[-3:-1]
    return (width, height) if height > 0 and width > 0 else None


def _input_size(pre: PreprocessConfig | None, inputs: tuple[TensorSpec, ...]
                ) -> tuple[int, int] | None:
    if pre is not None and pre.resize is not None:
        return pre.resize[0], pre.resize[1]
    return _spatial(inputs[0], pre.layout if pre else "nchw") if inputs else None


# -- post-processing ---------------------------------------------------------------------------

def _postprocess(cfg: PostprocessConfig | None, said: frozenset[str], metadata: ExportMetadata,
                 outputs: tuple[TensorSpec, ...], labels_dir: Path, reasons: dict[str, str],
                 marks: frozenset[str] = frozenset(), batched: bool = False
                 ) -> PostprocessConfig | None:
    derived: dict[str, Any] = {}
    why: list[str] = []
    labels_file = labels_dir / LABELS_FILE
    kind: str = cfg.kind if cfg is not None else "raw"
    if "kind" not in said:
        found = recognise(metadata, outputs, batched=batched,
                          file_names=_read_labels(labels_file) if labels_file.is_file()
                          else None, detector=_detector(metadata, outputs, marks, batched))
        reasons["task"] = found.why
        if found.kind is not None:
            kind = derived["kind"] = found.kind
            why.append(found.why)
    else:
        reasons["task"] = f"kind {kind} from model.yaml"
    meta_names, meta_key = (metadata.names, "names") if metadata.names is not None else \
        (metadata.labels, metadata.labels_key)
    if metadata.character is not None and (kind == "text" or (kind == "classify"
                                                             and meta_names is None)):
        meta_names, meta_key = metadata.character, "character"
    if "names" not in said and "labels" not in said and meta_names is None and (
            labels_file).is_file():
        derived["labels"] = LABELS_FILE
        names = _read_labels(labels_dir / LABELS_FILE)
        if names is not None:
            derived["names"] = names
            why.append(f"{len(names)} class names from {LABELS_FILE}")
    elif "names" not in said:
        if "labels" in said and cfg is not None and cfg.labels:
            names = _read_labels(labels_dir / cfg.labels)
            if names is not None:
                derived["names"] = names
        elif meta_names is not None:
            derived["names"] = list(meta_names)
            what = "characters" if kind == "text" else "class names"
            why.append(f"{len(meta_names)} {what} from the metadata's {meta_key}")
    if not derived:
        if cfg is not None:
            reasons["postprocess"] = "model.yaml"
        return cfg
    reasons["postprocess"] = "; ".join(why or ["model.yaml"]) + (_given(said) if why else "")
    return dataclasses.replace(cfg or PostprocessConfig(), **derived)


def _detector(metadata: ExportMetadata, outputs: tuple[TensorSpec, ...],
              marks: frozenset[str], batched: bool) -> str | None:
    """Why the outputs look like a detector's (the families `edged.model.heads` reads), or
    None."""
    one = outputs[0] if len(outputs) == 1 else None
    rank = len(one.shape) - (1 if one.shape and (batched or one.shape[0] == 1) else 0) \
        if one is not None else 0
    if metadata.ultralytics and metadata.names and one is not None and rank == 2:
        return "kind detect: a YOLO export (metadata stride and names)"
    if "yolox" in marks and one is not None:
        return "kind detect: a YOLOX head (its graph: Conv + Sigmoid + Sigmoid per level)"
    if tf_od_outputs(outputs) is not None:
        return "kind detect: the TF Object Detection API's detection_* outputs"
    if landmark_outputs(outputs, batched) is not None:
        return "kind detect: a RetinaFace-style head (boxes, scores and landmarks over priors)"
    if scrfd_levels(outputs, batched) is not None:
        return "kind detect: an SCRFD head (scores, boxes and landmarks per stride)"
    if yunet_levels(outputs, batched) is not None:
        return "kind detect: a YuNet head (cls, obj, bbox and kps per stride)"
    if len(outputs) > 1 and any(o.shape[-1:] == (4,) and any(
            k in o.name.lower() for k in BOX_NAMES) for o in outputs):
        return "kind detect: outputs of boxes [N, 4] beside other per-box outputs"
    return None


def _read_labels(path: Path) -> list[str] | None:
    """The labels file as a list for the model config API; None when it cannot be read (the
    post-processing step reports that)."""
    try:
        return [line.strip() for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError):
        return None
