"""Triton's generate extension for language models: `POST /v2/models/<m>/generate` (one JSON
answer) and `/generate_stream` (server-sent events, a piece of text each), and what the
OpenAI-compatible routes (`edged.api.openai`) share with it: a request body read under the
API's body budget, the sampling fields checked, a request's events followed until its end
while its client is there (a client gone cancels it within a token), and SSE framing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

from edged.api.http import jsontext
from edged.api.http.budget import BodyBudget, read_body
from edged.api.http.messages import Request, Response, Stream, json_response
from edged.backends import Piece
from edged.core.errors import EdgedError, InvalidInput, ModelNotFound
from edged.core.numbers import ascii_int
from edged.inference.generation import Ask, Done, Event, Generation, Generations, Started

PROMPT_BODY_BYTES = 1024 * 1024  # a prompt, a conversation: more is refused (413)
MAX_STOPS = 4
SSE_TYPE = "text/event-stream"
GONE_POLL_S = 0.1  # how often a request still queued looks whether its client is gone

# Triton's generate fields: the prompt, and the parameters edged's sampling takes (at the top
# level or under "parameters", as Triton allows).
TRITON_FIELDS = frozenset({"text_input", "max_tokens", "temperature", "top_p", "stop",
                           "stop_words", "stream", "priority", "timeout", "seed"})
MAX_SEED = 0xFFFFFFFE  # llama.cpp's 0xFFFFFFFF means "a random seed": no seed given


async def read_json(request: Request, bodies: BodyBudget) -> dict[str, Any]:
    """The request's JSON object, its bytes charged to the API's body budget while read."""
    charge = bodies.charge()
    try:
        raw = bytes(await read_body(request, PROMPT_BODY_BYTES, charge))
    finally:
        charge.release()
    body = jsontext.loads(raw)
    if not isinstance(body, dict):
        raise InvalidInput("the request body must be a JSON object")
    return body


def number(body: Mapping[str, Any], key: str, default: float, low: float, high: float
           ) -> float:
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            low <= value <= high):
        raise InvalidInput(f"{key} must be a number from {low} to {high}, got {value!r}")
    return float(value)


def whole(body: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidInput(f"{key} must be an integer from {low} to {high}, got {value!r}")
    return value


def stops(value: Any, key: str = "stop") -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or len(value) > MAX_STOPS or not all(
            isinstance(s, str) and s for s in value):
        raise InvalidInput(f"{key} must be a string or a list of at most {MAX_STOPS} "
                           "non-empty strings")
    return tuple(value)


def text(body: Mapping[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str):
        raise InvalidInput(f"{key} must be a string, got {type(value).__name__}")
    return value


async def submit(generations: Generations | None, ask: Ask) -> Generation:
    if generations is None:
        raise ModelNotFound("this server serves no language models")
    loop = asyncio.get_running_loop()
    return await asyncio.to_thread(generations.submit, ask, loop)


async def follow(generation: Generation, request: Request) -> AsyncGenerator[Event, None]:
    """The request's events until its Done (an EdgedError is raised); it is cancelled when
    its client is gone, or when the one following it stops (a stream closed)."""
    started = False
    try:
        while True:
            if request.content.connection_gone:
                return
            if started:  # a piece per token: the client is looked at between them
                event = await generation.next()
            else:  # queued, maybe for long: looked at every GONE_POLL_S
                try:
                    event = await asyncio.wait_for(generation.next(), GONE_POLL_S)
                except asyncio.TimeoutError:
                    continue
                started = isinstance(event, Started)
            if isinstance(event, EdgedError):
                raise event
            yield event
            if isinstance(event, Done):
                return
    finally:
        generation.cancel()  # a no-op once it is done


async def first(events: AsyncIterator[Event]) -> Started:
    """Wait until generation starts: a request refused before (a prompt too long for the
    context, a queue timeout) is answered with its own status, not a 200 that fails later."""
    try:
        event = await anext(events)
    except StopAsyncIteration:  # the client went away while it waited
        raise InvalidInput("the client went away") from None
    assert isinstance(event, Started), event
    return event


async def collect(events: AsyncIterator[Event]) -> tuple[str, Done]:
    parts: list[str] = []
    async for event in events:
        if isinstance(event, Piece):
            parts.append(event.text)
        elif isinstance(event, Done):
            return "".join(parts), event
    raise InvalidInput("the client went away")  # nobody reads this answer


def sse(data: Mapping[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


def sse_response(stream: Stream) -> Response:
    response = Response(status=200, content_type=SSE_TYPE,
                        headers={"Cache-Control": "no-cache"})
    response.stream = stream
    return response


class GenerateRoutes:
    """Triton's generate extension on the socket API."""

    def __init__(self, generations: Callable[[], Generations | None],
                 bodies: BodyBudget) -> None:
        self.generations = generations
        self.bodies = bodies

    def routes(self) -> list[tuple[str, str, Any]]:
        model = "/v2/models/{model}"
        versioned = "/v2/models/{model}/versions/{version}"
        return [(method, base + path, handler) for base in (model, versioned)
                for method, path, handler in (("POST", "/generate", self.generate),
                                              ("POST", "/generate_stream", self.stream))]

    async def generate(self, request: Request) -> Response:
        ask, _ = await self._ask(request)
        generation = await submit(self.generations(), ask)
        events = follow(generation, request)
        started = await first(events)
        output, _ = await collect(events)
        return json_response({"model_name": ask.model, "model_version": str(started.version),
                              "text_output": output})

    async def stream(self, request: Request) -> Response:
        ask, _ = await self._ask(request)
        generation = await submit(self.generations(), ask)
        events = follow(generation, request)
        started = await first(events)
        head = {"model_name": ask.model, "model_version": str(started.version)}

        async def parts() -> AsyncGenerator[bytes, None]:
            try:
                async for event in events:
                    if isinstance(event, Piece) and event.text:
                        yield sse({**head, "text_output": event.text})
            except EdgedError as exc:
                yield sse({"error": str(exc), "code": exc.code})
            finally:
                await events.aclose()

        return sse_response(parts())

    async def _ask(self, request: Request) -> tuple[Ask, dict[str, Any]]:
        """The route's model and version, and its body as an Ask."""
        name = request.match_info["model"]
        raw_version = request.match_info.get("version")
        version = None
        if raw_version is not None:
            version = ascii_int(raw_version)
            if version is None or version < 1:
                raise ModelNotFound(f"invalid version {raw_version[:16]!r}")
        body = await read_json(request, self.bodies)
        return generate_ask(name, version, body), body


