"""Several answers at once on one llama.cpp model (continuous batching, `llm.sequences` > 1):
one context whose KV cache holds `llm.context` tokens for each of `sequences` slots (a stream
per sequence, llama.cpp's `kv_unified: false`), and a step that decodes, in one llama_decode,
the last token of every answer under way and as much of the newly admitted prompts as the
batch has room for (`llm.batch_size`). Each answer samples with its own sampler chain, built
as llama-cpp-python's `Llama.generate` builds its own (the same samplers in the same order,
its grammar included), and turns tokens into text as the one-sequence path does; a slot
dropped (its answer ended, its client gone) is free for the next prompt before the next step.
Written against llama-cpp-python 0.3.36's low-level bindings (llama_batch, llama_decode,
llama_memory_seq_rm, llama_sampler_sample) and its thin wrappers of them (`_internals`)."""

from __future__ import annotations

import logging
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from edged.backends.answer import AnswerText, one_answer
from edged.backends.base import LoadSpec, Piece, Prompt, Sampling
from edged.backends.llamacpp import MIN_P, REPEAT_LAST_N, TOP_K, TYPICAL_P, LlamaText
from edged.core.errors import InferenceFailed, ModelLoadError
from edged.model.config import LanguageConfig
from edged.model.gguf import read_header

logger = logging.getLogger(__name__)

ALL_LAYERS = 0x7FFFFFFF  # llama-cpp-python's n_gpu_layers for -1
# A resumed answer's own tokens, decoded again one at a time (as they were first), at most
# this many a step: each is a decode of its own, and the answers under way wait for them.
REPLAY_PER_STEP = 8


@dataclass
class _Slot:
    """One answer under way: the prompt tokens still to read, the token to decode next."""

    seq: int
    sampler: Any = None
    answer: AnswerText | None = None
    unread: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # its prompt and the tokens it sampled
    prompt_len: int = 0
    replay: list[int] = field(default_factory=list)  # its own tokens to decode again (resumed)
    pos: int = 0  # the position of the next token decoded
    next: int | None = None  # sampled, not yet decoded
    order: int = 0  # admission order: prompts are read first come, first served

    @property
    def busy(self) -> bool:
        return self.answer is not None


@dataclass
class Paused:
    """An answer out of its slot (suspend): the tokens to read again, its sampler (its seeded
    generator and grammar where they were) and its text (the stop strings held back)."""

    tokens: list[int]
    prompt_len: int
    sampler: Any
    answer: AnswerText


