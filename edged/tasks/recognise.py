"""Which task a model does, told from its outputs and its ONNX metadata where model.yaml does
not say (`postprocess.kind`): Ultralytics' `task` (detect, classify, segment, pose; obb is not
decoded), classifiers of any origin ([N, C] with C class names from the metadata's `names`,
`labels`, `classes` or `character` (PaddleClas' exports), or the labels file), CTC text
recognisers ([N, T, C] with a character set from the metadata's `character`), semantic
segmentation ([N, C, H, W] class maps with C names), and the detector families
`edged.model.heads` reads. An output that fits none is served raw with the reason; one that
fits two is refused at load, naming the keys that settle it. Every answer keeps a one-line
reason for the model config API.

The room sits below `model/` (whose resolution calls it when a version is read): it reads
tensor specs and the metadata through their fields (the protocols below), and takes the
detector families' verdict from `edged.model` as a reason string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from edged.core.errors import InvalidModel
from edged.tasks.embed import MIN_DIM

MIN_MAP = 8  # a class map is at least this many cells a side (a [N, C, 2, 2] is no map)
CTC_BLANKS = 1  # PaddleOCR's CTCLabelDecode: "blank" is class 0, before the character set


class Spec(Protocol):
    """A tensor spec (`edged.model.tensor.TensorSpec`)."""

    @property
    def name(self) -> str: ...
    @property
    def shape(self) -> tuple[int, ...]: ...


class Metadata(Protocol):
    """What the ONNX file says (`edged.model.metadata.ExportMetadata`)."""

    @property
    def task(self) -> str | None: ...
    @property
    def names(self) -> tuple[str, ...] | None: ...
    @property
    def labels(self) -> tuple[str, ...] | None: ...
    @property
    def labels_key(self) -> str | None: ...
    @property
    def character(self) -> tuple[str, ...] | None: ...
    @property
    def kpt_shape(self) -> tuple[int, int] | None: ...


@dataclass(frozen=True)
class Recognised:
    kind: str | None  # None: raw
    why: str


@dataclass(frozen=True)
class Layout:
    """Where a segment or pose task's parts are: the detection table, the columns each
    candidate has after its class scores, and (segment) the prototypes output."""

    table: str  # its output's name
    extra: int
    proto: str | None = None
    kpt_shape: tuple[int, int] | None = None


def recognise(metadata: Metadata, outputs: Sequence[Spec], *, batched: bool = False,
              file_names: Sequence[str] | None = None,
              detector: str | None = None) -> Recognised:
    """The task the file says or its outputs show; `file_names` are the labels file's,
    `detector` why the outputs look like a detector's (None: they do not)."""
    task = metadata.task
    if task in ("detect", "classify", "segment", "pose"):
        return Recognised(task, f"kind {task} from metadata task: {task}")
    if task == "obb":
        return Recognised(None, "raw: metadata task obb (oriented boxes) is not decoded by "
                                "edged")
    fits = _fits(metadata, outputs, batched, file_names)
    if detector is not None:
        fits.append(Recognised("detect", detector))
    elif not fits:
        fits += _embedder(metadata, outputs, batched, file_names)
    if len(fits) == 1:
        return fits[0]
    if fits:
        listed = "; ".join(f"{f.kind} ({f.why})" for f in fits)
        raise InvalidModel(f"postprocess: the outputs {_shapes(outputs)} fit more than one "
                           f"task: {listed}; set postprocess.kind in model.yaml")
    return Recognised(None, f"raw: no task told: no metadata task, and the outputs "
                            f"{_shapes(outputs)} are no classifier's [N, C] with C class "
                            f"names, no text recogniser's [N, T, C] with a character set, "
                            f"and no detector's")


