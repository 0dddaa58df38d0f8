"""The small contract every backend meets: `load(spec, options) -> Session`, `Session.infer`;
and a language model's session (`LanguageSession`), which is a Session that generates text a
token at a time instead of running tensors (decision 036)."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from edged.model.config import LanguageConfig
from edged.model.tensor import TensorSpec, fixed_batch


@dataclass(frozen=True)
class ShapeRange:
    """The dims (without the batch dim) an input with dynamic dims may take: TensorRT builds
    for min..max and tunes for opt."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]


@dataclass(frozen=True)
class LoadSpec:
    """What a backend needs to load one version of one model."""

    name: str
    version: int
    path: Path  # the ONNX file to load (model.onnx or model.int8.onnx)
    inputs: tuple[TensorSpec, ...]  # first dim -1, or N for a graph whose batch is fixed
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int  # 0 = no batch dim
    precision: str = "fp32"  # fp32 | fp16 | int8
    # What the batcher will send, for engines built ahead of time (TensorRT profiles):
    opt_batch_size: int = 0  # the batch size to tune for; 0 = max_batch_size
    instances: int = 1  # execution contexts that may run at once
    shape_ranges: Mapping[str, ShapeRange] = field(default_factory=dict)
    llm: LanguageConfig | None = None  # a language model's context and threads (model.gguf)

    @property
    def label(self) -> str:
        return f"{self.name}:{self.version}"

    @property
    def fixed_batch(self) -> int | None:
        """N when the graph's batch dim is fixed: every batch it is sent has exactly N rows."""
        return fixed_batch(self.max_batch_size, self.inputs)


@dataclass(frozen=True)
class BackendOptions:
    """Machine-level knobs, merged from the daemon config and the model's overrides."""

    providers: tuple[str, ...] = ("tensorrt", "cuda", "cpu")
    intra_op_threads: int = 0  # 0 = one per core here; the loader times 1 against it first
    inter_op_threads: int = 1
    allow_spinning: bool = False
    graph_optimization: str = "all"
    cache_dir: Path = field(default_factory=lambda: Path("/var/cache/edged"))
    memory: str = "auto"  # auto | mapped | managed | pinned | host (edged.hardware.memory)
    workspace_mb: int = 1024  # TensorRT builder workspace (the backend and ORT's TensorRT EP)
    dla_core: int | None = None  # Jetson: build TensorRT engines for this DLA core
    dla_gpu_fallback: bool = True  # on a DLA: layers it cannot run go to the GPU
    gpu_mem_limit_mb: int | None = None  # ORT CUDA EP arena limit; None = no limit
    cudnn_conv_algo_search: str | None = None  # ORT CUDA EP: exhaustive | heuristic | default


@runtime_checkable
class Session(Protocol):
    """A loaded model. `infer` may be called from several worker threads at once and returns
    arrays the caller owns (a backend that reuses output buffers copies out)."""

    inputs: Sequence[TensorSpec]
    outputs: Sequence[TensorSpec]
    providers: list[str]  # what really runs, e.g. ["CPUExecutionProvider"]
    nbytes: int  # estimate charged to the cache budget

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Prompt:
    """A prompt as the model reads it: its text (a chat's made by the model's own template),
    its tokens, and the strings that end the answer (a chat template's end of turn)."""

    text: str
    tokens: tuple[int, ...]
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sampling:
    """How the next tokens are picked, and when the answer ends."""

    max_tokens: int
    temperature: float = 0.8  # 0 = greedy: always the likeliest token
    top_p: float = 0.95
    stop: tuple[str, ...] = ()  # the answer ends before the first of these
    # The answer is JSON: "{}" any JSON object, else this JSON schema (as text) constrains it
    # (llama.cpp's grammars); None: free text.
    json_schema: str | None = None
    seed: int | None = None  # the sampler's random seed when temperature > 0; None: random


@dataclass(frozen=True)
class Piece:
    """What one generated token added to the answer. `text` may be "" (a token that ends
    inside a UTF-8 character, or text held back while it may be the start of a stop string);
    the last piece has a `finish_reason`: "stop" (the model ended, or a stop string came) or
    "length" (max_tokens, or the context is full)."""

    text: str
    finish_reason: str | None = None


