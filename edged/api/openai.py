"""OpenAI-compatible routes for language models, so OpenAI's own clients (and the tools built
on them: Frigate's GenAI, Home Assistant's) can be pointed at edged: `GET /v1/models`,
`POST /v1/chat/completions` and `POST /v1/completions`, streamed as server-sent events
(`"stream": true`, ending in `data: [DONE]`) or not. Errors come in OpenAI's shape
(`{"error": {"message", "type", "code"}}`) with edged's status and code."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from edged.api.generate import (
    MAX_SEED,
    collect,
    first,
    follow,
    number,
    read_json,
    sse,
    sse_response,
    stops,
    submit,
    text,
    whole,
)
from edged.api.http.budget import BodyBudget
from edged.api.http.messages import Request, Response, json_response
from edged.backends import Piece
from edged.core.errors import EdgedError, InvalidInput
from edged.inference.cache import ModelCache
from edged.inference.generation import Ask, Done, Generations

ROLES = ("system", "user", "assistant")
MAX_MESSAGES = 256
# What OpenAI's API takes and edged does too; then what it takes and edged accepts only at
# the value that changes nothing (anything else is refused, never silently ignored).
COMMON = frozenset({"model", "max_tokens", "temperature", "top_p", "stop", "stream",
                    "stream_options", "user", "priority", "response_format", "seed"})
MAX_SCHEMA_BYTES = 64 * 1024
NEUTRAL: Mapping[str, tuple[Any, ...]] = {"n": (1, None), "presence_penalty": (0, None),
                                          "frequency_penalty": (0, None),
                                          "logprobs": (False, None), "echo": (False, None)}
Handler = Callable[[Request], Awaitable[Response]]


class OpenAiRoutes:
    def __init__(self, generations: Callable[[], Generations | None], cache: ModelCache,
                 bodies: BodyBudget) -> None:
        self.generations = generations
        self.cache = cache
        self.bodies = bodies

    def routes(self) -> list[tuple[str, str, Handler]]:
        return [("GET", "/v1/models", self._openai(self.models)),
                ("POST", "/v1/chat/completions", self._openai(self.chat)),
                ("POST", "/v1/completions", self._openai(self.completions))]

    def _openai(self, handler: Handler) -> Handler:
        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except EdgedError as exc:
                kind = "invalid_request_error" if exc.http_status < 500 else "server_error"
                return json_response({"error": {"message": str(exc), "type": kind,
                                                "param": None, "code": exc.code}},
                                     status=exc.http_status)
        return answer

    # -- routes -------------------------------------------------------------------------------
    async def models(self, _request: Request) -> Response:
        listed = await asyncio.to_thread(self._language_models)
        return json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "edged"}
            for name, created in listed]})

    def _language_models(self) -> list[tuple[str, int]]:
        found = []
        for name in self.cache.repository.names():
            try:
                model = self.cache.describe(name)
            except EdgedError:  # a broken model is not listed (its status row says why)
                continue
            if model.is_language:
                found.append((name, int(model.model_path.stat().st_mtime)))
        return found

    async def chat(self, request: Request) -> Response:
        body = await read_json(request, self.bodies)
        check_fields(body, {"messages"})
        ask = sampling(body, messages=messages(body.get("messages")))
        return await self._answer(request, ask, body, chat=True)

    async def completions(self, request: Request) -> Response:
        body = await read_json(request, self.bodies)
        check_fields(body, {"prompt"})
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidInput("prompt must be a string (or a list of one)")
        return await self._answer(request, sampling(body, prompt=prompt), body, chat=False)

    async def _answer(self, request: Request, ask: Ask, body: Mapping[str, Any], *,
                      chat: bool) -> Response:
        generation = await submit(self.generations(), ask)
        events = follow(generation, request)
        await first(events)
        ident = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        made = {"id": ident, "created": int(time.time()), "model": ask.model}
        if not body.get("stream"):
            output, done = await collect(events)
            choice: dict[str, Any] = {"index": 0, "finish_reason": done.finish_reason}
            if chat:
                choice["message"] = {"role": "assistant", "content": output}
            else:
                choice.update(text=output, logprobs=None)
            return json_response({**made, "object": "chat.completion" if chat
                                  else "text_completion", "choices": [choice],
                                  "usage": usage(done)})
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        return sse_response(_chunks(events, made, chat=chat, include_usage=include_usage))


async def _chunks(events: AsyncGenerator[Any, None], made: dict[str, Any], *, chat: bool,
                  include_usage: bool) -> AsyncGenerator[bytes, None]:
    """OpenAI's stream: a chunk per piece of text (a chat's first says the role), the last
    with the finish reason, usage if asked, then [DONE]."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(content: str | None, finish: str | None, role: bool = False) -> bytes:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if chat:
            delta: dict[str, str] = {"role": "assistant"} if role else {}
            if content:
                delta["content"] = content
            choice["delta"] = delta
        else:
            choice.update(text=content or "", logprobs=None)
        return sse({**made, "object": kind, "choices": [choice]})

    try:
        if chat:
            yield chunk(None, None, role=True)
        async for event in events:
            if isinstance(event, Piece):
                if event.text or event.finish_reason:
                    yield chunk(event.text, event.finish_reason)
            elif isinstance(event, Done) and include_usage:
                yield sse({**made, "object": kind, "choices": [], "usage": usage(event)})
        yield sse("[DONE]")
    except EdgedError as exc:
        yield sse({"error": {"message": str(exc), "type": "server_error", "param": None,
                             "code": exc.code}})
    finally:
        await events.aclose()


