"""Who answers a describer's question: edged's own language model, through its generation
queue at the lowest priority (`LocalAsker`), or an OpenAI-compatible endpoint over HTTP
(`EndpointAsker`, the standard library's client: the daemon needs no SDK). Each takes the
chat messages and a deadline and returns the answer's text, or raises Timeout (the deadline
passed), EndpointFailed (down, refused, an HTTP error) or another EdgedError."""

from __future__ import annotations

import copy
import http.client
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from edged.backends import Piece
from edged.core.credentials import credential
from edged.core.errors import ConfigError, EdgedError, EndpointFailed, Timeout
from edged.describer.config import EndpointConfig
from edged.describer.summary import SCHEMA
from edged.inference.cache import ModelCache
from edged.inference.generation import Ask, Done, Event, Generations

logger = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 1024 * 1024  # an endpoint's whole response at most
CHUNK = 64 * 1024
# The schema as a grammar or a response_format: the keywords a converter needs, not the ids.
ANSWER_SCHEMA = {key: value for key, value in SCHEMA.items() if not key.startswith("$")}
# What the local model's grammar holds it to: the same schema with shorter strings, at most 3
# concerns and no `time`, so that a whole answer fits describer.max_tokens' default (400)
# even when a small model runs every string to its bound (an answer cut short is no JSON).
# Every answer it allows, SCHEMA allows (a test checks the bounds).
LOCAL_SCHEMA = copy.deepcopy(ANSWER_SCHEMA)
LOCAL_SCHEMA["properties"].pop("time")
LOCAL_SCHEMA["properties"]["scene"]["maxLength"] = 300
LOCAL_SCHEMA["properties"]["other_concerns"].update(maxItems=3)
LOCAL_SCHEMA["properties"]["other_concerns"]["items"]["maxLength"] = 80

Messages = Sequence[Mapping[str, Any]]


class Asker(Protocol):
    model: str  # what answers, as the descriptions name it
    vision: bool  # sees the snapshot

    def ask(self, messages: Messages, deadline: float) -> str: ...


class LocalAsker:
    """edged's own language model (a model.gguf): text only, its answer held to the
    summary's schema by llama.cpp's grammar, queued behind every other request to it (its
    lowest priority level) and generated on its nice'd worker thread."""

    vision = False

    def __init__(self, generations: Generations, cache: ModelCache, model: str, *,
                 max_tokens: int, temperature: float) -> None:
        self.generations = generations
        self.cache = cache
        self.model = model
        self.max_tokens = max_tokens
        self.temperature = temperature
        self._schema = json.dumps(LOCAL_SCHEMA)

    def ask(self, messages: Messages, deadline: float) -> str:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout("the description's deadline passed before it was asked")
        lowest = self.cache.describe(self.model).config.llm.priority_levels
        ask = Ask(model=self.model, messages=[{"role": str(m["role"]),
                                               "content": str(m["content"])}
                                              for m in messages],
                  max_tokens=self.max_tokens, temperature=self.temperature,
                  json_schema=self._schema, priority=lowest, timeout_s=remaining)
        answer = _Collected()
        generation = self.generations.submit(ask, answer.take)
        if not answer.done.wait(max(0.0, deadline - time.monotonic())):
            generation.cancel()
            raise Timeout(f"{self.model}: no description within the timeout")
        if answer.error is not None:
            raise answer.error
        return "".join(answer.pieces)


class _Collected:
    """A generation's pieces, gathered on the model's worker thread."""

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.error: EdgedError | None = None
        self.done = threading.Event()

    def take(self, event: Event) -> None:
        if isinstance(event, Piece):
            self.pieces.append(event.text)
        elif isinstance(event, EdgedError):
            self.error = event
            self.done.set()
        elif isinstance(event, Done):
            self.done.set()


class EndpointAsker:
    """`POST <url>/chat/completions` on an OpenAI-compatible endpoint, the answer asked in
    the summary's schema (`response_format`), the whole call within the deadline."""

    def __init__(self, config: EndpointConfig, *, max_tokens: int, temperature: float) -> None:
        self.config = config
        self.model = config.model
        self.vision = config.vision
        self.max_tokens = max_tokens
        self.temperature = temperature
        parts = urlsplit(config.url)
        self._https = parts.scheme == "https"
        self._host = parts.hostname or ""
        self._port = parts.port
        self._path = parts.path.rstrip("/") + "/chat/completions"
        self._key = read_key(config.api_key_file) if config.api_key_file else None

    def ask(self, messages: Messages, deadline: float) -> str:
        body: dict[str, Any] = {"model": self.model, "messages": list(messages),
                                "max_tokens": self.max_tokens,
                                "temperature": self.temperature, "stream": False}
        kind = self.config.response_format
        if kind == "json_schema":
            body["response_format"] = {"type": "json_schema", "json_schema": {
                "name": "review_summary", "schema": ANSWER_SCHEMA}}
        elif kind == "json_object":
            body["response_format"] = {"type": "json_object"}
        status, raw = self._post(json.dumps(body).encode(), deadline)
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise EndpointFailed(f"{self.config.url}: HTTP {status}, not JSON") from exc
        if status != 200:
            error = answer.get("error") if isinstance(answer, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            raise EndpointFailed(f"{self.config.url}: HTTP {status}: {str(message)[:200]}")
        try:
            content = answer["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointFailed(f"{self.config.url}: the answer has no "
                                 "choices[0].message.content") from exc
        if not isinstance(content, str):
            raise EndpointFailed(f"{self.config.url}: the answer's content is not text")
        return content

    def _post(self, body: bytes, deadline: float) -> tuple[int, bytes]:
        """The response's status and body, all of it read by the deadline."""
        def remaining() -> float:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"{self.config.url}: no answer within the timeout")
            return left

        kind = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = kind(self._host, self._port, timeout=remaining())
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            connection.request("POST", self._path, body, headers)
            # Held here: http.client lets go of connection.sock once the response will
            # close the connection (Connection: close, HTTP/1.0), but its reads go on on
            # this socket, each of which must end by the deadline.
            sock = connection.sock
            if sock is not None:
                sock.settimeout(remaining())
            response = connection.getresponse()
            chunks, size = [], 0
            while True:
                left = remaining()
                if sock is not None:
                    sock.settimeout(left)
                chunk = response.read1(CHUNK) if hasattr(response, "read1") else \
                    response.read(CHUNK)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise EndpointFailed(f"{self.config.url}: the answer is over "
                                         f"{MAX_ANSWER_BYTES} bytes")
                chunks.append(chunk)
            return response.status, b"".join(chunks)
        except TimeoutError as exc:  # (socket.timeout is TimeoutError)
            raise Timeout(f"{self.config.url}: no answer within the timeout") from exc
        except (OSError, http.client.HTTPException) as exc:
            raise EndpointFailed(f"{self.config.url}: {exc.__class__.__name__}: {exc}"
                                 ) from exc
        finally:
            connection.close()


def read_key(path: Path) -> str:
    """The API key in `path` (relative: a systemd credential)."""
    path = credential(path)
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"describer.endpoint.api_key_file: cannot read {path}: "
                          f"{exc.strerror}") from exc
