"""Several sequences at once on llama.cpp (`llm.sequences` > 1) against one at a time (the
same GGUF with `sequences: 1`, llama-cpp-python's own Llama.generate): speed never buys a
different answer. Greedy and seeded answers of several prompts (completions and chats, stop
strings, max_tokens, a JSON schema) generated together, joining at different steps, in slots
freed by others, with prompts read in chunks beside answers under way, are the one-at-a-time
answers piece for piece. And the slots: taken and freed, refused when full, a bad schema
refused before one is taken."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from edged.backends import (
    BackendOptions,
    BatchedLanguageSession,
    LoadSpec,
    PausingLanguageSession,
    Piece,
    Prompt,
    Sampling,
)
from edged.backends.llamacpp import LlamaCppBackend, LlamaSession
from edged.core.errors import InvalidInput
from edged.model.config import LanguageConfig
from tools.real_models import LANGUAGE_MODEL

CONTEXT = 256
PROMPTS = ["1 2 3 4 5 6 7 8 9 10", "The capital of France is", "def fib(n):",
           "Once upon a time, in a town by the sea, there lived",
           "A shopping list: eggs, milk,", "Q: What colour is the sky?\nA:"]
CHATS = [[{"role": "user", "content": "Describe a red car in one sentence."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
SCHEMA = json.dumps({"type": "object", "properties": {"colour": {"type": "string"}},
                     "required": ["colour"]})


def load(gguf: Path, sequences: int, batch_size: int = 512) -> object:
    spec = LoadSpec("smol", 1, gguf, (), (), 0, llm=LanguageConfig(
        context=CONTEXT, threads=1, sequences=sequences, batch_size=batch_size))
    return LlamaCppBackend().load(spec, BackendOptions())


@pytest.fixture(scope="module")
def one(real_models: Path) -> Iterator[LlamaSession]:
    session = load(real_models / LANGUAGE_MODEL, 1)
    assert isinstance(session, LlamaSession)
    yield session
    session.close()


@pytest.fixture(scope="module")
def many(real_models: Path) -> Iterator[BatchedLanguageSession]:
    session = load(real_models / LANGUAGE_MODEL, 4)
    assert isinstance(session, BatchedLanguageSession)
    yield session
    session.close()


def alone(session: LlamaSession, prompt: Prompt, sampling: Sampling) -> list[Piece]:
    return list(session.generate(prompt, sampling))


def together(session: BatchedLanguageSession, asks: list[tuple[Prompt, Sampling, int]]
             ) -> list[list[Piece]]:
    """Each ask admitted at its step (or as soon as a slot frees after it), all stepped
    together until every answer ends; the pieces of each."""
    got: list[list[Piece]] = [[] for _ in asks]
    waiting = list(range(len(asks)))
    slots: dict[int, int] = {}
    step = 0
    while waiting or slots:
        while waiting and asks[waiting[0]][2] <= step and session.free_slots():
            i = waiting.pop(0)
            slots[session.admit(asks[i][0], asks[i][1])] = i
        for slot, piece in session.step():
            got[slots[slot]].append(piece)
            if piece.finish_reason is not None:
                session.drop(slot)
                del slots[slot]
        step += 1
        assert step < 2000, "the answers never ended"
    assert session.free_slots() == session.sequences
    return got


def asks_of(session: LlamaSession | BatchedLanguageSession, seed: int
            ) -> list[tuple[Prompt, Sampling]]:
    rng = random.Random(seed)
    asks = []
    for text in PROMPTS:
        stop = (rng.choice([",", ".", "\n", " 7"]),) if rng.random() < 0.5 else ()
        asks.append((session.prompt(text), Sampling(rng.randint(1, 24), 0.0, stop=stop)))
    asks += [(session.chat(chat), Sampling(rng.randint(8, 24), 0.0)) for chat in CHATS]
    asks.append((session.chat(CHATS[0]), Sampling(24, 0.0, json_schema=SCHEMA)))
    return asks


@pytest.mark.parametrize("seed", [1, 2])
def test_batched_when_greedy_answers_together_equal_one_at_a_time(
        one: LlamaSession, many: BatchedLanguageSession, seed: int) -> None:
    reference = [alone(one, prompt, sampling) for prompt, sampling in asks_of(one, seed)]
    joins = random.Random(seed).choices(range(6), k=len(reference))
    got = together(many, [(p, s, j) for (p, s), j in zip(asks_of(many, seed), joins, strict=True)])
    assert got == reference
    assert all(p.finish_reason for p in (answer[-1] for answer in got))


def test_batched_when_prompts_are_read_in_chunks_beside_answers_equals_one_at_a_time(
        one: LlamaSession, real_models: Path) -> None:
    chunked = load(real_models / LANGUAGE_MODEL, 3, batch_size=8)
    assert isinstance(chunked, BatchedLanguageSession)
    try:
        reference = [alone(one, prompt, sampling) for prompt, sampling in asks_of(one, 3)]
        got = together(chunked, [(p, s, i) for i, (p, s) in enumerate(asks_of(chunked, 3))])
    finally:
        chunked.close()
    assert got == reference


def test_batched_when_batch_size_is_below_sequences_decodes_every_answer(
        one: LlamaSession, real_models: Path) -> None:
    small = load(real_models / LANGUAGE_MODEL, 4, batch_size=2)
    assert isinstance(small, BatchedLanguageSession)
    try:
        asks = [(small.prompt(text), Sampling(6, 0.0)) for text in PROMPTS[:4]]
        got = together(small, [(p, s, 0) for p, s in asks])
    finally:
        small.close()
    assert got == [alone(one, one.prompt(text), Sampling(6, 0.0)) for text in PROMPTS[:4]]


def test_batched_when_seeded_sampling_equals_one_at_a_time(
        one: LlamaSession, many: BatchedLanguageSession) -> None:
    asks = [(PROMPTS[i], Sampling(16, 0.9, top_p=0.9, seed=seed)) for i, seed in
            ((3, 7), (5, 8), (1, 9), (4, 10))]
    reference = [alone(one, one.prompt(text), s) for text, s in asks]
    got = together(many, [(many.prompt(text), s, 0) for text, s in asks])
    assert got == reference


def test_batched_when_json_schema_given_answers_json_that_fits(
        many: BatchedLanguageSession) -> None:
    [answer] = together(many, [(many.chat(CHATS[0]), Sampling(48, 0.0, json_schema=SCHEMA),
                                0)])
    assert answer[-1].finish_reason == "stop"
    assert isinstance(json.loads("".join(p.text for p in answer))["colour"], str)


def test_admit_when_slots_are_full_refuses_and_a_dropped_slot_serves_the_next(
        one: LlamaSession, many: BatchedLanguageSession) -> None:
    sampling = Sampling(6, 0.0)
    held = [many.admit(many.prompt(PROMPTS[0]), sampling) for _ in range(many.sequences)]
    try:
        assert many.free_slots() == 0
        with pytest.raises(RuntimeError, match="all 4 sequences are busy"):
            many.admit(many.prompt(PROMPTS[1]), sampling)
        many.step()  # every slot holds KV cache now
        many.drop(held[2])
        assert many.free_slots() == 1
        reused = many.admit(many.prompt(PROMPTS[1]), sampling)
        assert reused == held[2]
        pieces: list[Piece] = []
        while not pieces or pieces[-1].finish_reason is None:
            pieces += [piece for slot, piece in many.step() if slot == reused]
        assert pieces == alone(one, one.prompt(PROMPTS[1]), sampling)  # none of the old KV
    finally:
        for slot in range(many.sequences):
            many.drop(slot)
    assert many.free_slots() == many.sequences


def test_admit_when_json_schema_cannot_be_followed_refuses_before_taking_a_slot(
        many: BatchedLanguageSession) -> None:
    with pytest.raises(InvalidInput, match="cannot be made a grammar"):
        many.admit(many.prompt("hi"), Sampling(4, 0.0, json_schema='{"type": "nonsense"}'))
    assert many.free_slots() == many.sequences


def test_generate_when_batched_session_runs_one_answer_through_its_slots(
        one: LlamaSession, many: BatchedLanguageSession) -> None:
    pieces = many.generate(many.prompt(PROMPTS[0]), Sampling(12, 0.0))
    assert many.free_slots() == many.sequences  # a slot is taken at the first piece
    first = next(pieces)
    assert many.free_slots() == many.sequences - 1
    pieces.close()  # the consumer stops: the slot is free again
    assert many.free_slots() == many.sequences
    assert first == alone(one, one.prompt(PROMPTS[0]), Sampling(12, 0.0))[0]


def test_context_when_batched_holds_context_tokens_per_sequence(
        many: BatchedLanguageSession) -> None:
    assert many.context_length == CONTEXT
    with pytest.raises(InvalidInput, match=rf"the context holds {CONTEXT}"):
        many.prompt("word " * 400)


def paused_midway(session: PausingLanguageSession, asks: list[tuple[Prompt, Sampling]],
                  pause_at: int, held_for: int) -> list[list[Piece]]:
    """Every ask admitted at once; at step `pause_at` every other answer under way is
    suspended, its slot lent to another prompt for `held_for` steps (then dropped), and
    resumed; all stepped until they end. The pieces of each ask."""
    got: list[list[Piece]] = [[] for _ in asks]
    slots = {session.admit(p, s): i for i, (p, s) in enumerate(asks)}
    paused: dict[int, object] = {}
    lent: list[int] = []
    step = 0
    while slots or paused:
        if step == pause_at:
            for slot, i in list(slots.items())[::2]:
                paused[i] = session.suspend(slot)
                del slots[slot]
                lent.append(session.admit(session.prompt(PROMPTS[2]), Sampling(64, 0.0)))
        if step == pause_at + held_for:
            for slot in lent:
                session.drop(slot)
            lent = []
            for i, state in paused.items():
                slots[session.resume(state)] = i
            paused = {}
        for slot, piece in session.step():
            if slot in slots:
                got[slots[slot]].append(piece)
                if piece.finish_reason is not None:
                    session.drop(slot)
                    del slots[slot]
        step += 1
        assert step < 2000, "the answers never ended"
    for slot in lent:
        session.drop(slot)
    assert session.free_slots() == session.sequences
    return got


@pytest.mark.parametrize(("pause_at", "held_for"), [(0, 3), (1, 1), (5, 4), (9, 2)])
def test_suspend_when_answers_resume_in_another_slot_they_equal_one_at_a_time(
        one: LlamaSession, many: BatchedLanguageSession, pause_at: int, held_for: int) -> None:
    assert isinstance(many, PausingLanguageSession)
    texts = [(PROMPTS[3], Sampling(20, 0.0)), (PROMPTS[0], Sampling(16, 0.0, stop=(" 7",))),
             (PROMPTS[5], Sampling(20, 0.9, top_p=0.9, seed=11)),
             (PROMPTS[1], Sampling(20, 0.7, seed=12))]
    reference = [alone(one, one.prompt(t), s) for t, s in texts]
    got = paused_midway(many, [(many.prompt(t), s) for t, s in texts], pause_at, held_for)
    assert got == reference


def test_suspend_when_prompt_is_half_read_or_json_schema_given_resumes_the_same(
        one: LlamaSession, real_models: Path) -> None:
    chunked = load(real_models / LANGUAGE_MODEL, 2, batch_size=8)
    assert isinstance(chunked, PausingLanguageSession)
    try:
        asks = [(CHATS[0], Sampling(32, 0.0, json_schema=SCHEMA)),
                (CHATS[1], Sampling(12, 0.8, seed=5))]
        reference = [alone(one, one.chat(c), s) for c, s in asks]
        got = paused_midway(chunked, [(chunked.chat(c), s) for c, s in asks], 1, 2)
    finally:
        chunked.close()
    assert got == reference


def test_suspend_when_slot_is_free_refuses_and_forget_frees_a_paused_answer(
        many: BatchedLanguageSession) -> None:
    assert isinstance(many, PausingLanguageSession)
    with pytest.raises(RuntimeError, match="holds no answer to pause"):
        many.suspend(0)
    slot = many.admit(many.prompt(PROMPTS[0]), Sampling(4, 0.7, seed=1))
    many.step()
    paused = many.suspend(slot)
    assert many.free_slots() == many.sequences
    many.forget(paused)
    many.forget(paused)  # twice is harmless
