"""The `as: identity` cascade: a stream's faces (detections with five landmarks, from a face
detector: a pose export with `kpt_shape: [5, 3]` or a RetinaFace-style head over priors) are
aligned, embedded by the cascade's model and matched against the daemon's gallery
(`edged.streams.faces`). A known face gets `identity: {name, similarity}` and, as Frigate
does, its name as the detection's `sub_label`; an unknown one `identity: {name: null,
similarity, group}`, the group of look-alikes a person can name once."""

from __future__ import annotations

import numpy as np

from edged.core.errors import InvalidModel
from edged.inference.scheduler import Scheduler
from edged.processing.detections import Detections
from edged.streams.cascade import Cascade
from edged.streams.config import SecondaryConfig
from edged.streams.faces import FaceService, landmarks_of


class FaceCascade(Cascade):
    def __init__(self, cfg: SecondaryConfig, scheduler: Scheduler, faces: FaceService, *,
                 stream: str, priority: int | None = None) -> None:
        if cfg.model != faces.cfg.embedder:
            raise InvalidModel(f"secondary model {cfg.model} (as: identity) is not the face "
                               f"pipeline's embedder (faces.embedder: {faces.cfg.embedder})")
        super().__init__(cfg, scheduler, priority=priority)
        self.faces = faces
        self.stream = stream

    def run(self, frame: np.ndarray, detections: Detections) -> int:
        """Identify the chosen detections that have five usable landmarks and a box wide
        enough; returns how many were embedded."""
        chosen, faces = [], []
        for index in self.select(detections):
            box = detections.boxes[index]
            points = landmarks_of(detections.keypoints[index], self.faces.cfg.landmark_score)
            if points is not None and box[2] - box[0] >= self.faces.cfg.min_face_px:
                chosen.append(index)
                faces.append(points)
        if not chosen:
            return 0
        found = self.faces.identify(frame, faces, source=f"stream {self.stream}")
        for index, identity in zip(chosen, found, strict=True):
            detections.identities[index] = identity
            if identity["name"] is not None:
                detections.set_sub_label(index, identity["name"], identity["similarity"])
        return len(chosen)
