"""Cascades: a secondary model on crops of a stream's detections (DeepStream's secondary GIE,
Frigate's sub-labels). For each frame, the best-scoring detections of the chosen labels are
cropped with a margin, pre-processed into the cascade's own pooled batch and run through the
scheduler as one request (or as few as the model's batch limit allows); a classify model's
top label lands on each detection as `sub_label` (with `sub_label_score`), a text
recogniser's reading as `text` (with `text_score`), any other model's results under
`attributes.<model>`. A detection with four corners (a plate detector's keypoints) is warped
upright onto a rectangle instead of cropped by its box (`crop: auto`, `edged/tasks/warp.py`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

import numpy as np

from edged.core.errors import EdgedError, InvalidInput, InvalidModel
from edged.inference.scheduler import Outputs, Scheduler
from edged.model.config import PostprocessConfig, PreprocessConfig
from edged.model.repository import ModelVersion
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor, published
from edged.processing.pre import image_preprocess, mismatch, preprocess, tensor_shape
from edged.streams.asking import answer
from edged.streams.config import SecondaryConfig
from edged.tasks.warp import quad_of, warp_quad

logger = logging.getLogger(__name__)

class Cascade:
    def __init__(self, cfg: SecondaryConfig, scheduler: Scheduler, *,
                 priority: int | None = None, timeout_s: float = 10.0) -> None:
        """Check that the model can take crops (raises EdgedError naming what is wrong)."""
        self.cfg = cfg
        self.scheduler = scheduler
        self.priority = priority
        self.timeout_s = timeout_s
        self.labels = frozenset(cfg.labels)
        self._batch: np.ndarray | None = None  # crops of one frame, reused frame after frame
        self._post: tuple[ModelVersion, Postprocessor] | None = None
        self.check()

    def check(self) -> None:
        """The model can take crops (raises EdgedError naming what is wrong)."""
        check_model(self.cfg, self.scheduler.model(self.cfg.model))

    def select(self, detections: Detections) -> list[int]:
        """The detections to crop (their indices): the chosen labels at or above min_score,
        best first, at most max_crops."""
        chosen = [i for i, label in enumerate(detections.labels)
                  if (not self.labels or label in self.labels)
                  and detections.scores[i] >= self.cfg.min_score]
        chosen.sort(key=lambda i: detections.scores[i], reverse=True)
        return chosen[:self.cfg.max_crops]

    def run(self, frame: np.ndarray, detections: Detections) -> int:
        """Crop, run and annotate the chosen detections in place; returns how many ran.
        Raises EdgedError when the model fails or times out (the detections stay as they
        were)."""
        chosen = self.select(detections)
        if not chosen:
            return 0
        model = self.scheduler.model(self.cfg.model)  # the version serving now
        spec = model.inputs[0]
        pre = image_preprocess(model.config.preprocess, model.label, spec,
                               model.max_batch_size > 0)
        post = self._postprocessor(model)
        if text_lines(model, pre):
            pieces = [self.cut(frame, detections, index) for index in chosen]
            for index, piece, outputs in zip(chosen, pieces, self._lines(model, pre, pieces),
                                             strict=True):
                annotate(detections, index, self.cfg, model.name, post(outputs, None), piece)
            return len(chosen)
        batch = self._rows(model, frame)
        pieces = []
        for row, index in enumerate(chosen):
            pieces.append(self.cut(frame, detections, index))
            preprocess(pieces[-1], pre, spec, batch[row:row + 1])
        outputs = self._infer(model, batch[:len(chosen)])
        for row, index in enumerate(chosen):
            results = post({k: v[row:row + 1] for k, v in outputs.items()}, None)
            annotate(detections, index, self.cfg, model.name, results, pieces[row])
        return len(chosen)

    def _lines(self, model: ModelVersion, pre: PreprocessConfig,
               pieces: list[np.ndarray]) -> list[Outputs]:
        """A recogniser of text lines of any width reads each crop at its own width, as
        PaddleOCR reads one line (`resize_norm_img`: the height the model's, the width
        int(height * w / h), no padding), up to `resize`'s width (then squeezed): padding a
        line out to the widest changes what a CRNN reads (its recurrent layers see the
        padding). One request a crop; crops of one width batch together in the scheduler."""
        assert pre.resize is not None  # (text_lines: resize is set)
        most, height = pre.resize
        name = model.inputs[0].name
        futures = []
        for piece in pieces:
            h, w = piece.shape[:2]
            width = max(1, min(most, int(height * (w / float(h)))))
            line = dataclasses.replace(pre, resize=[width, height], keep_ratio=False)
            tensor, _ = preprocess(piece, line, model.inputs[0])
            futures.append(self.scheduler.submit(
                self.cfg.model, {name: tensor if model.max_batch_size else tensor[0]},
                version=model.version, priority=self.priority))
        return [answer(future, self.timeout_s, f"secondary model {self.cfg.model}")
                for future in futures]

    def cut(self, frame: np.ndarray, detections: Detections, index: int) -> np.ndarray:
        """What the model reads of detection `index`: its four corners warped upright (`crop:
        corners`, or `auto` where it has four keypoints enclosing an area), else its box grown
        by the margin."""
        points = detections.keypoints[index]
        if self.cfg.crop != "box" and points is not None:
            quad = quad_of(points)
            if quad is not None:
                try:
                    return warp_quad(frame, quad)
                except InvalidInput:  # corners in one spot: auto reads the box instead
                    if self.cfg.crop == "corners":
                        raise
        if self.cfg.crop == "corners":
            raise InvalidInput(f"secondary model {self.cfg.model}: crop: corners, and the "
                               f"detection has no four corners (its keypoints: "
                               f"{sorted(points or {})})")
        return crop(frame, detections.boxes[index].tolist(), self.cfg.crop_margin)

    def _rows(self, model: ModelVersion, frame: np.ndarray) -> np.ndarray:
        """The pooled batch: room for max_crops crops at the model's input size."""
        spec = model.inputs[0]
        pre = image_preprocess(model.config.preprocess, model.label, spec,
                               model.max_batch_size > 0)
        # The size is fixed (check_model), so any crop gives every crop's shape.
        shape = (self.cfg.max_crops, *tensor_shape(pre, spec, frame)[1:])
        if self._batch is None or self._batch.shape != shape or self._batch.dtype != spec.dtype:
            self._batch = np.empty(shape, spec.dtype)
        return self._batch

    def _infer(self, model: ModelVersion, batch: np.ndarray) -> Outputs:
        """One request of every crop where the model takes a batch that large, else requests
        of as many rows as it takes (one by one for a model without a batch dim)."""
        name = model.inputs[0].name
        step = model.max_batch_size or 1
        futures: list[Future[Outputs]] = []
        for start in range(0, len(batch), step):
            part = batch[start:start + step] if model.max_batch_size else batch[start]
            futures.append(self.scheduler.submit(self.cfg.model, {name: part},
                                                 version=model.version,
                                                 priority=self.priority))
        parts = [answer(future, self.timeout_s, f"secondary model {self.cfg.model}")
                 for future in futures]
        if not model.max_batch_size:
            return {k: np.stack([p[k] for p in parts]) for k in parts[0]}
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def _postprocessor(self, model: ModelVersion) -> Postprocessor:
        if self._post is None or self._post[0] is not model:
            self._post = (model, Postprocessor(model.config.postprocess, model.dir.parent))
        return self._post[1]


