"""The face pipeline over each face head edged reads (a YOLOv8-face pose export, InsightFace's
SCRFD, OpenCV's YuNet): a picture of one face is enrolled through the real scheduler and
ONNX Runtime, the same face elsewhere in another picture is that name, another face (the
coffee cup's picture) is an unknown with a group; the gallery's crop re-embeds to the
enrolled vector exactly. Re-embedding is single-flight in the background, skips a corrupt
crop, and keeps no unknown sightings while it runs; a NaN vector, or one of another width (an
embedder swapped under a frame), is skipped, not a new group or an exception."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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


@pytest.fixture
def one_service(tmp_path: Path) -> Iterator[FaceService]:
    """One detector is enough for what is not about the detector (the re-embedding)."""
    root = write_face_models(tmp_path / "models")
    write_model(make_face_yolo(0), root / "face_yolo" / "1" / "model.onnx")
    cache = ModelCache(ModelRepository(root), budget_bytes=1 << 30, options=options(tmp_path))
    scheduler = Scheduler(cache)
    cfg = FacesConfig(enabled=True, detector="face_yolo", embedder="face_embedder")
    faces = FaceService(cfg, scheduler, Gallery(tmp_path / "g.sqlite", max_entries=10,
                                                max_unknowns=10))
    try:
        yield faces
    finally:
        faces.close()
        scheduler.close(5)
        cache.close(timeout_s=5)


def _stale_gallery(service: FaceService) -> tuple[np.ndarray, np.ndarray, int]:
    """Ana enrolled, her row and a corrupt-crop row then marked as an older embedder's:
    (a later picture of Ana, a stranger's picture, the corrupt row's id)."""
    astronaut = cv2.imread(str(member("astronaut.png")))[20:240, 100:300]
    coffee = cv2.imread(str(member("coffee.png")))[50:350, 100:400]
    entry = service.enrol("Ana", cv2.imencode(".png", picture(astronaut, 40, 60, 240))[1]
                          .tobytes())
    bad = service.gallery.add("Bo", np.ones(8, np.float32), "face_embedder:1",
                              crop=b"\x89PNG\r\n\x1a\nnot a crop")
    db = service.gallery._db
    db.execute("UPDATE entries SET embedder = 'face_embedder:0' WHERE id IN (?, ?)",
               (entry["id"], bad))
    with service.gallery._lock:
        service.gallery._reindex()
    return picture(astronaut, 90, 150, 180), picture(coffee, 60, 100, 200), bad


def test_face_service_reembed_when_called_twice_at_once_runs_one_in_the_background(
        one_service: FaceService, monkeypatch: pytest.MonkeyPatch) -> None:
    later, stranger, bad = _stale_gallery(one_service)
    gallery = one_service.gallery
    release = threading.Event()
    started: list[threading.Thread] = []
    real = gallery.reembed

    def held(*args: Any, **kwargs: Any) -> int:
        started.append(threading.current_thread())
        assert release.wait(30)
        return real(*args, **kwargs)
    monkeypatch.setattr(gallery, "reembed", held)
    with ThreadPoolExecutor(2) as pool:
        states = list(pool.map(lambda _: one_service.reembed(), range(2)))
    # both answered while the one re-embedding is held: single-flight, nobody waited for it
    assert [s["reembedding"] for s in states] == [True, True] and len(started) == 1
    assert one_service.reembed()["reembedding"] and len(started) == 1
    # meanwhile a face that matches nothing yet is told, but no unknown sighting is kept
    [ana] = one_service.identify(later, one_service.find_faces(later))
    [unknown] = one_service.identify(stranger, one_service.find_faces(stranger))
    assert ana["name"] is None and unknown["name"] is None
    assert gallery.groups() == [] and gallery.counts()["unknowns"] == 0
    release.set()
    thread = one_service._reembedding
    assert thread is not None
    thread.join(30)
    state = one_service.reembed_state()
    # the corrupt crop is skipped and counted; Ana's row is done and she is known again
    assert (state["reembedded"], state["skipped"], state["stale"]) == (1, 1, 1), state
    assert one_service.skipped == [bad] and state["error"] is None
    [ana] = one_service.identify(later, one_service.find_faces(later))
    assert ana["name"] == "Ana"
    [unknown] = one_service.identify(stranger, one_service.find_faces(stranger))
    assert unknown["group"] == 1 and gallery.counts()["unknowns"] == 1


def test_face_service_identify_when_the_embedder_gives_nan_skips_the_face(
        one_service: FaceService, monkeypatch: pytest.MonkeyPatch) -> None:
    coffee = cv2.imread(str(member("coffee.png")))[50:350, 100:400]
    stranger = picture(coffee, 60, 100, 200)
    faces = one_service.find_faces(stranger)
    real = one_service.embed

    def broken(crops: Any) -> tuple[np.ndarray, str]:
        vectors, key = real(crops)
        return np.full_like(vectors, np.nan), key
    monkeypatch.setattr(one_service, "embed", broken)
    for _ in range(3):
        assert one_service.identify(stranger, faces) == \
            [{"name": None, "similarity": 0.0, "group": None}]
    assert one_service.gallery.groups() == []  # not a new unknown group at every frame
    assert one_service.identified["skipped"] == 3


def test_face_service_identify_when_the_vector_width_changed_under_it_skips_matching(
        one_service: FaceService, monkeypatch: pytest.MonkeyPatch) -> None:
    astronaut = cv2.imread(str(member("astronaut.png")))[20:240, 100:300]
    one_service.enrol("Ana", cv2.imencode(".png", picture(astronaut, 40, 60, 240))[1]
                      .tobytes())
    later = picture(astronaut, 90, 150, 180)
    faces = one_service.find_faces(later)
    real = one_service.embed

    def swapped(crops: Any) -> tuple[np.ndarray, str]:  # an OTA update landed in between
        vectors, _ = real(crops)
        return np.concatenate([vectors, vectors], axis=1) / np.sqrt(2), "face_embedder:9"
    monkeypatch.setattr(one_service, "embed", swapped)
    [face] = one_service.identify(later, faces)  # (einsum raised ValueError here)
    assert face["name"] is None and face["group"] is None
    assert one_service.gallery.groups() == []
