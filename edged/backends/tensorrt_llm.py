"""The TensorRT-LLM backend: a language model on an NVIDIA GPU through TensorRT-LLM's LLM API
(`tensorrt_llm.LLM`, `SamplingParams`, `generate_async(..., streaming=True)`), for the same
contract as llama.cpp's (a `BatchedLanguageSession`): TensorRT-LLM batches in flight itself, so
a slot here is a request handed to its executor, a step waits for the tokens that came since,
and a dropped slot aborts its request. A version's `trtllm/` folder is what `LLM(model=...)`
loads: an engine folder built by `trtllm-build` (config.json, rank0.engine) or a Hugging Face
checkpoint for its PyTorch backend, with the tokenizer's files beside it (docs/language-models.md).
The KV cache is bounded to `llm.sequences` x `llm.context` tokens (KvCacheConfig.max_tokens), so
that the cache budget charges what the GPU holds. Written against TensorRT-LLM 1.x's documented
LLM API; held against a faithful double (tests/doubles/fake_tensorrt_llm.py), and its names
against the real package where it can be installed (tests/gpu_api); no GPU here."""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edged.backends.answer import one_answer
from edged.backends.base import BackendOptions, LoadSpec, Piece, Prompt, Sampling
from edged.core.errors import InferenceFailed, InvalidInput, ModelLoadError
from edged.model.config import LanguageConfig
from edged.model.tensor import TensorSpec
from edged.model.trtllm import kv_bytes_per_token

logger = logging.getLogger(__name__)

STEP_WAIT_S = 0.05  # a step waits this long for tokens, so the worker sees cancellations
# TensorRT-LLM's finish reasons that edged's answers know; "timeout" and "cancelled" end one
# too ("length" for a timeout: the answer was cut, not finished).
FINISH = {"stop": "stop", "length": "length", "timeout": "length", "cancelled": "stop"}


class TensorRTLLMBackend:
    name = "tensorrt_llm"

    def unavailable_reason(self) -> str | None:
        try:
            import tensorrt_llm  # noqa: F401
        except ImportError as exc:
            return f"TensorRT-LLM is not installed (pip install tensorrt-llm, on a GPU): {exc}"
        except Exception as exc:  # its import initialises CUDA: no GPU, no driver
            return f"TensorRT-LLM cannot start here: {exc}"
        return None

    def load(self, spec: LoadSpec, options: BackendOptions) -> TensorRTLLMSession:
        return TensorRTLLMSession(spec, spec.llm or LanguageConfig())

    def auto_precision(self, int8: Any, why: str) -> tuple[str, str] | None:
        return "fp16", "a TensorRT-LLM engine or checkpoint carries its own precision"


@dataclass
class _Request:
    result: Any  # TensorRT-LLM's RequestOutput, streaming
    reader: threading.Thread | None
    stops: tuple[str, ...]
    limit: int
    count: int = 0
    held: str = ""  # text that may be the start of a stop string
    ended: bool = False