def text_lines(model: ModelVersion, pre: PreprocessConfig) -> bool:
    """A text recogniser whose input width is dynamic, its lines letterboxed to the right
    (PaddleOCR's text line): read line by line at each line's own width."""
    post = model.config.postprocess
    spec = model.inputs[0]
    return (post is not None and post.kind == "text" and pre.layout == "nchw"
            and len(spec.shape) == 4 and spec.shape[-1] <= 0 and pre.keep_ratio
            and pre.pad == "end" and pre.resize is not None)


def check_model(cfg: SecondaryConfig, model: ModelVersion) -> None:
    """A secondary model takes one image input of a fixed size (crops are stacked into one
    batch), and `as: sub_label` needs a classify model."""
    if len(model.inputs) != 1:
        raise InvalidModel(f"secondary model {model.label} has {len(model.inputs)} inputs; a "
                           "cascade feeds one image input")
    pre = model.config.preprocess
    spec = model.inputs[0]
    layout = pre.layout if pre is not None else "nchw"
    dims = spec.shape[-2:] if layout == "nchw" else spec.shape[-3:-1]
    if (pre is None or pre.resize is None) and min(dims, default=-1) <= 0:
        raise InvalidModel(f"secondary model {model.label} has a dynamic input size "
                           f"{list(spec.shape)}: set preprocess.resize in its model.yaml")
    post = model.config.postprocess or PostprocessConfig()
    if cfg.as_ == "sub_label" and post.kind != "classify":
        raise InvalidModel(f"secondary model {model.label} is not a classify model "
                           f"(postprocess.kind: {post.kind}): use `as: attributes`, or give it "
                           "postprocess: {kind: classify}")
    if cfg.as_ == "text" and post.kind != "text":
        raise InvalidModel(f"secondary model {model.label} is not a text recogniser "
                           f"(postprocess.kind: {post.kind}): use `as: attributes`, or give it "
                           "postprocess: {kind: text} and its character set")
    if cfg.as_ == "identity" and post.kind != "embed":
        raise InvalidModel(f"secondary model {model.label} is not an embedder "
                           f"(postprocess.kind: {post.kind}): `as: identity` needs one output "
                           "[N, D] of embeddings")
    if pre is None:
        raise InvalidModel(f"secondary model {model.label} has no known pre-processing for its "
                           "crops: set `preprocess:` in its model.yaml")
    why = mismatch(pre, spec, model.max_batch_size > 0)
    if why is not None:
        raise InvalidModel(f"secondary model {model.label}: {why}")


