"""The describer's sections of the daemon config: the device's `describer:` (who describes,
the queue, the timeout, the cache) and each stream's `describe:` (opt-in, which labels, how
often). Cross checks that need the repository (the local model must be a language model) are
`edged check-config`'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from edged.core.schema import at_least, between, check_name, setting


def check_url(url: str) -> str | None:
    """An endpoint's base URL: http(s)://host[:port][/path], no query, no credentials in it."""
    try:
        parts = urlsplit(url)
        port = parts.port  # raises for a port that is not a number or out of range
    except ValueError as exc:
        return f"{url!r} is not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return f"{url!r}: an endpoint is http:// or https://"
    if not parts.hostname:
        return f"{url!r} names no host"
    if parts.username or parts.password:
        return "credentials do not go in the URL: api_key_file names the key's file"
    if parts.query or parts.fragment:
        return f"{url!r}: a base URL has no query or fragment (…/v1)"
    del port
    return None


def _check_model_id(value: str) -> str | None:
    return None if 0 < len(value) <= 256 and value.isprintable() else \
        "a model id is 1 to 256 printable characters"


@dataclass(frozen=True)
class EndpointConfig:
    """An OpenAI-compatible chat completions endpoint (OpenAI, Ollama, vLLM, llama.cpp's
    server, another edged's /v1)."""

    url: str = setting(help="base URL of the OpenAI-compatible API, e.g. "
                            "http://10.0.0.9:11434/v1 (POST <url>/chat/completions)",
                       check=check_url)
    model: str = setting(help="the endpoint's model id", check=_check_model_id)
    api_key_file: Path | None = setting(None, "file holding the API key (sent as a Bearer "
                                              "token); a relative path is read from "
                                              "$CREDENTIALS_DIRECTORY (systemd's "
                                              "LoadCredential=); null = no key")
    vision: bool = setting(False, "the model sees pictures (a VLM): the snapshot goes in the "
                                  "message as an image data URL; false = a text model, given "
                                  "the event's data only")
    response_format: Literal["json_schema", "json_object", "none"] = setting(
        "json_schema", "what the request asks of the answer: json_schema (the summary's "
                       "schema; OpenAI, vLLM, llama.cpp, Ollama, edged), json_object (any "
                       "JSON, for endpoints without schemas), none (the prompt alone asks)")


@dataclass(frozen=True)
class DescriberConfig:
    model: str | None = setting(None, "edged's own language model that describes (a "
                                      "model.gguf in the repository), through its generation "
                                      "queue at the lowest priority; null = `endpoint`",
                                check=check_name)
    endpoint: EndpointConfig | None = setting(None, "an OpenAI-compatible endpoint that "
                                                    "describes instead of a local model")
    queue: int = setting(16, "ended events waiting for a description; when full the oldest "
                             "is dropped (counted)", check=between(1, 10000))
    timeout_s: float = setting(60.0, "the longest one description may take (waiting for the "
                                     "local model included), then it is skipped (counted)",
                               check=between(0.1, 3600))
    max_tokens: int = setting(400, "the answer's tokens at most", check=between(16, 8192))
    temperature: float = setting(0.2, "sampling temperature (0 = greedy)",
                                 check=between(0, 2))
    cache: int = setting(256, "answers kept by what was asked (the snapshot's sha256 for a "
                              "picture, the event's data for a text model, with the model "
                              "and prompt): a repeat costs nothing; 0 = no cache",
                         check=between(0, 100000))
    instructions: str = setting("", "added to the prompt: what is typical at this site, what "
                                    "to watch for (as Frigate's activity_context_prompt)")
    nice: int = setting(10, "OS niceness of the describer's thread (Linux): the cameras' "
                            "work wins a contended core", check=between(0, 19))


@dataclass(frozen=True)
class StreamDescribeConfig:
    enabled: bool = setting(False, "describe this stream's ended events (needs `describer:`)")
    labels: list[str] = setting(factory=list, help="only objects with these labels; empty = "
                                                   "every label the stream tracks")
    min_duration_s: float = setting(0.0, "only events that lasted at least this long",
                                    check=at_least(0))
    per_minute: float = setting(6.0, "descriptions a minute at most, on average (a token "
                                     "bucket); past it events are skipped (counted)",
                                check=between(0.01, 6000))
    burst: int = setting(3, "descriptions that may come at once before `per_minute` holds",
                         check=between(1, 1000))