def _fits(metadata: Metadata, outputs: Sequence[Spec], batched: bool,
          file_names: Sequence[str] | None) -> list[Recognised]:
    fits: list[Recognised] = []
    one = outputs[0] if len(outputs) == 1 else None
    dims = _dims(one, batched) if one is not None else ()
    if one is not None and len(dims) == 1:
        for key, names in (("names", metadata.names),
                           (metadata.labels_key or "labels", metadata.labels),
                           ("character", metadata.character),
                           ("labels file", file_names)):
            if names is not None and len(names) == dims[0]:
                source = f"the labels file's {len(names)} lines" if key == "labels file" \
                    else f"metadata {key}: {len(names)} names"
                fits.append(Recognised("classify", f"kind classify: {one.name} "
                                                   f"{list(one.shape)} is [N, C] with {source}"))
                break
    if one is not None and len(dims) == 2 and metadata.character is not None:
        blanks = dims[1] - len(metadata.character)
        if blanks in (CTC_BLANKS, CTC_BLANKS + 1):
            space = " and a space" if blanks == CTC_BLANKS + 1 else ""
            fits.append(Recognised("text", f"kind text: {one.name} {list(one.shape)} is CTC "
                                           f"[N, T, C] over metadata character "
                                           f"({len(metadata.character)} characters, the "
                                           f"blank{space})"))
    if one is not None and len(dims) == 3 and dims[0] >= 2 and min(dims[1:]) >= MIN_MAP:
        for key, names in (("names", metadata.names),
                           (metadata.labels_key or "labels", metadata.labels),
                           ("labels file", file_names)):
            if names is not None and len(names) == dims[0]:
                source = f"the labels file's {len(names)} lines" if key == "labels file" \
                    else f"metadata {key}: {len(names)} names"
                fits.append(Recognised("semantic", f"kind semantic: {one.name} "
                                                   f"{list(one.shape)} is a class map "
                                                   f"[N, C, H, W] with {source}"))
                break
    return fits


def _embedder(metadata: Metadata, outputs: Sequence[Spec], batched: bool,
              file_names: Sequence[str] | None) -> list[Recognised]:
    """One output [N, D] (D >= MIN_DIM) for which nothing gives D names: an embedder."""
    one = outputs[0] if len(outputs) == 1 else None
    dims = _dims(one, batched) if one is not None else ()
    if one is None or len(dims) != 1 or dims[0] < MIN_DIM:
        return []
    named = [n for n in (metadata.names, metadata.labels, metadata.character, file_names)
             if n is not None and len(n) == dims[0]]
    if named:
        return []
    return [Recognised("embed", f"kind embed: {one.name} {list(one.shape)} is [N, D] "
                                f"with D = {dims[0]} and no class names: embeddings")]


def layout(kind: str, outputs: Sequence[Spec], batched: bool, *, proto: str | None = None,
           kpt_shape: Sequence[int] | None = None) -> Layout:
    """A segment or pose task's parts, or InvalidModel naming what disagrees: a segment task
    needs one detection table and one prototypes output [M, H, W] (`proto` names it, else the
    one 3-d output: M coefficients per candidate); a pose task one table and a `kpt_shape`
    (model.yaml's, else the metadata's)."""
    if kind == "segment":
        protos = [o for o in outputs if len(_dims(o, batched)) == 3]
        if proto is not None:
            protos = [o for o in outputs if o.name == proto]
            if not protos:
                raise InvalidModel(f"segment: postprocess.proto {proto!r} is not an output "
                                   f"({', '.join(o.name for o in outputs)})")
        tables = [o for o in outputs if len(_dims(o, batched)) == 2 and o not in protos]
        if len(protos) != 1 or len(tables) != 1:
            raise InvalidModel(f"segment: expected a detection table [4+C+M, N] and mask "
                               f"prototypes [M, H, W], got {_shapes(outputs)}")
        found = protos[0]
        coefficients = _dims(found, batched)[0]
        if coefficients <= 0:
            raise InvalidModel(f"segment: the prototypes {found.name} {list(found.shape)} do "
                               f"not say their count of coefficients")
        return Layout(tables[0].name, coefficients, proto=found.name)
    if kind == "pose":
        if kpt_shape is None or len(kpt_shape) != 2:
            raise InvalidModel("pose: no kpt_shape: neither postprocess.kpt_shape nor the "
                               "metadata's kpt_shape says how many keypoints a detection has")
        tables = [o for o in outputs if len(_dims(o, batched)) == 2]
        if len(tables) != 1:
            raise InvalidModel(f"pose: expected one detection table [4+C+K*D, N], got "
                               f"{_shapes(outputs)}")
        count, values = kpt_shape
        return Layout(tables[0].name, count * values, kpt_shape=(count, values))
    raise InvalidModel(f"postprocess.kind {kind} has no layout of parts")


def _dims(spec: Spec, batched: bool) -> tuple[int, ...]:
    shape = spec.shape
    return shape[1:] if shape and (batched or (len(shape) >= 2 and shape[0] == 1)) else shape


def _shapes(outputs: Sequence[Spec]) -> str:
    return ", ".join(f"{o.name} {list(o.shape)}" for o in outputs)