class LlamaBatchSession(LlamaText):
    """One GGUF model, one llama.cpp context, `config.sequences` answers at once."""

    def __init__(self, spec: LoadSpec, config: LanguageConfig) -> None:
        import llama_cpp
        from llama_cpp import _internals
        from llama_cpp._logger import set_verbose

        header = read_header(spec.path)
        self.label = spec.label
        self.sequences = config.sequences
        set_verbose(False)
        llama_cpp.llama_backend_init()  # idempotent; Llama() calls it once per process too
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = ALL_LAYERS if config.gpu_layers == -1 else \
            config.gpu_layers
        # As Llama() sets its context, so that one answer decodes as the one-sequence path's
        # would (flash attention off, the same batch and micro-batch); plus the slots.
        # Prompts are read in Llama()'s chunks; a decode of the answers' tokens holds one per
        # sequence, so the batch holds at least that many.
        self._chunk = min(config.batch_size, config.context)
        n_batch = max(self._chunk, config.sequences)
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = config.context * config.sequences
        params.n_batch = n_batch
        params.n_ubatch = min(n_batch, 512)
        params.n_seq_max = config.sequences
        params.kv_unified = False  # each sequence its own `context` tokens, never another's
        params.n_threads = config.threads
        params.n_threads_batch = config.batch_threads or config.threads
        params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        params.rope_scaling_type = llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
        params.yarn_attn_factor = 1.0  # Llama()'s default, where llama.cpp's is "unset"
        params.no_perf = False
        try:
            self._model = _internals.LlamaModel(path_model=str(spec.path), params=model_params,
                                                verbose=False)
            self._ctx = _internals.LlamaContext(model=self._model, params=params,
                                                verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:  # llama.cpp's "failed to load"
            raise ModelLoadError(f"{spec.label}: llama.cpp cannot load {spec.path}: {exc}"
                                 ) from exc
        self._llama = llama_cpp
        self._internals = _internals
        self._n_batch = llama_cpp.llama_n_batch(self._ctx.ctx)
        self.context_length = llama_cpp.llama_n_ctx_seq(self._ctx.ctx)
        self._batch = _internals.LlamaBatch(n_tokens=self._n_batch, embd=0, n_seq_max=1,
                                            verbose=False)
        self._slots = [_Slot(seq) for seq in range(config.sequences)]
        self._admitted = 0
        self.nbytes = spec.path.stat().st_size + config.sequences * header.kv_cache_bytes(
            self.context_length)
        self.providers = [f"llama.cpp ({config.threads} threads"
                          + (f", {config.gpu_layers} GPU layers" if config.gpu_layers
                             else ", CPU") + f", {config.sequences} sequences)"]
        self._start_text()

    # -- slots --------------------------------------------------------------------------------
    def free_slots(self) -> int:
        return sum(not slot.busy for slot in self._slots)

    def admit(self, prompt: Prompt, sampling: Sampling) -> int:
        grammar = self._grammar(sampling.json_schema)  # refused before a slot is taken
        slot = next((s for s in self._slots if not s.busy), None)
        if slot is None:
            raise RuntimeError(f"{self.label}: all {self.sequences} sequences are busy")
        self._llama.llama_memory_seq_rm(self._ctx.memory, slot.seq, -1, -1)
        answer = self._answer(prompt, sampling)
        self._admitted += 1
        slot.sampler = self._sampler(sampling, grammar)
        slot.answer, slot.unread, slot.pos, slot.next = answer, list(prompt.tokens), 0, None
        slot.tokens, slot.order = list(prompt.tokens), self._admitted
        slot.prompt_len, slot.replay = len(prompt.tokens), []
        return slot.seq

    def suspend(self, slot: int) -> Paused:
        """Free `slot`, keeping what its answer needs to go on: the tokens it read and
        sampled (the one sampled last not yet decoded), its sampler and its text."""
        held = self._slots[slot]
        if not held.busy:
            raise RuntimeError(f"{self.label}: sequence {slot} holds no answer to pause")
        assert held.answer is not None
        paused = Paused(held.tokens, held.prompt_len, held.sampler, held.answer)
        held.sampler = None  # the paused answer's now: drop() must not close it
        self.drop(slot)
        return paused

    def resume(self, paused: object) -> int:
        """A free slot for a paused answer: its prompt is read again as it was (in chunks,
        first come, first served), then the tokens it sampled are decoded again one at a time
        as they were first (REPLAY_PER_STEP a step; read in one chunk, their logits came out
        up to 0.5 apart, and a seeded answer took another word), and the logits after the
        last sample its next token with the sampler it had, as its step would have."""
        assert isinstance(paused, Paused)
        slot = next((s for s in self._slots if not s.busy), None)
        if slot is None:
            raise RuntimeError(f"{self.label}: all {self.sequences} sequences are busy")
        self._llama.llama_memory_seq_rm(self._ctx.memory, slot.seq, -1, -1)
        self._admitted += 1
        slot.sampler, slot.answer, slot.tokens = paused.sampler, paused.answer, paused.tokens
        slot.prompt_len = paused.prompt_len
        slot.unread, slot.replay = paused.tokens[:slot.prompt_len], paused.tokens[
            slot.prompt_len:]
        slot.pos, slot.next, slot.order = 0, None, self._admitted
        return slot.seq

    def forget(self, paused: object) -> None:
        assert isinstance(paused, Paused)
        if paused.sampler is not None:
            paused.sampler.close()
            paused.sampler = None

    def drop(self, slot: int) -> None:
        held = self._slots[slot]
        if not held.busy:
            return
        self._llama.llama_memory_seq_rm(self._ctx.memory, held.seq, -1, -1)
        if held.sampler is not None:
            held.sampler.close()
        held.sampler, held.answer, held.unread, held.next = None, None, [], None

    def _sampler(self, sampling: Sampling, grammar: Any) -> Any:
        """The chain Llama._init_sampler builds for these settings (no mirostat, no logits
        processors), with this answer's own seed."""
        sampler = self._internals.LlamaSampler()
        sampler.add_penalties(n_vocab=self._model.n_vocab(), penalty_last_n=REPEAT_LAST_N,
                              penalty_repeat=1.0, penalty_freq=0.0, penalty_present=0.0)
        if grammar is not None:
            sampler.add_grammar(self._model, grammar)
        if sampling.temperature == 0.0:
            sampler.add_greedy()
        else:
            sampler.add_top_k(TOP_K)
            sampler.add_typical(TYPICAL_P, 1)
            sampler.add_top_p(sampling.top_p, 1)
            sampler.add_min_p(MIN_P, 1)
            sampler.add_temp(sampling.temperature)
            sampler.add_dist(self._llama.LLAMA_DEFAULT_SEED if sampling.seed is None
                             else sampling.seed)
        return sampler

    # -- the step -----------------------------------------------------------------------------
    def step(self) -> list[tuple[int, Piece | Exception]]:
        """Prompts first: each admitted prompt's next chunk of `batch_size` tokens in a decode
        of its own (the chunks Llama.eval reads, so a prompt's KV cache is the one-sequence
        path's), first admitted first, up to `batch_size` prompt tokens a step; a prompt read to
        its end samples its first token. Then one decode of the token every other answer
        sampled last, and a token sampled for each of them."""
        out: list[tuple[int, Piece | Exception]] = []
        generating = [s for s in self._slots if s.busy and s.next is not None]
        budget = self._chunk
        for slot in sorted((s for s in self._slots if s.busy and s.unread),
                           key=lambda s: s.order):
            chunk = slot.unread[:self._chunk]
            if len(chunk) > budget:
                break
            budget -= len(chunk)
            slot.unread = slot.unread[len(chunk):]
            ends = not slot.unread and not slot.replay
            self._decode([(slot, token, ends and i == len(chunk) - 1)
                          for i, token in enumerate(chunk)])
            if ends:
                out.append(self._sample(slot, len(chunk) - 1))
        for slot in sorted((s for s in self._slots if s.busy and s.replay and not s.unread),
                           key=lambda s: s.order):
            for token in slot.replay[:REPLAY_PER_STEP]:
                slot.replay.pop(0)
                self._decode([(slot, token, not slot.replay)])
            if not slot.replay:
                out.append(self._sample(slot, 0))
        if generating:
            self._decode([(slot, slot.next, True) for slot in generating if slot.next
                          is not None])
            out += [self._sample(slot, i) for i, slot in enumerate(generating)]
        return out

    def _decode(self, tokens: list[tuple[_Slot, int, bool]]) -> None:
        batch = self._batch.batch
        for n, (slot, token, logits) in enumerate(tokens):
            batch.token[n], batch.pos[n] = token, slot.pos
            batch.seq_id[n][0], batch.n_seq_id[n], batch.logits[n] = slot.seq, 1, logits
            slot.pos += 1
        batch.n_tokens = len(tokens)
        code = self._llama.llama_decode(self._ctx.ctx, batch)
        if code != 0:  # 1: no room in the KV cache; < 0: an error (the context is unchanged)
            raise InferenceFailed(f"{self.label}: llama_decode returned {code}")

    def _sample(self, slot: _Slot, index: int) -> tuple[int, Piece]:
        """The next token from the logits of the last decode's `index`-th token."""
        token = self._llama.llama_sampler_sample(slot.sampler.sampler, self._ctx.ctx, index)
        assert slot.answer is not None
        piece = slot.answer.feed(token)
        slot.next = token if piece.finish_reason is None else None
        if slot.next is not None:
            slot.tokens.append(token)
        return slot.seq, piece

    # -- one answer through the slots (warm-up, and the LanguageSession contract) ---------------
    def generate(self, prompt: Prompt, sampling: Sampling) -> Generator[Piece, None, None]:
        self._grammar(sampling.json_schema)  # a schema it cannot follow: refused here
        return one_answer(self, prompt, sampling)

    def close(self) -> None:
        for slot in self._slots:
            self.drop(slot.seq)
        self._batch.close()
        self._ctx.close()
        self._model.close()