class TensorRTLLMSession:
    """One model on TensorRT-LLM's executor, `config.sequences` requests in flight."""

    inputs: Sequence[TensorSpec] = ()
    outputs: Sequence[TensorSpec] = ()

    def __init__(self, spec: LoadSpec, config: LanguageConfig) -> None:
        from tensorrt_llm import LLM
        from tensorrt_llm.llmapi import KvCacheConfig

        folder = spec.path
        self.label = spec.label
        self.sequences = config.sequences
        self.context_length = config.context
        per_token = kv_bytes_per_token(folder)
        weights = sum(p.stat().st_size for p in folder.iterdir()
                      if p.suffix in (".engine", ".safetensors", ".bin"))
        self.nbytes = weights + per_token * config.context * config.sequences
        try:
            self._llm = LLM(model=str(folder), max_batch_size=config.sequences,
                            max_seq_len=config.context,
                            max_num_tokens=max(config.batch_size, config.sequences),
                            kv_cache_config=KvCacheConfig(
                                max_tokens=config.context * config.sequences),
                            guided_decoding_backend="xgrammar")
        except Exception as exc:  # its own error types: a bad engine, no GPU memory
            raise ModelLoadError(f"{spec.label}: TensorRT-LLM cannot load {folder}: {exc}"
                                 ) from exc
        self._tokenizer = self._llm.tokenizer
        self.providers = [f"TensorRT-LLM ({config.sequences} sequences in flight)"]
        self._slots: dict[int, _Request] = {}
        # Each event names its request, not its slot: a dropped request's reader may still
        # bring outputs after a new request took the slot (the abort lands later).
        self._events: queue.Queue[tuple[_Request, Any]] = queue.Queue()

    # -- prompts ------------------------------------------------------------------------------
    def prompt(self, text: str) -> Prompt:
        return Prompt(text, self._tokens(self._tokenizer.encode(text)))

    def chat(self, messages: Sequence[Mapping[str, str]]) -> Prompt:
        text = self._tokenizer.apply_chat_template([dict(m) for m in messages], tokenize=False,
                                                   add_generation_prompt=True)
        # The template writes its special tokens; the answer ends at the tokenizer's end of
        # sequence (SamplingParams.end_id, set by the LLM from its tokenizer).
        return Prompt(text, self._tokens(self._tokenizer.encode(text, add_special_tokens=False)))

    def _tokens(self, tokens: Sequence[int]) -> tuple[int, ...]:
        if len(tokens) >= self.context_length:
            raise InvalidInput(f"{self.label}: the prompt is {len(tokens)} tokens; the context "
                               f"holds {self.context_length} (prompt and answer together, "
                               "llm.context)")
        return tuple(tokens)

    def _sampling_params(self, prompt: Prompt, sampling: Sampling) -> Any:
        from tensorrt_llm import SamplingParams
        from tensorrt_llm.llmapi import GuidedDecodingParams

        guide = None
        if sampling.json_schema == "{}":
            guide = GuidedDecodingParams(json_object=True)
        elif sampling.json_schema is not None:
            try:
                guide = GuidedDecodingParams(json=json.loads(sampling.json_schema))
            except ValueError as exc:
                raise InvalidInput(f"{self.label}: the JSON schema is not JSON: {exc}") from exc
        room = self.context_length - len(prompt.tokens)
        # Stop strings are edged's (held back as llama.cpp's are), not TensorRT-LLM's: one
        # rule for every backend.
        return SamplingParams(max_tokens=min(sampling.max_tokens, room),
                              temperature=sampling.temperature, top_p=sampling.top_p,
                              seed=sampling.seed, guided_decoding=guide, detokenize=True)

    # -- slots --------------------------------------------------------------------------------
    def free_slots(self) -> int:
        return self.sequences - len(self._slots)

    def admit(self, prompt: Prompt, sampling: Sampling) -> int:
        params = self._sampling_params(prompt, sampling)
        slot = next(i for i in range(self.sequences + 1) if i not in self._slots)
        if slot >= self.sequences:
            raise RuntimeError(f"{self.label}: all {self.sequences} sequences are busy")
        try:
            result = self._llm.generate_async(list(prompt.tokens), sampling_params=params,
                                              streaming=True)
        except ValueError as exc:  # refused at once: its guide, its length
            raise InvalidInput(f"{self.label}: {exc}") from exc
        request = _Request(result, None, tuple(dict.fromkeys(prompt.stop + sampling.stop)),
                           params.max_tokens)
        request.reader = threading.Thread(target=self._read, args=(request,),
                                          name=f"edged-trtllm-{self.label}-{slot}",
                                          daemon=True)
        self._slots[slot] = request
        request.reader.start()
        return slot

    def _read(self, request: _Request) -> None:
        """The request's streamed outputs (RequestOutput iterates as they come) onto the
        session's queue, then its end."""
        try:
            for output in request.result:
                completion = output.outputs[0]
                self._events.put((request, (list(completion.token_ids_diff),
                                            completion.text_diff, completion.finish_reason)))
        except Exception as exc:  # the executor's error: this request ends with it
            self._events.put((request, exc))

    def drop(self, slot: int) -> None:
        request = self._slots.pop(slot, None)
        if request is not None and not request.ended:
            try:
                request.result.abort()
            except Exception:  # already finished
                logger.debug("%s: aborting slot %d", self.label, slot, exc_info=True)

    def step(self) -> list[tuple[int, Piece | Exception]]:
        """The tokens that came since the last step (waiting up to STEP_WAIT_S for one), as
        one Piece per token: the text with the first, "" for the rest."""
        out: list[tuple[int, Piece | Exception]] = []
        try:
            events = [self._events.get(timeout=STEP_WAIT_S)]
        except queue.Empty:
            return out
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                break
        slots = {id(request): slot for slot, request in self._slots.items()}
        for request, event in events:
            slot = slots.get(id(request))
            if slot is None or request.ended:
                continue  # dropped: what its reader still brought is nobody's, even where
                # a new request took its slot since
            if isinstance(event, Exception):  # this request failed; the others go on
                request.ended = True
                out.append((slot, InferenceFailed(f"{self.label}: TensorRT-LLM failed: "
                                                  f"{event}")))
                continue
            out += [(slot, piece) for piece in self._pieces(request, *event)]
        return out

    def _pieces(self, request: _Request, tokens: list[int], text: str, finish: str | None
                ) -> list[Piece]:
        """A streamed update as Pieces: stop strings found and held back as llama.cpp's are."""
        from edged.backends.answer import first_stop, stop_prefix

        held = request.held + text
        cut = first_stop(held, request.stops)
        count = max(1, len(tokens))
        request.count += count
        blanks = [Piece("")] * (count - 1)
        if cut is not None:
            request.ended = True
            return [Piece(held[:cut], "stop")]
        if finish is not None or request.count >= request.limit:
            request.ended = True
            reason = "length" if finish is None else FINISH.get(finish, "stop")
            return [*blanks, Piece(held, reason)] if blanks else [Piece(held, reason)]
        keep = stop_prefix(held, request.stops)
        request.held = held[len(held) - keep:]
        return [Piece(held[:len(held) - keep]), *blanks]

    # -- one answer through the slots ----------------------------------------------------------
    def generate(self, prompt: Prompt, sampling: Sampling) -> Generator[Piece, None, None]:
        self._sampling_params(prompt, sampling)  # a schema it cannot take: refused here
        return one_answer(self, prompt, sampling)

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise InvalidInput(f"{self.label} is a language model: it generates text, it takes "
                           "no tensors")

    def close(self) -> None:
        for slot in list(self._slots):
            self.drop(slot)
        self._llm.shutdown()