def generate_ask(name: str, version: int | None, body: dict[str, Any]) -> Ask:
    """A Triton generate request's body (the socket's, or an MQTT prompt's) as an Ask."""
    parameters = body.pop("parameters", None) or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("parameters must be a JSON object")
    fields = {**parameters, **body}
    unknown = sorted(set(fields) - TRITON_FIELDS)
    if unknown:
        raise InvalidInput(f"unknown fields {unknown} (a generate request takes "
                           f"{sorted(TRITON_FIELDS)})")
    if "text_input" not in fields:
        raise InvalidInput("a generate request needs text_input (the prompt)")
    if not isinstance(fields.get("stream", False), bool):
        raise InvalidInput("stream must be true or false")
    timeout_us = whole(fields, "timeout", 0, 3600 * 10**6)
    return Ask(name, version, prompt=text(fields, "text_input"),
               max_tokens=whole(fields, "max_tokens", 1, 1 << 20),
               temperature=number(fields, "temperature", 0.8, 0, 2),
               top_p=number(fields, "top_p", 0.95, 0, 1),
               stop=stops(fields.get("stop") or fields.get("stop_words")),
               seed=whole(fields, "seed", 0, MAX_SEED),
               priority=whole(fields, "priority", 0, 16) or 0,
               timeout_s=timeout_us / 1e6 if timeout_us else None)
