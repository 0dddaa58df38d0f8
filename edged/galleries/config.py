"""The daemon's `faces:` section: the face pipeline's models, its gallery's file and bounds,
and the similarities that make a match and a group."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edged.core.schema import at_least, between, check_name, setting

# ArcFace's (InsightFace's `arcface_dst`) five landmarks on its 112 x 112 crop: left eye,
# right eye, nose, left and right mouth corner.
ARCFACE_TEMPLATE = ((38.2946, 51.6963), (73.5318, 51.5014), (56.0252, 71.7366),
                    (41.5493, 92.3655), (70.7299, 92.2041))
ARCFACE_SIZE = (112, 112)


def _check_template(points: list[list[float]]) -> str | None:
    if len(points) != 5 or any(len(p) != 2 for p in points):
        return "template must be five [x, y] points (eyes, nose, mouth corners)"
    return None


def _check_size(size: list[int]) -> str | None:
    return None if len(size) == 2 and min(size) >= 16 and max(size) <= 1024 else \
        "crop_size must be [width, height], 16..1024"


def _check_optional_name(value: str | None) -> str | None:
    return None if value is None else check_name(value)


@dataclass(frozen=True)
class FacesConfig:
    """Face recognition: a detector with five landmarks finds faces, each is aligned to the
    embedder's template and embedded, and the embedding is matched against the gallery.
    Streams use it through `secondary: [{model: <embedder>, as: identity}]`."""

    enabled: bool = setting(False, "run the face pipeline and keep its gallery")
    detector: str | None = setting(None, "face detector with five landmarks a face (a pose or "
                                         "priorbox model), used to enrol from images and "
                                         "snapshots; null = enrolment from images is off",
                                   check=_check_optional_name)
    embedder: str = setting("face_embedder", "face embedder: [N, 3, H, W] crops → [N, D]",
                            check=check_name)
    database: Path | None = setting(None, "the gallery's SQLite file; null = "
                                          "galleries/faces.sqlite beside models_dir")
    max_entries: int = setting(10000, "enrolled faces (names' entries and negatives) at most; "
                                      "an enrolment past it is refused", check=at_least(1))
    max_unknowns: int = setting(2000, "unknown sightings kept for grouping at most; past it "
                                      "new unknown faces get no group", check=at_least(0))
    match_threshold: float = setting(0.45, "cosine similarity from which a face is its "
                                           "nearest enrolled name (ArcFace: 0.3-0.5)",
                                     check=between(-1, 1))
    group_threshold: float = setting(0.5, "cosine similarity from which an unknown face joins "
                                          "the group of its nearest unknown sighting",
                                     check=between(-1, 1))
    keep_similar_below: float = setting(0.95, "an unknown sighting this similar to one kept "
                                              "already is not kept again (a face standing "
                                              "still fills nothing)", check=between(-1, 1))
    min_face_px: float = setting(16.0, "faces whose box is narrower (frame pixels) are not "
                                       "embedded", check=at_least(0))
    landmark_score: float = setting(0.3, "faces whose landmarks score below this (where the "
                                         "model scores them) are not embedded",
                                    check=between(0, 1))
    template: list[list[float]] = setting(
        factory=lambda: [list(p) for p in ARCFACE_TEMPLATE],
        help="the embedder's five landmark positions on its crop (ArcFace's by default)",
        check=_check_template)
    crop_size: list[int] = setting(factory=lambda: list(ARCFACE_SIZE),
                                   help="the aligned crop [width, height] (ArcFace: 112x112)",
                                   check=_check_size)

    def database_path(self, models_dir: Path) -> Path:
        return self.database if self.database is not None else \
            models_dir.parent / "galleries" / "faces.sqlite"
