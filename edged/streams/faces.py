"""The face pipeline's models and gallery, one per daemon: a face's five landmarks → the crop
aligned to the embedder's template (`edged.tasks.align`) → the embedder, through the
scheduler → the gallery (`edged.galleries`). Streams reach it through their `as: identity`
cascade (`edged.streams.face_cascade`); the socket API and the CLI through `enrol`,
`negative` and the gallery's own listing.

The gallery's rows carry the embedder (`model:version`) that made them. When the version
serving changes (an OTA update, a reload), vectors of the two are never compared: the new one
matches only rows re-embedded from their kept crops, which a background thread does at once
(`reembed_state` says how far it is; rows without a crop must be enrolled again, and it says
how many)."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Sequence
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from edged.core.errors import (
    EdgedError,
    FacesUnavailable,
    InvalidEmbedding,
    InvalidImage,
    InvalidModel,
    NoFace,
    SeveralFaces,
    Timeout,
)
from edged.galleries.config import FacesConfig
from edged.galleries.store import Gallery, check_identity_name
from edged.inference.scheduler import Outputs, Scheduler
from edged.model.config import PostprocessConfig
from edged.model.repository import ModelVersion
from edged.processing.detections import Detections
from edged.processing.post import Postprocessor
from edged.processing.pre import image_preprocess, preprocess
from edged.streams.image_size import FORMATS, image_size
from edged.tasks.align import align
from edged.tasks.embed import unit_rows
from edged.tasks.keypoints import FACE_LANDMARKS

logger = logging.getLogger(__name__)

# An enrolment image larger than this is refused from its header, before decoding
# (`edged.streams.image_size`). OpenCV's own OPENCV_IO_MAX_IMAGE_PIXELS guard is not set: it is
# process-wide and read once, at OpenCV's first decode (whatever module that is), and only a
# header already read here reaches imdecode; its refusal (cv2.error) is image_invalid anyway.
MAX_IMAGE_PIXELS = 40_000_000


def landmarks_of(points: dict[str, list[float]] | None, min_score: float
                 ) -> list[list[float]] | None:
    """A detection's five face landmarks in RetinaFace's order (by name where the model
    names them so, else its first five points), or None: fewer than five, or one scored
    below `min_score`."""
    if not points or len(points) < len(FACE_LANDMARKS):
        return None
    chosen = [points[n] for n in FACE_LANDMARKS] if all(n in points for n in FACE_LANDMARKS) \
        else list(points.values())[:len(FACE_LANDMARKS)]
    if any(len(p) > 2 and p[2] < min_score for p in chosen):
        return None
    return [[float(p[0]), float(p[1])] for p in chosen]


def decode_image(data: bytes | memoryview) -> np.ndarray:
    """A JPEG/PNG/BMP/WebP as BGR pixels; InvalidImage when it does not decode, or when its
    header says more than MAX_IMAGE_PIXELS (refused before a pixel is decoded: a few hundred
    bytes of PNG can declare a gigabyte of pixels)."""
    if not len(data):
        raise InvalidImage("the image is empty")
    width, height = image_size(data)
    if width * height > MAX_IMAGE_PIXELS:
        raise InvalidImage(f"the image is {width}x{height}: more than {MAX_IMAGE_PIXELS} "
                           "pixels")
    try:
        pixels = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as exc:  # (a header OpenCV refuses: its own pixel bound, a bad depth)
        raise InvalidImage(f"the {len(data)} bytes do not decode: "
                           f"{str(exc).strip().splitlines()[-1][:160]}") from None
    if pixels is None or pixels.size == 0:
        raise InvalidImage(f"the {len(data)} bytes are no image OpenCV decodes ({FORMATS})")
    if pixels.shape[0] * pixels.shape[1] > MAX_IMAGE_PIXELS:  # (a header that lied)
        raise InvalidImage(f"the image is {pixels.shape[1]}x{pixels.shape[0]}: more than "
                           f"{MAX_IMAGE_PIXELS} pixels")
    return pixels


class FaceService:
    def __init__(self, cfg: FacesConfig, scheduler: Scheduler, gallery: Gallery, *,
                 timeout_s: float = 10.0) -> None:
        self.cfg = cfg
        self.scheduler = scheduler
        self.gallery = gallery
        self.timeout_s = timeout_s
        self.size = (int(cfg.crop_size[0]), int(cfg.crop_size[1]))
        self._key: str | None = None  # the embedder whose rows the gallery matches
        self._lock = threading.Lock()
        self._reembedding: threading.Thread | None = None
        self.reembedded = 0  # rows re-embedded since start
        self.skipped: list[int] = []  # rows the last re-embedding skipped (a crop that is bad)
        # faces told since start (metrics); "skipped": a vector not finite, or a frame whose
        # embedder was swapped under it
        self.identified = {"known": 0, "unknown": 0, "skipped": 0}
        self.reembed_error: str | None = None

    # -- the embedder ----------------------------------------------------------------------
    def embedder(self) -> ModelVersion:
        try:
            model = self.scheduler.model(self.cfg.embedder)
        except EdgedError as exc:
            raise FacesUnavailable(f"faces.embedder {self.cfg.embedder}: {exc}") from exc
        post = model.config.postprocess or PostprocessConfig()
        if post.kind != "embed":
            raise InvalidModel(f"faces.embedder {model.label} is no embedder (postprocess.kind:"
                               f" {post.kind}): its one output must be [N, D] with no names")
        return model

    def current(self) -> str:
        """The serving embedder's key; when it changed, the gallery switches to it and a
        re-embedding of the older rows starts."""
        model = self.embedder()
        key = f"{model.name}:{model.version}"
        if key != self._key:
            with self._lock:
                if key != self._key:
                    self._switch(key)
        return key

    def embed(self, crops: Sequence[np.ndarray]) -> tuple[np.ndarray, str]:
        """Aligned crops (BGR) → unit vectors [N, D], and the embedder key that made them."""
        model = self.embedder()
        spec = model.inputs[0]
        batched = model.max_batch_size > 0
        pre = image_preprocess(model.config.preprocess, model.label, spec, batched)
        tensors = [preprocess(crop, pre, spec)[0] for crop in crops]
        step = model.max_batch_size or 1
        futures = []
        for start in range(0, len(tensors), step):
            part = np.concatenate(tensors[start:start + step]) if batched else tensors[start][0]
            futures.append(self.scheduler.submit(model.name, {spec.name: part},
                                                 version=model.version))
        rows = []
        for future in futures:
            try:
                outputs: Outputs = future.result(timeout=self.timeout_s)
            except FutureTimeout:
                raise Timeout(f"faces.embedder {model.name} did not answer in "
                              f"{self.timeout_s:g} s") from None
            rows.append(unit_rows(next(iter(outputs.values()))))
        return np.concatenate(rows), f"{model.name}:{model.version}"

    def crops(self, frame: np.ndarray, faces: Sequence[Sequence[Sequence[float]]]
              ) -> list[np.ndarray]:
        return [align(frame, points, self.cfg.template, self.size) for points in faces]

    # -- a stream's faces ------------------------------------------------------------------
    def identify(self, frame: np.ndarray, faces: Sequence[Sequence[Sequence[float]]],
                 source: str | None = None) -> list[dict[str, Any]]:
        """Each face's identity: `{"name", "similarity"}` when the gallery knows it, else
        `{"name": None, "similarity", "group"}` (its unknown group; None when the unknowns
        are full, or the face's vector was not finite)."""
        if not faces:
            return []
        self.current()
        crops = self.crops(frame, faces)
        vectors, key = self.embed(crops)
        try:
            return self._identify(crops, vectors, key, source)
        except sqlite3.Error as exc:  # the file (a full disk, a lost mount): the frame goes on
            raise FacesUnavailable(f"the gallery {self.gallery.path} failed: {exc}") from exc

    def _identify(self, crops: Sequence[np.ndarray], vectors: np.ndarray, key: str,
                  source: str | None) -> list[dict[str, Any]]:
        # While rows are re-embedded (or this frame's embedder is not yet the gallery's), a
        # face not matched may be a known one whose rows are not done: it is told its nearest
        # group, but no unknown sighting is kept for it.
        record = key == self._key and not self.reembedding
        found: list[dict[str, Any]] = []
        for crop, vector in zip(crops, vectors, strict=True):
            if not np.isfinite(vector).all():
                self.identified["skipped"] += 1
                logger.warning("faces: %s gave a vector with NaN or infinity: the face is "
                               "skipped", key, extra={"code": InvalidEmbedding.code})
                found.append({"name": None, "similarity": 0.0, "group": None})
                continue
            match = self.gallery.match(vector, self.cfg.match_threshold)
            if match is not None:
                found.append({"name": match.name, "similarity": match.similarity})
                self.identified["known"] += 1
                continue
            self.identified["unknown"] += 1
            seen = self.gallery.sighting(vector, key, group_threshold=self.cfg.group_threshold,
                                         keep_below=self.cfg.keep_similar_below,
                                         crop=partial(_png, crop), source=source,
                                         record=record)
            found.append({"name": None, "similarity": seen.similarity, "group": seen.group})
        return found

    @property
    def reembedding(self) -> bool:
        thread = self._reembedding
        return thread is not None and thread.is_alive()

    # -- enrolment -------------------------------------------------------------------------
    def enrol(self, name: str, image: bytes | memoryview, *, negative: bool = False,
              source: str | None = None) -> dict[str, Any]:
        """Enrol the one face of an image under `name` (a negative: "this face is not
        `name`"). InvalidImage, NoFace, SeveralFaces, GalleryFull name what is wrong."""
        name = check_identity_name(name)
        frame = decode_image(image)
        faces = self.find_faces(frame)
        if not faces:
            raise NoFace(f"no face with five landmarks was found in the {frame.shape[1]}x"
                         f"{frame.shape[0]} image{f' ({source})' if source else ''}: enrol a "
                         "picture of one face")
        if len(faces) > 1:
            raise SeveralFaces(f"{len(faces)} faces were found in the image"
                               f"{f' ({source})' if source else ''}: enrolment takes a "
                               "picture of exactly one")
        key = self.current()
        crop = self.crops(frame, faces)[0]
        vector, key = self.embed([crop])
        try:
            entry = self.gallery.add(name, vector[0], key, crop=_png(crop), negative=negative,
                                     source=source)
        except sqlite3.Error as exc:
            raise FacesUnavailable(f"the gallery {self.gallery.path} failed: {exc}") from exc
        return {"id": entry, "name": name, "negative": negative, "embedder": key,
                "landmarks": [[round(x, 1), round(y, 1)] for x, y in faces[0]]}

    def find_faces(self, frame: np.ndarray) -> list[list[list[float]]]:
        """The faces (their five landmarks, frame pixels) the detector finds in a picture."""
        if self.cfg.detector is None:
            raise FacesUnavailable("faces.detector is not set: enrolment from images needs a "
                                   "face detector with landmarks")
        model = self.scheduler.model(self.cfg.detector)
        kind = (model.config.postprocess or PostprocessConfig()).kind
        if kind != "pose":
            raise InvalidModel(f"faces.detector {model.label} gives no landmarks "
                               f"(postprocess.kind: {kind}): it must be a face detector with "
                               "five points a face (a pose export with kpt_shape [5, 3], or a "
                               "RetinaFace, SCRFD or YuNet head)")
        spec = model.inputs[0]
        batched = model.max_batch_size > 0
        pre = image_preprocess(model.config.preprocess, model.label, spec, batched)
        tensor, geometry = preprocess(frame, pre, spec)
        future = self.scheduler.submit(model.name, {spec.name: tensor if batched else tensor[0]},
                                       version=model.version)
        try:
            outputs = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise Timeout(f"faces.detector {model.name} did not answer in {self.timeout_s:g} s"
                          ) from None
        post = Postprocessor(model.config.postprocess, model.dir.parent, model.head)
        found = post(outputs, geometry).get("detections")
        if not isinstance(found, Detections):
            raise InvalidModel(f"faces.detector {model.label} finds no boxes (postprocess.kind:"
                               f" {post.cfg.kind})")
        faces = []
        for i in range(len(found)):
            points = landmarks_of(found.keypoints[i], self.cfg.landmark_score)
            box = found.boxes[i]
            if points is not None and box[2] - box[0] >= self.cfg.min_face_px:
                faces.append(points)
        return faces

    def status(self) -> dict[str, Any]:
        """What `edged status` shows: the gallery's counts and bounds, its embedder's state."""
        return {**self.gallery.counts(), "names": len(self.gallery.names()),
                "identified": dict(self.identified), "embedder": self.reembed_state()}

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for a re-embedding in progress, then close the gallery's file."""
        thread = self._reembedding
        if thread is not None:
            thread.join(timeout=timeout_s)
        self.gallery.close()

    # -- re-embedding ----------------------------------------------------------------------
    def reembed_state(self) -> dict[str, Any]:
        key = self._key
        with_crop, without = self.gallery.stale(key) if key is not None else (0, 0)
        return {"embedder": key, "stale": with_crop, "without_crop": without,
                "reembedding": self.reembedding, "reembedded": self.reembedded,
                "skipped": len(self.skipped), "error": self.reembed_error}

    def reembed(self) -> dict[str, Any]:
        """Start re-embedding (on its thread) the rows the serving embedder did not make, or
        join the one running: single-flight, it does not wait. Its state."""
        key = self.current()
        with self._lock:
            if not self.reembedding and self.gallery.stale(key)[0]:
                self._start_reembed(key)
        return self.reembed_state()

    def _switch(self, key: str) -> None:
        before = self._key
        self._key = key
        self.gallery.set_embedder(key)
        with_crop, without = self.gallery.stale(key)
        if without:
            logger.warning("faces: %d gallery entries were made by another embedder and keep "
                           "no crop: enrol them again (serving %s)", without, key,
                           extra={"code": "gallery_stale"})
        if with_crop:
            logger.info("faces: embedder %s serves (was %s): re-embedding %d gallery rows from "
                        "their crops", key, before or "unknown", with_crop)
            self._start_reembed(key)

    def _start_reembed(self, key: str) -> None:
        self._reembedding = threading.Thread(target=self._reembed, args=(key,),
                                             name="faces-reembed", daemon=True)
        self._reembedding.start()

    def _reembed(self, key: str) -> int:
        def embed(pngs: list[bytes]) -> np.ndarray:
            crops = [decode_image(p) for p in pngs]
            vectors, made = self.embed(crops)
            if made != key:
                raise FacesUnavailable(f"the embedder changed again ({made}) while "
                                       f"re-embedding for {key}")
            return vectors
        skipped: list[int] = []
        try:
            done = self.gallery.reembed(key, embed, skipped=skipped)
        except (EdgedError, sqlite3.Error) as exc:  # (the file closed at shutdown)
            self.reembed_error = str(exc)
            logger.error("faces: re-embedding for %s stopped: %s", key, exc,
                         extra={"code": getattr(exc, "code", "gallery_unavailable")})
            return 0
        self.reembedded += done
        self.skipped = skipped
        self.reembed_error = None
        logger.info("faces: %d gallery rows re-embedded with %s", done, key)
        return done


def _png(crop: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", crop)
    if not ok:  # (an aligned crop always encodes)
        raise InvalidImage("the aligned crop did not encode as PNG")
    return bytes(data)


def open_faces(cfg: FacesConfig, models_dir: Path, scheduler: Scheduler) -> FaceService | None:
    """The daemon's face pipeline when `faces.enabled`, its gallery opened and its embedder
    told (a re-embedding starts if that changed since the last run); None when off, or when
    the gallery file cannot be used (logged: the streams run without faces)."""
    if not cfg.enabled:
        return None
    path = cfg.database_path(models_dir)
    try:
        gallery = Gallery(path, max_entries=cfg.max_entries, max_unknowns=cfg.max_unknowns)
    except (OSError, sqlite3.Error) as exc:
        logger.error("faces: the gallery %s cannot be used: %s", path, exc,
                     extra={"code": "gallery_unavailable"})
        return None
    service = FaceService(cfg, scheduler, gallery)
    try:
        service.current()
    except EdgedError as exc:  # the embedder may come later (OTA): checked at each use
        logger.warning("faces: embedder %s is not usable yet: %s", cfg.embedder, exc,
                       extra={"code": exc.code})
    counts = gallery.counts()
    logger.info("faces: gallery %s: %d of %d faces enrolled, %d unknown sightings", path,
                counts["entries"], counts["max_entries"], counts["unknowns"])
    return service