@runtime_checkable
class LanguageSession(Session, Protocol):
    """A loaded language model. `generate` yields one Piece per token, so a consumer that
    stops iterating (a client gone) stops it within one token; one generation at a time per
    session (the caller serialises: edged.inference.generation; a BatchedLanguageSession runs
    several through its slots). `infer` refuses: it takes no tensors."""

    context_length: int  # tokens one sequence holds, prompt and answer together

    def prompt(self, text: str) -> Prompt: ...

    def chat(self, messages: Sequence[Mapping[str, str]]) -> Prompt: ...

    def generate(self, prompt: Prompt, sampling: Sampling) -> Generator[Piece, None, None]: ...


@runtime_checkable
class BatchedLanguageSession(LanguageSession, Protocol):
    """A language session that generates several answers at once (continuous batching): the
    caller `admit`s a sequence into a free slot, calls `step` (one decode: a token for every
    answer under way, and the prompts that joined since), and `drop`s a sequence to free its
    slot (finished, or its client gone) before the next step. One caller thread at a time
    (edged.inference.generation's worker); `generate` runs one answer through the same slots."""

    sequences: int  # slots: answers generated at once

    def free_slots(self) -> int: ...

    def admit(self, prompt: Prompt, sampling: Sampling) -> int:
        """A slot for this answer; raises InvalidInput (a JSON schema it cannot follow) before
        taking one, and RuntimeError when none is free."""
        ...

    def step(self) -> list[tuple[int, Piece | Exception]]:
        """One decode; (slot, Piece) for each answer that got a token (one still reading a
        long prompt may get none). A Piece with a finish_reason ends its answer: drop it; so
        does an exception in place of a Piece (that answer failed alone). An exception raised
        fails every answer of the session."""
        ...

    def drop(self, slot: int) -> None:
        """Free `slot` (its KV cache and sampler); a slot already free is left alone."""
        ...


@runtime_checkable
class PausingLanguageSession(BatchedLanguageSession, Protocol):
    """A batching session that can take an answer out of its slot and put it back later, to
    go on where it was (a higher-priority request takes the slot meanwhile): what it had read
    and generated is read again, its sampler and text kept as they were."""

    def suspend(self, slot: int) -> object:
        """Free `slot`; what `resume` needs to go on (raises RuntimeError for a free slot)."""
        ...

    def resume(self, paused: object) -> int:
        """A free slot for a paused answer (RuntimeError when none is free); its next token
        comes once what it had is read again."""
        ...

    def forget(self, paused: object) -> None:
        """A paused answer that will not resume (its client went): free what it holds."""
        ...


class Backend(Protocol):
    name: str  # "tensorrt" | "onnxruntime"

    def unavailable_reason(self) -> str | None:
        """None when usable on this machine, else why not (one line)."""
        ...

    def load(self, spec: LoadSpec, options: BackendOptions) -> Session: ...

    def auto_precision(self, int8: Path | None, why: str) -> tuple[str, str] | None:
        """What `precision: auto` takes on this backend without timing anything, as (precision,
        reason): `int8` means the accepted INT8 variant `int8`, any other precision model.onnx.
        None: time FP32 against the INT8 variant on the real sessions and take the faster.
        `why` says why `int8` is what it is (None: no accepted variant)."""
        ...


class FallBack(Exception):
    """Raised by `Backend.load` when this backend cannot serve the model, but `fallback` can:
    the cache loads it there instead. `upgrade`, when set, completes once a load on this
    backend would succeed (an engine built in the background) or carries why it never will;
    the cache then swaps the model onto this backend."""

    def __init__(self, reason: str, *, fallback: str = "onnxruntime",
                 upgrade: Future[None] | None = None) -> None:
        super().__init__(reason)
        self.fallback = fallback
        self.upgrade = upgrade


class EngineBuilding(FallBack):
    """The engine for this model is being built in the background; `upgrade` completes when
    it is ready (or failed)."""

    def __init__(self, reason: str, upgrade: Future[None], *,
                 fallback: str = "onnxruntime") -> None:
        super().__init__(reason, fallback=fallback, upgrade=upgrade)
