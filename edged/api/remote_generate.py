"""Language-model prompts for callers that are not on the socket (MQTT 5 requests,
edged/mqtt/requests.py): a Triton generate body (the socket's fields, and `stream`) queued on
the same fair queue as the socket's requests, its answer handed back as messages to publish:
one with the whole text, or (`"stream": true`) one per piece of text as it comes and then a
final one. Every message is `{"model_name", "model_version", "text_output"}`; the last also
has `"final": true`, the `finish_reason` and the `usage`. An error after the request was taken
(a prompt too long for the context, a queue timeout) is a final `{"error", "code"}` message."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from edged.api.generate import generate_ask
from edged.backends import Piece
from edged.core.errors import EdgedError, InvalidInput
from edged.core.redact import remote_text
from edged.inference.generation import Done, Event, Generations, Started

# (payload, HTTP-like status, final): the caller publishes it with the request's correlation
Send = Callable[[bytes, int, bool], None]


class RemoteGenerate:
    def __init__(self, generations: Generations) -> None:
        self.generations = generations

    def start(self, model: str, body: bytes, send: Send) -> None:
        """Parse and queue one prompt; `send` gets its messages from the model's worker
        thread. Raises at once what is known at once (invalid_input, model_not_found,
        queue_full, shutting_down): nothing is sent then."""
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"malformed JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise InvalidInput("the request body must be a JSON object")
        parameters = doc.get("parameters")
        stream = doc.get("stream", parameters.get("stream") if isinstance(parameters, dict)
                         else False)
        ask = generate_ask(model, None, doc)
        self.generations.submit(ask, _Answer(model, bool(stream), send,
                                             self.generations.cache.repository.root))


class _Answer:
    """Turns one request's events into the messages published."""

    def __init__(self, model: str, stream: bool, send: Send, root: Any) -> None:
        self.model = model
        self.stream = stream
        self.send = send
        self.root = root
        self.version = ""
        self.parts: list[str] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, Started):
            self.version = str(event.version)
        elif isinstance(event, Piece):
            if self.stream and event.text:
                self._send({"text_output": event.text}, final=False)
            else:
                self.parts.append(event.text)
        elif isinstance(event, Done):
            self._send({"text_output": "" if self.stream else "".join(self.parts),
                        "final": True, "finish_reason": event.finish_reason,
                        "usage": {"prompt_tokens": event.prompt_tokens,
                                  "completion_tokens": event.completion_tokens}}, final=True)
        elif isinstance(event, EdgedError):
            self.send(json.dumps({"error": remote_text(str(event), self.root, ()),
                                  "code": event.code, "final": True}).encode(),
                      event.http_status, True)

    def _send(self, fields: dict[str, Any], *, final: bool) -> None:
        message = {"model_name": self.model, "model_version": self.version, **fields}
        self.send(json.dumps(message).encode(), 200, final)