def crop(frame: np.ndarray, box: list[float], margin: float) -> np.ndarray:
    """The frame pixels inside `box` (x1, y1, x2, y2) grown by `margin` of its size on every
    side, clipped to the frame; at least one pixel. A view, not a copy."""
    left, top, right, bottom = crop_bounds(frame.shape[:2], box, margin)
    return frame[top:bottom, left:right]


def crop_bounds(size: tuple[int, ...], box: list[float], margin: float
                ) -> tuple[int, int, int, int]:
    """`crop`'s window (left, top, right, bottom; right and bottom exclusive) in a frame of
    `size` (height, width)."""
    height, width = size[0], size[1]
    x1, y1, x2, y2 = box
    grow_x, grow_y = (x2 - x1) * margin, (y2 - y1) * margin
    left = min(max(int(np.floor(x1 - grow_x)), 0), width - 1)
    top = min(max(int(np.floor(y1 - grow_y)), 0), height - 1)
    right = max(min(int(np.ceil(x2 + grow_x)), width), left + 1)
    bottom = max(min(int(np.ceil(y2 + grow_y)), height), top + 1)
    return left, top, right, bottom


def annotate(detections: Detections, index: int, cfg: SecondaryConfig, model: str,
             results: Mapping[str, Any], piece: np.ndarray | None = None) -> None:
    """A cascade's results on detection `index`; a text reading keeps the `piece` it read
    (a plate's own snapshot)."""
    if cfg.as_ == "sub_label":
        best = results["classes"][0]
        detections.set_sub_label(index, best["label"], round(float(best["score"]), 5))
    elif cfg.as_ == "text":
        read = results["text"]
        detections.set_text(index, read["text"], read["score"], piece)
    else:
        detections.add_attributes(index, model, published(results))


def run_all(cascades: list[Cascade], frame: np.ndarray, results: Mapping[str, Any]) -> None:
    """Every cascade over one frame's detections. Raises the first cascade's EdgedError after
    the others have run (a detection keeps what the cascades that worked gave it)."""
    detections = results.get("detections")
    if not isinstance(detections, Detections) or not detections:
        return
    failure: EdgedError | None = None
    for cascade in cascades:
        try:
            cascade.run(frame, detections)
        except EdgedError as exc:
            failure = failure or exc
    if failure is not None:
        raise failure
