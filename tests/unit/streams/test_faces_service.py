"""The face pipeline over each face head edged reads (a YOLOv8-face pose export, InsightFace's
SCRFD, OpenCV's YuNet): a picture of one face is enrolled through the real scheduler and
ONNX Runtime, the same face elsewhere in another picture is that name, another face (the
coffee cup's picture) is an unknown with a group; the gallery's crop re-embeds to the
enrolled vector exactly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from support.backends import options

from edged.galleries.config import FacesConfig
from edged.galleries.store import Gallery
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler
from edged.model.repository import ModelRepository
from edged.streams.faces import FaceService, decode_image
from tools.assets.faces import (
    make_face_scrfd,
    make_face_yolo,
    make_face_yunet,
    paste_face,
    write_face_models,
)
from tools.assets.models import write_model
from tools.real_models import member

DETECTORS: dict[str, Callable[[int], onnx.ModelProto]] = {
    "face_yolo": make_face_yolo, "face_scrfd": make_face_scrfd, "face_yunet": make_face_yunet}


def picture(face: np.ndarray, x: int, y: int, size: int) -> np.ndarray:
    frame = np.zeros((480, 640, 3), np.uint8)
    return paste_face(frame, face, x, y, size)


@pytest.fixture(params=sorted(DETECTORS))
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FaceService]:
    root = write_face_models(tmp_path / "models")
    write_model(DETECTORS[request.param](0), root / request.param / "1" / "model.onnx")
    cache = ModelCache(ModelRepository(root), budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    cfg = FacesConfig(enabled=True, detector=request.param, embedder="face_embedder")
    faces = FaceService(cfg, scheduler, Gallery(tmp_path / "g.sqlite", max_entries=10,
                                                max_unknowns=10))
    try:
        yield faces
    finally:
        faces.close()
        scheduler.close(5)
        cache.close(timeout_s=5)


def test_face_service_when_a_face_is_enrolled_knows_it_elsewhere_and_groups_a_stranger(
        service: FaceService) -> None:
    astronaut = cv2.imread(str(member("astronaut.png")))[20:240, 100:300]
    coffee = cv2.imread(str(member("coffee.png")))[50:350, 100:400]
    enrolled = picture(astronaut, 40, 60, 240)
    entry = service.enrol("Ana", cv2.imencode(".png", enrolled)[1].tobytes())
    later = picture(astronaut, 90, 150, 180)
    [ana] = service.identify(later, service.find_faces(later))
    assert ana["name"] == "Ana" and ana["similarity"] > 0.95
    stranger = picture(coffee, 60, 100, 200)
    [unknown] = service.identify(stranger, service.find_faces(stranger))
    assert unknown["name"] is None and unknown["group"] == 1
    # the kept crop embeds to the enrolled vector exactly (what a re-embedding starts from)
    crop = decode_image(service.gallery.crop(entry["id"]) or b"")
    vector, _ = service.embed([crop])
    again = service.gallery.match(vector[0], 0.999)
    assert again is not None and again.name == "Ana" and again.similarity > 0.99999
