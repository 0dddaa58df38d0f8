"""The EdgedError tree: every error that crosses a boundary, with a stable code and HTTP status.

The code is part of the API and MQTT contract: clients match on it, so never rename one.
"""

from __future__ import annotations

from dataclasses import dataclass


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


class TooLarge(EdgedError):
    """A request body larger than any the API accepts (or than it can ever hold at once)."""

    code = "too_large"
    http_status = 413


class Timeout(EdgedError):
    code = "timeout"
    http_status = 504


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
