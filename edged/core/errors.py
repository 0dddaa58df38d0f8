"""The EdgedError tree: every error that crosses a boundary, with a stable code and HTTP status.

The code is part of the API and MQTT contract: clients match on it, so never rename one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class EdgedError(Exception):
    """Base of every error edged reports to a caller."""

    code = "internal"
    http_status = 500

    def to_dict(self) -> dict[str, str]:
        return {"error": str(self), "code": self.code}


@dataclass(frozen=True)
class ConfigIssue:
    """One problem in a YAML document: where it is and what is wrong."""

    path: str  # key path, e.g. "streams[1].source"; "" for the document itself
    message: str
    line: int | None = None  # 1-based YAML line
    file: str | None = None

    def __str__(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.line is not None:
            text += f" (line {self.line})"
        if self.file:
            text = f"{self.file}: {text}"
        return text


class ConfigError(EdgedError):
    """A config file (daemon YAML or model.yaml) is invalid; carries every issue found."""

    code = "config_invalid"
    http_status = 400

    def __init__(self, issues: list[ConfigIssue] | str) -> None:
        self.issues = [ConfigIssue("", issues)] if isinstance(issues, str) else list(issues)
        # What did convert (a `schema.Parsed`), when the schema layer could make it: checks of
        # what it names can still run, so every error is told at once.
        self.partial: Any = None
        super().__init__("; ".join(str(i) for i in self.issues))


class ToolError(EdgedError):
    """An operator command (`edged ota ...`) cannot do what it was asked: bad arguments,
    unreadable files, an unreachable broker."""

    code = "tool_error"
    http_status = 400


class ModelNotFound(EdgedError):
    code = "model_not_found"
    http_status = 404


class SnapshotNotFound(EdgedError):
    code = "snapshot_not_found"
    http_status = 404


class ClipNotFound(EdgedError):
    """No clip of that id is kept (never was, or retention deleted it)."""

    code = "clip_not_found"
    http_status = 404


class RangeNotSatisfiable(EdgedError):
    """A `Range` outside the file."""

    code = "range_not_satisfiable"
    http_status = 416


class RecordingUnavailable(EdgedError):
    """The recording folder is missing and cannot be made, or is not writable."""

    code = "recording_unavailable"


class StreamNotFound(EdgedError):
    """No running stream of that name (or none with pictures: a sensor stream)."""

    code = "stream_not_found"
    http_status = 404


class NoPicture(EdgedError):
    """A running stream has no processed frame yet: ask again shortly."""

    code = "no_picture"
    http_status = 503


class TooManyViewers(EdgedError):
    """A stream's live view has as many viewers as `api.live_viewers` allows."""

    code = "too_many_viewers"
    http_status = 503


class InvalidModel(EdgedError):
    """A model on disk is unusable: corrupt ONNX, bad model.yaml, signature mismatch."""

    code = "model_invalid"
    http_status = 400


class ModelLoadError(EdgedError):
    """A backend failed to load or warm up a model."""

    code = "model_load_failed"
    http_status = 500


class BackendUnavailable(EdgedError):
    """The chosen backend cannot run on this machine (module or device missing)."""

    code = "backend_unavailable"
    http_status = 500


class InferenceFailed(EdgedError):
    """The backend raised while running a batch."""

    code = "inference_failed"
    http_status = 500


class InvalidInput(EdgedError):
    code = "invalid_input"
    http_status = 400


class PreprocessUnknown(InvalidInput):
    """An image or frame for a model whose pre-processing neither model.yaml states nor its
    ONNX file tells: edged guesses none, and names the `preprocess:` keys to set."""

    code = "preprocess_unknown"


class Forbidden(EdgedError):
    """A socket peer whose uid/gid is not on the allowlist."""

    code = "forbidden"
    http_status = 403


class QueueFull(EdgedError):
    code = "queue_full"
    http_status = 503


class Overloaded(EdgedError):
    """The request bodies in flight hold the API's whole memory budget: retry later."""

    code = "overloaded"
    http_status = 503


class RateLimited(EdgedError):
    """A caller asked more often than its rate allows (MQTT requests: mqtt.requests.rate_per_s)."""

    code = "rate_limited"
    http_status = 429


class TooLarge(EdgedError):
    """A request body larger than any the API accepts (or than it can ever hold at once)."""

    code = "too_large"
    http_status = 413


class Timeout(EdgedError):
    code = "timeout"
    http_status = 504


class EndpointFailed(EdgedError):
    """An HTTP service edged calls (an event describer's endpoint) is down or answered an
    error."""

    code = "endpoint_failed"
    http_status = 502


class BodyTimeout(EdgedError):
    """A request body that did not arrive within `api.body_timeout_s` of its headers."""

    code = "body_timeout"
    http_status = 408


class ShuttingDown(EdgedError):
    code = "shutting_down"
    http_status = 503


class UpdateRejected(EdgedError):
    code = "update_rejected"
    http_status = 400


class QuantizationFailed(EdgedError):
    """ONNX Runtime could not quantize a model, or could not run the result (`edged quantize`);
    a variant that runs but misses its accuracy gate is refused, not failed."""

    code = "quantization_failed"
    http_status = 500


# -- galleries and faces (edged/galleries/, edged/streams/faces.py) -------------------------

class GalleryFull(EdgedError):
    """A gallery holds as many entries as its bound allows (`faces.max_entries`, or
    `faces.max_unknowns` for unknown faces): delete some, or raise the bound."""

    code = "gallery_full"
    http_status = 507


class IdentityNotFound(EdgedError):
    """No enrolled name, entry or unknown group of that id."""

    code = "identity_not_found"
    http_status = 404


class InvalidImage(InvalidInput):
    """An image that does not decode (corrupt, empty, or not JPEG/PNG/BMP/WebP)."""

    code = "image_invalid"


class NoFace(InvalidInput):
    """An enrolment image in which the face detector found no face with landmarks."""

    code = "no_face"


class SeveralFaces(InvalidInput):
    """An enrolment image with more than one face: enrolment needs exactly one."""

    code = "several_faces"


class InvalidEmbedding(EdgedError):
    """An embedder's vector that cannot be matched: NaN or infinite values (a broken export,
    an overflow in FP16)."""

    code = "embedding_invalid"
    http_status = 500


class FacesUnavailable(EdgedError):
    """The daemon runs no face pipeline (no `faces:` section), or its models cannot run."""

    code = "faces_unavailable"
    http_status = 503
