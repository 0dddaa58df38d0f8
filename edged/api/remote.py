"""KServe v2 inference for callers that are not on the socket (MQTT 5 requests, edged/mqtt/
requests.py): a request body (JSON, or JSON then binary tensors with its JSON length) to an
answer body, through the socket's infer route's codec, checks and scheduler: the same
priorities (the request's `priority` parameter, else the model's default, as stream frames
have theirs) and timeouts, the same error codes, and the same memory bound: a request's body
and what parsing makes of it are charged to the socket's body budget (api.max_bodies_mb) until
it is answered. No shared memory: the caller is elsewhere.

Nothing of the device's filesystem goes back to such a caller (`RemoteInference.describe`): an
error's text names the model, its version and what is wrong, as the socket's does, less the
paths the socket's local users are told."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edged.api.http.budget import JSON_WEIGHT, BodyBudget, Charge
from edged.api.kserve import check_outputs
from edged.api.protocol import InferRequest, decode_request, encode_response
from edged.core.errors import EdgedError, InvalidInput, TooLarge
from edged.core.redact import remote_text
from edged.inference.cache import ModelCache
from edged.inference.scheduler import Scheduler


@dataclass(frozen=True)
class Answer:
    body: bytes
    json_length: int | None  # where the JSON ends when binary tensors follow it


class RemoteCall:
    """One request queued on the scheduler; `answer()` once its future is done."""

    def __init__(self, model: str, parsed: InferRequest, future: Future[Any],
                 cache: ModelCache, charge: Charge) -> None:
        self.model = model
        self.parsed = parsed
        self.future = future
        self.cache = cache
        self.charge = charge

    def answer(self) -> Answer:
        """The answer body; raises the request's EdgedError (timeout, inference failure).
        Either way the request's share of the body budget goes back."""
        try:
            outputs = self.future.result()
            version = getattr(self.future, "version", None)
            served = version if version is not None else self.cache.default_version(self.model)
            parts, json_length = encode_response(self.model, served, self.parsed.id, outputs,
                                                 self.parsed.outputs, self.parsed.binary_default)
            return Answer(b"".join(parts), json_length)
        finally:
            self.charge.release()


class RemoteInference:
    def __init__(self, scheduler: Scheduler, cache: ModelCache, bodies: BodyBudget,
                 max_bytes: int, local_dirs: Iterable[Path] = ()) -> None:
        """`local_dirs`: folders besides the model repository that errors may name (the
        engine cache), as configured: a relative one is known only as written."""
        self.local_dirs = tuple(local_dirs)
        self.scheduler = scheduler
        self.cache = cache
        self.bodies = bodies
        self.max_bytes = max_bytes

    def describe(self, exc: EdgedError) -> str:
        """The error's text for the remote caller: no path of the device (remote_text)."""
        return remote_text(str(exc), self.cache.repository.root, self.local_dirs)

    def start(self, model: str, body: bytes, json_length: int | None) -> RemoteCall:
        """Decode and queue one request (on the caller's thread: it may read the model's
        files the first time). Raises at once what is known at once: too_large, overloaded,
        model_not_found, invalid_input, queue_full, shutting_down."""
        if len(body) > self.max_bytes:
            raise TooLarge(f"the request's {len(body)} bytes exceed the {self.max_bytes} "
                           "taken over MQTT (mqtt.requests.max_request_mb)")
        self.scheduler.prepare(model)  # ModelNotFound for a model that is not served
        charge = self.bodies.charge()
        try:
            head = len(body) if json_length is None else min(max(json_length, 0), len(body))
            charge.add(len(body) + head * (JSON_WEIGHT - 1))
            parsed = decode_request(body, json_length, charge=charge.add)  # no shm
            if parsed.outputs:
                check_outputs(self.scheduler.model(model), parsed)
                if any(out.shm is not None for out in parsed.outputs):
                    raise InvalidInput("shared memory is not available over MQTT")
            future = self.scheduler.submit(model, parsed.inputs, priority=parsed.priority,
                                           timeout_s=parsed.timeout_s)
        except BaseException:
            charge.release()
            raise
        parsed.inputs = {}  # the batch owns them now
        return RemoteCall(model, parsed, future, self.cache, charge)