def usage(done: Done) -> dict[str, int]:
    return {"prompt_tokens": done.prompt_tokens, "completion_tokens": done.completion_tokens,
            "total_tokens": done.prompt_tokens + done.completion_tokens}


def check_fields(body: Mapping[str, Any], own: set[str]) -> None:
    unknown = sorted(set(body) - COMMON - set(NEUTRAL) - own)
    if unknown:
        raise InvalidInput(f"unsupported fields {unknown}")
    for key, allowed in NEUTRAL.items():
        if key in body and body[key] not in allowed:
            raise InvalidInput(f"{key}: only {allowed[0]!r} is supported, got {body[key]!r}")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidInput("model must name a language model (GET /v1/models)")
    if not isinstance(body.get("stream", False), bool):
        raise InvalidInput("stream must be true or false")
    if not isinstance(body.get("stream_options") or {}, dict):
        raise InvalidInput("stream_options must be an object")


def sampling(body: Mapping[str, Any], *, prompt: str = "",
             messages: list[dict[str, str]] | None = None) -> Ask:
    return Ask(body["model"], None, messages=messages, prompt=prompt,
               json_schema=json_schema(body.get("response_format")),
               max_tokens=whole(body, "max_tokens", 1, 1 << 20),
               temperature=number(body, "temperature", 1.0, 0, 2),
               top_p=number(body, "top_p", 1.0, 0, 1), stop=stops(body.get("stop")),
               seed=whole(body, "seed", 0, MAX_SEED),
               priority=whole(body, "priority", 0, 16) or 0)


def json_schema(value: Any) -> str | None:
    """OpenAI's response_format: text (None), json_object ("{}": any JSON object) or
    json_schema (its schema, as text, for llama.cpp's grammar)."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "{}"
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise InvalidInput("response_format.json_schema.schema must be a JSON object")
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_BYTES:
            raise InvalidInput(f"response_format's schema is over {MAX_SCHEMA_BYTES} bytes")
        return text if schema else "{}"
    raise InvalidInput("response_format.type must be text, json_object or json_schema")


def messages(value: Any) -> list[dict[str, str]]:
    """A chat's messages, each a role and its text (a content list of text parts joined)."""
    if not isinstance(value, list) or not 0 < len(value) <= MAX_MESSAGES:
        raise InvalidInput(f"messages must be a list of 1 to {MAX_MESSAGES} messages")
    out = []
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            raise InvalidInput(f"messages[{i}] must be an object")
        role, content = message.get("role"), message.get("content")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise InvalidInput(f"messages[{i}].role must be one of {list(ROLES)}, got {role!r}")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise InvalidInput(f"messages[{i}].content: only text parts are supported "
                                   "(this model reads no images)")
            content = "".join(text(p, "text") for p in content)
        if not isinstance(content, str):
            raise InvalidInput(f"messages[{i}].content must be a string")
        out.append({"role": role, "content": content})
    return out
