"""Samples for calibration and for the gate: images passed through the model's own
pre-processing (`model.yaml` `preprocess`), `.npy`/`.npz` tensors, or frames read from a
stream. Images in a folder named after a class (its index, or a name in the labels file) carry
that class as their label, so a held-out set can measure accuracy as well as agreement."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edged.core.errors import InvalidInput
from edged.model.repository import ModelVersion
from edged.model.tensor import TensorSpec

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}
TENSOR_SUFFIXES = {".npy", ".npz"}


@dataclass(frozen=True)
class Sample:
    inputs: dict[str, np.ndarray]  # one sample per input, without the batch dim
    label: int | None = None
    source: str = ""

    def batch(self, model: ModelVersion) -> dict[str, np.ndarray]:
        """The sample as a batch of one when the model has a batch dim; repeated to fill a
        fixed batch of N (copies of the sample, unlike zero rows, leave the calibration's
        activation statistics as they are; row 0 is the sample's answer)."""
        if model.max_batch_size > 0:
            rows = model.fixed_batch or 1
            return {k: np.repeat(v[None], rows, axis=0) for k, v in self.inputs.items()}
        return dict(self.inputs)


def list_files(paths: Iterable[Path]) -> list[Path]:
    """Image and tensor files among `paths`, folders walked recursively, in a stable order."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(sorted(p for p in path.rglob("*") if p.is_file() and _usable(p)))
        elif path.is_file():
            if not _usable(path):
                raise InvalidInput(f"{path}: not an image or a .npy/.npz file")
            found.append(path)
        else:
            raise InvalidInput(f"{path}: no such file or folder")
    return found


def _usable(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES | TENSOR_SUFFIXES


def load_samples(model: ModelVersion, paths: Iterable[Path],
                 labels: Sequence[str] = ()) -> list[Sample]:
    """Every sample in the files under `paths`. A file's parent folder, when it is a class
    index or one of `labels`, is the label of its samples."""
    roots = list(paths)
    samples: list[Sample] = []
    for file in list_files(roots):
        label = _label_of(file, roots, labels)
        if file.suffix.lower() in IMAGE_SUFFIXES:
            samples.append(Sample(image_inputs(model, _read_image(file)), label, str(file)))
        else:
            samples.extend(Sample(inputs, label, str(file)) for inputs in _tensor_samples(
                model, file))
    return samples


def _label_of(file: Path, roots: Sequence[Path], labels: Sequence[str]) -> int | None:
    if any(file == root for root in roots):
        return None  # a file named on its own: no folder to read a label from
    name = file.parent.name
    if name.isdigit():
        return int(name)
    return labels.index(name) if name in labels else None


def _read_image(path: Path) -> np.ndarray:
    import cv2

    frame = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if frame is None:
        raise InvalidInput(f"{path}: not an image OpenCV can read")
    return frame


def image_inputs(model: ModelVersion, frame: np.ndarray) -> dict[str, np.ndarray]:
    """A BGR frame as the model's one input, pre-processed as its `model.yaml` says."""
    from edged.processing.pre import image_preprocess, preprocess

    if len(model.inputs) != 1:
        names = ", ".join(i.name for i in model.inputs)
        raise InvalidInput(f"{model.label} has inputs {names}: images need a one-input model; "
                           "give .npz files with one array per input")
    spec = model.inputs[0]
    cfg = image_preprocess(model.config.preprocess, model.label, spec, model.max_batch_size > 0)
    tensor, _geometry = preprocess(frame, cfg, spec)  # always a batch of one
    return {spec.name: tensor[0]}


def _tensor_samples(model: ModelVersion, path: Path) -> list[dict[str, np.ndarray]]:
    """A .npy (one input) or .npz (one array per input name) holding one sample or a stack."""
    try:
        if path.suffix.lower() == ".npz":
            with np.load(path, allow_pickle=False) as archive:
                arrays = {k: archive[k] for k in archive.files}
        else:
            arrays = {"": np.load(path, allow_pickle=False)}
    except (OSError, ValueError) as exc:
        raise InvalidInput(f"{path}: cannot read: {exc}") from exc
    if "" in arrays:
        if len(model.inputs) != 1:
            raise InvalidInput(f"{path}: {model.label} has several inputs; use .npz files")
        arrays = {model.inputs[0].name: arrays[""]}
    missing = [s.name for s in model.inputs if s.name not in arrays]
    if missing:
        raise InvalidInput(f"{path}: no array for input(s) {', '.join(missing)}")
    counts = {_count(path, spec, arrays[spec.name], model.max_batch_size > 0)
              for spec in model.inputs}
    if len(counts) != 1:
        raise InvalidInput(f"{path}: the inputs hold different numbers of samples")
    count = counts.pop()
    if count is None:
        return [{s.name: arrays[s.name].astype(s.dtype, copy=False) for s in model.inputs}]
    return [{s.name: arrays[s.name][i].astype(s.dtype, copy=False) for s in model.inputs}
            for i in range(count)]


def _count(path: Path, spec: TensorSpec, array: np.ndarray, batched: bool) -> int | None:
    """None for one sample, else how many are stacked along the first axis."""
    sample_rank = len(spec.shape) - (1 if batched else 0)
    if array.ndim == sample_rank:
        return None
    if array.ndim == sample_rank + 1:
        return int(array.shape[0])
    raise InvalidInput(f"{path}: {spec.name} has rank {array.ndim}; expected {sample_rank} "
                       f"(one sample) or {sample_rank + 1} (a stack)")


def stream_samples(model: ModelVersion, uri: str, frames: int, step: int = 1,
                   timeout_s: float = 10.0) -> list[Sample]:
    """`frames` frames from a stream (file://, rtsp://, http(s)://, v4l2://, ...), every
    `step`-th one, pre-processed as the model says. Files are read as fast as they decode."""
    import cv2

    from edged.sources import FrameQueue, SourceError
    from edged.sources.camera import CameraSource

    try:
        target, api = CameraSource("calibration", uri, FrameQueue(1, "drop_oldest")).target()
    except SourceError as exc:
        raise InvalidInput(f"--calibration-stream: {exc}") from exc
    timeout_ms = int(timeout_s * 1000)
    capture = cv2.VideoCapture(target, api, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout_ms,
                                             cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms])
    samples: list[Sample] = []
    try:
        if not capture.isOpened():
            raise InvalidInput(f"--calibration-stream: {uri}: cannot open")
        index = 0
        while len(samples) < frames:
            ok, frame = capture.read()
            if not ok:
                break
            if index % step == 0:
                samples.append(Sample(image_inputs(model, frame), None, f"{uri}#{index}"))
            index += 1
    finally:
        capture.release()
    if len(samples) < frames:
        logger.warning("%s ended after %d frames (%d asked)", uri, len(samples), frames)
    if not samples:
        raise InvalidInput(f"--calibration-stream: {uri}: no frames read")
    return samples


def split(samples: list[Sample], fraction: float,
          rng: np.random.Generator) -> tuple[list[Sample], list[Sample]]:
    """(calibration, held-out): a seeded shuffle, then `fraction` of it held out (at least
    one sample each)."""
    if len(samples) < 2:
        raise InvalidInput(f"need at least 2 samples to hold some out, got {len(samples)}")
    order = rng.permutation(len(samples))
    held = min(len(samples) - 1, max(1, round(len(samples) * fraction)))
    return [samples[i] for i in order[held:]], [samples[i] for i in order[:held]]


def subset(samples: list[Sample], limit: int, rng: np.random.Generator) -> list[Sample]:
    """At most `limit` samples, drawn without replacement, in their original order."""
    if len(samples) <= limit:
        return samples
    keep = np.sort(rng.choice(len(samples), size=limit, replace=False))
    return [samples[i] for i in keep]
