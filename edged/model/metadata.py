"""What an ONNX file says about itself in `metadata_props`: the class names, input size, stride,
task and keypoint shape that Ultralytics (and YOLOv5's exporter) write there as Python literals;
the class names other exporters write as `labels` or `classes`; the character set PaddleOCR's
text recognisers carry as `character` (one per line).

Values are parsed with `ast.literal_eval`, never `eval`. A value that cannot be read is treated
as absent, with a warning naming the file and the key: a model with odd metadata still loads,
on model.yaml and the defaults alone.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)

# A stock export's metadata is a few KiB (COCO's 80 names are ~1.3 KiB); far more is not
# something to hand to the parser.
MAX_VALUE_CHARS = 1 << 20
MAX_CLASSES = 100_000
TASKS = ("detect", "classify", "segment", "pose", "obb")


@dataclass(frozen=True)
class ExportMetadata:
    """The parts of `metadata_props` edged uses; None where absent or unreadable."""

    names: tuple[str, ...] | None = None
    imgsz: tuple[int, int] | None = None  # (height, width), as Ultralytics writes it
    stride: int | None = None
    task: str | None = None
    end2end: bool | None = None
    kpt_shape: tuple[int, int] | None = None  # pose: (points, 2 or 3 values per point)
    kpt_names: tuple[str, ...] | None = None
    labels: tuple[str, ...] | None = None  # class names under `labels` or `classes`
    labels_key: str | None = None  # which of the two gave them
    character: tuple[str, ...] | None = None  # a text recogniser's character set
    description: str = ""
    author: str = ""
    raw: Mapping[str, str] = field(default_factory=dict)

    @property
    def ultralytics(self) -> bool:
        """An Ultralytics export (or YOLOv5's, which writes `stride` and `names` only): its
        pre-processing is the letterbox, 114 grey, RGB, 1/255."""
        said = f"{self.author} {self.description}".lower()
        return "ultralytics" in said or {"stride", "names"} <= set(self.raw)

    @property
    def rtdetr(self) -> bool:
        """Ultralytics describes an RT-DETR export as "Ultralytics rtdetr-l model ..."."""
        return "rtdetr" in self.description.lower().replace("-", "")


def read_metadata(props: Mapping[str, str], source: str) -> ExportMetadata:
    """Parse `metadata_props` (key → string). `source` names the file in warnings."""

    unreadable: set[str] = set()

    def bad(key: str, why: str) -> None:
        unreadable.add(key)
        logger.warning("%s: ignoring metadata %r (%s): %r", source, key, why,
                       props[key][:80])

    def literal(key: str) -> Any:
        text = props.get(key)
        if text is None:
            return None
        if len(text) > MAX_VALUE_CHARS:
            bad(key, f"longer than {MAX_VALUE_CHARS} characters")
            return None
        try:
            return ast.literal_eval(text.strip())
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            bad(key, "not a Python literal")
            return None

    names = _names(literal("names"))
    if names is None and "names" in props and "names" not in unreadable:
        bad("names", "expected {index: 'name', ...} or ['name', ...]")
    imgsz = _imgsz(literal("imgsz"))
    if imgsz is None and "imgsz" in props and "imgsz" not in unreadable:
        bad("imgsz", "expected [height, width] or one size")
    stride = literal("stride")
    if stride is not None and not _positive_int(stride):
        bad("stride", "expected a positive integer")
        stride = None
    task = props.get("task", "").strip() or None
    if task is not None and task not in TASKS:
        bad("task", f"expected one of {', '.join(TASKS)}")
        task = None
    end2end = literal("end2end")
    if end2end is not None and not isinstance(end2end, bool):
        bad("end2end", "expected True or False")
        end2end = None
    kpt_shape = literal("kpt_shape")
    if kpt_shape is not None and not (isinstance(kpt_shape, (list, tuple)) and len(kpt_shape) == 2
                                      and all(_positive_int(v) for v in kpt_shape)
                                      and kpt_shape[1] in (2, 3)):
        bad("kpt_shape", "expected [points, 2 or 3]")
        kpt_shape = None
    kpt_names = _kpt_names(literal("kpt_names"))
    labels, labels_key = None, None
    for key in ("labels", "classes"):
        if key in props and labels is None:
            labels = _names(_literal_or_lines(props[key]))
            labels_key = key if labels is not None else None
    character = None
    if "character" in props and len(props["character"]) <= MAX_VALUE_CHARS:
        character = tuple(props["character"].splitlines()) or None
    return ExportMetadata(names, imgsz, stride, task, end2end,
                          tuple(kpt_shape) if kpt_shape is not None else None, kpt_names,
                          labels, labels_key, character,
                          props.get("description", ""), props.get("author", ""), dict(props))


def _literal_or_lines(text: str) -> Any:
    """A Python literal (a list or a dict of names), else the text's lines (a labels file
    written into the metadata), else its comma-separated parts."""
    if len(text) > MAX_VALUE_CHARS:
        return None
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if len(lines) == 1:
            lines = [part.strip() for part in lines[0].split(",") if part.strip()]
        return lines or None


def _kpt_names(value: Any) -> tuple[str, ...] | None:
    """`kpt_names`: a list of point names, or Ultralytics' {class: [names]} (the first)."""
    if isinstance(value, dict) and value:
        value = next(iter(value.values()))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
        return tuple(value)
    return None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _names(value: Any) -> tuple[str, ...] | None:
    """`{0: 'person', 1: 'bicycle'}` (Ultralytics) or a list; gaps in the indices get the
    index as their name, as results do for classes without a label."""
    if isinstance(value, (list, tuple)):
        return tuple(value) if value and all(isinstance(v, str) for v in value) else None
    if not isinstance(value, dict) or not value:
        return None
    if not all(isinstance(k, int) and not isinstance(k, bool) and 0 <= k < MAX_CLASSES
               and isinstance(v, str) for k, v in value.items()):
        return None
    return tuple(value.get(i, str(i)) for i in range(max(value) + 1))


def _imgsz(value: Any) -> tuple[int, int] | None:
    if _positive_int(value):
        return value, value
    if isinstance(value, (list, tuple)) and len(value) in (1, 2) and all(
            _positive_int(v) for v in value):
        return (value[0], value[-1])
    return None
