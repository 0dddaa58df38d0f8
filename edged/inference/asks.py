"""What a language model's generation queue takes and gives (edged.inference.generation): a
client's ask, the events of its answer, and the counters per model."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from edged.backends import Piece
from edged.core.errors import EdgedError


@dataclass(frozen=True)
class Ask:
    """What a client asks for: a chat's messages or a completion's prompt, and how."""

    model: str
    version: int | None = None
    messages: Sequence[Mapping[str, str]] | None = None  # a chat, else `prompt`
    prompt: str = ""
    max_tokens: int | None = None  # None: the model's llm.max_tokens
    temperature: float = 0.8
    top_p: float = 0.95
    stop: tuple[str, ...] = ()
    json_schema: str | None = None  # the answer is JSON: "{}" any object, else this schema
    seed: int | None = None  # the sampler's seed (temperature > 0); None: random
    priority: int = 0  # 1 is the highest; 0 = the model's default
    timeout_s: float | None = None  # the longest wait in the queue; None = the model's


@dataclass(frozen=True)
class Started:
    version: int
    prompt_tokens: int
    context: int


@dataclass(frozen=True)
class Done:
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # stop | length | cancelled


Event = Started | Piece | Done | EdgedError


@dataclass
class GenerationCounters:
    """Per model, since start (GET /v2/edged/status, the bench)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    timed_out: int = 0
    refused: int = 0  # queue full
    tokens: int = 0
    yields: int = 0  # steps that waited for vision inference first (llm.yield_to_streams)
    yield_s: float = 0.0  # the seconds they waited, all together
    preempted: int = 0  # answers paused for a request of a higher priority, to resume later


Deliver = Callable[[Event], None]
