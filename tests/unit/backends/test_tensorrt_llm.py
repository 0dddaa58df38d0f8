"""The TensorRT-LLM backend on a faithful double of its LLM API (tests/doubles): a version's
trtllm/ folder read by the repository, loaded through the warm cache with its KV cache bounded
and charged, and served by the generation queue as llama.cpp's batched models are: several
requests in flight at once, each answering what it answers alone, stop strings held back,
max_tokens, a JSON schema handed to its guided decoding, a request whose client went aborted
within a step, and the bad folders refused when the version is read."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from doubles import fake_tensorrt_llm
from doubles.fake_tensorrt_llm import write_model

from edged.backends import BatchedLanguageSession, register_backend
from edged.core.errors import InferenceFailed, InvalidInput, InvalidModel
from edged.inference.cache import ModelCache
from edged.inference.generation import Ask, Done, Generation, Generations, Started
from edged.model.repository import TRTLLM_DIR, ModelRepository

CONTEXT, SEQUENCES = 128, 3


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[fake_tensorrt_llm.LLM]:
    models = fake_tensorrt_llm.install(monkeypatch)
    register_backend("tensorrt_llm", "edged.backends.tensorrt_llm:TensorRTLLMBackend")
    return models


@pytest.fixture
def repo(tmp_path: Path) -> ModelRepository:
    write_model(tmp_path / "models" / "chat" / "1" / TRTLLM_DIR)
    (tmp_path / "models" / "chat" / "model.yaml").write_text(
        f"llm: {{context: {CONTEXT}, sequences: {SEQUENCES}, max_tokens: 6}}\n")
    return ModelRepository(tmp_path / "models")


@pytest.fixture
def cache(repo: ModelRepository, made: list[fake_tensorrt_llm.LLM]) -> Iterator[ModelCache]:
    cache = ModelCache(repo, budget_bytes=64 * 1024 * 1024)
    yield cache
    cache.close(timeout_s=5)


def answers(generations: Generations, asks: list[Ask]) -> list[tuple[str, Done | object]]:
    """Each ask's text and its last event, all submitted at once."""
    async def run() -> list[tuple[str, Done | object]]:
        loop = asyncio.get_running_loop()
        submitted = [generations.submit(ask, loop) for ask in asks]

        async def follow(generation: Generation) -> tuple[str, Done | object]:
            text = ""
            while True:
                event = await asyncio.wait_for(generation.next(), 30)
                if isinstance(event, Started):
                    continue
                if not hasattr(event, "text"):
                    return text, event
                text += event.text  # type: ignore[attr-defined]
        return list(await asyncio.gather(*(follow(g) for g in submitted)))
    return asyncio.run(run())


def test_repository_when_version_holds_trtllm_folder_reads_a_language_model(
        repo: ModelRepository) -> None:
    model = repo.resolve("chat")
    assert model.is_language and model.config.backend == "tensorrt_llm"
    assert model.model_path == model.dir / TRTLLM_DIR
    assert [t.name for t in model.inputs] == ["text_input"]


def test_repository_when_trtllm_config_cannot_tell_sizes_is_invalid_model(
        tmp_path: Path) -> None:
    folder = write_model(tmp_path / "models" / "bad" / "1" / TRTLLM_DIR)
    (folder / "config.json").write_text(json.dumps({"pretrained_config": {"dtype": "float16"}}))
    with pytest.raises(InvalidModel, match="cannot tell the KV cache's size"):
        ModelRepository(tmp_path / "models").resolve("bad")
    (folder / "config.json").write_text("{not json")
    with pytest.raises(InvalidModel, match=r"no readable config\.json"):
        ModelRepository(tmp_path / "models").resolve("bad")


def test_repository_when_model_yaml_names_another_backend_is_invalid_model(
        tmp_path: Path) -> None:
    write_model(tmp_path / "models" / "chat" / "1" / TRTLLM_DIR)
    (tmp_path / "models" / "chat" / "model.yaml").write_text("backend: onnxruntime\n")
    with pytest.raises(InvalidModel, match="runs on tensorrt_llm"):
        ModelRepository(tmp_path / "models").resolve("chat")


def test_load_when_trtllm_folder_bounds_and_charges_the_kv_cache_of_every_sequence(
        cache: ModelCache, made: list[fake_tensorrt_llm.LLM]) -> None:
    with cache.acquire("chat") as lease:
        session = lease.session
        assert isinstance(session, BatchedLanguageSession)
        assert session.sequences == SEQUENCES and session.context_length == CONTEXT
        per_token = 2 * 4 * 2 * (64 // 4) * 2  # keys and values, 4 layers, 2 kv heads, fp16
        assert session.nbytes == 4096 + per_token * CONTEXT * SEQUENCES
    assert [row.backend for row in cache.status() if row.name == "chat"] == ["tensorrt_llm"]
    [llm] = made
    assert llm.args["max_batch_size"] == SEQUENCES and llm.args["max_seq_len"] == CONTEXT
    assert llm.args["kv_cache_config"].max_tokens == CONTEXT * SEQUENCES
    assert llm.requests and llm.requests[0].finished  # warmed by one token before READY


def test_generations_when_asked_at_once_run_in_flight_and_answer_as_alone(
        cache: ModelCache, made: list[fake_tensorrt_llm.LLM]) -> None:
    generations = Generations(cache)
    try:
        asks = [Ask("chat", prompt=f"{i} {i + 1}", max_tokens=4, temperature=0)
                for i in range(0, 40, 10)]
        alone = [answers(generations, [ask])[0] for ask in asks]
        together = answers(generations, asks)
    finally:
        generations.close()
    assert together == alone
    assert [text for text, _ in alone][:2] == [" 2 3 4 5", " 12 13 14 15"]
    assert all(isinstance(done, Done) and done.finish_reason == "length"
               and done.completion_tokens == 4 for _, done in together)
    assert made[0].largest_step >= 2  # the executor batched several in flight


def test_generations_when_stop_string_comes_end_before_it_and_hold_back_its_start(
        cache: ModelCache) -> None:
    generations = Generations(cache)
    try:
        [(text, done)] = answers(generations, [Ask("chat", prompt="1 2", stop=(" 5",),
                                                   max_tokens=10, temperature=0)])
    finally:
        generations.close()
    assert text == " 3 4" and isinstance(done, Done) and done.finish_reason == "stop"


def test_generations_when_seeded_sampling_repeats_and_json_schema_reaches_guided_decoding(
        cache: ModelCache, made: list[fake_tensorrt_llm.LLM]) -> None:
    generations = Generations(cache)
    schema = json.dumps({"type": "object", "properties": {"colour": {"type": "string"}}})
    try:
        first, again = answers(generations, [Ask("chat", prompt="a", temperature=0.9,
                                                  seed=5, max_tokens=5)] * 2)
        answers(generations, [Ask("chat", prompt="a", json_schema=schema, temperature=0)])
        [(_, refused)] = answers(generations, [Ask("chat", prompt="a", json_schema="{oops")])
    finally:
        generations.close()
    assert first == again
    assert isinstance(refused, InvalidInput) and "not JSON" in str(refused)
    guided = made[0].requests[-1].sampling_params.guided_decoding
    assert guided is not None and guided.json == json.loads(schema)


def test_generations_when_client_goes_aborts_its_request_within_a_step(
        cache: ModelCache, made: list[fake_tensorrt_llm.LLM]) -> None:
    generations = Generations(cache)

    async def run() -> Done | object:
        generation = generations.submit(Ask("chat", prompt="1", max_tokens=100,
                                            temperature=0), asyncio.get_running_loop())
        assert isinstance(await asyncio.wait_for(generation.next(), 30), Started)
        await asyncio.wait_for(generation.next(), 30)  # a piece
        generation.cancel()
        while not isinstance(event := await asyncio.wait_for(generation.next(), 30), Done):
            pass
        return event

    try:
        done = asyncio.run(run())
        assert isinstance(done, Done) and done.finish_reason == "cancelled"
        assert generations.statistics()["chat"]["cancelled"] == 1
    finally:
        generations.close()
    assert made[0].requests[-1]._aborted


def test_chat_when_messages_given_uses_the_tokenizers_template(cache: ModelCache) -> None:
    with cache.acquire("chat") as lease:
        session = lease.session
        assert isinstance(session, BatchedLanguageSession)
        prompt = session.chat([{"role": "user", "content": "hi"}])
        assert prompt.text == "user: hi assistant:" and len(prompt.tokens) == 3
        with pytest.raises(InvalidInput, match=f"the context holds {CONTEXT}"):
            session.prompt("word " * CONTEXT)


def test_generations_when_model_swapped_under_way_step_both_versions_until_the_old_ends(
        tmp_path: Path, made: list[fake_tensorrt_llm.LLM]) -> None:
    for version in (1, 2):
        write_model(tmp_path / "models" / "chat" / str(version) / TRTLLM_DIR)
    (tmp_path / "models" / "chat" / "model.yaml").write_text(
        "llm: {context: 4096, sequences: 2}\nversion_policy: {all: true}\n")
    (tmp_path / "models" / "chat" / "active").write_text("1\n")
    cache = ModelCache(ModelRepository(tmp_path / "models"), budget_bytes=1 << 30)
    generations = Generations(cache)

    async def run() -> tuple[list[object], list[object]]:
        loop = asyncio.get_running_loop()
        old = generations.submit(Ask("chat", prompt="1", max_tokens=4000, temperature=0), loop)
        old_events = [await asyncio.wait_for(old.next(), 30)]
        swapping = loop.run_in_executor(None, cache.swap, "chat", 2)  # drains version 1
        while cache.default_version("chat") != 2:
            old_events.append(await asyncio.wait_for(old.next(), 30))
        new = generations.submit(Ask("chat", prompt="5", max_tokens=3, temperature=0), loop)
        new_events = []
        while not isinstance(event := await asyncio.wait_for(new.next(), 30), Done):
            new_events.append(event)
        new_events.append(event)
        assert not swapping.done()  # the old answer still holds version 1
        assert generations.statistics()["chat"]["generating"] == 1
        old.cancel()
        while not isinstance(event := await asyncio.wait_for(old.next(), 30), Done):
            old_events.append(event)
        old_events.append(event)
        await asyncio.wait_for(swapping, 30)
        return old_events, new_events

    try:
        old_events, new_events = asyncio.run(run())
    finally:
        generations.close()
        cache.close(timeout_s=5)
    assert isinstance(old_events[0], Started) and old_events[0].version == 1
    assert isinstance(new_events[0], Started) and new_events[0].version == 2
    assert "".join(getattr(e, "text", "") for e in new_events) == " 6 7 8"
    assert isinstance(old_events[-1], Done) and old_events[-1].finish_reason == "cancelled"
    assert len(made) == 2  # one LLM per version, both stepped by the one worker


def test_generations_when_one_request_fails_the_others_in_flight_answer(
        cache: ModelCache) -> None:
    generations = Generations(cache)
    try:
        got = answers(generations, [Ask("chat", prompt="1 2", max_tokens=3, temperature=0),
                                    Ask("chat", prompt="boom", max_tokens=3, temperature=0),
                                    Ask("chat", prompt="7", max_tokens=3, temperature=0)])
        stats = generations.statistics()["chat"]
    finally:
        generations.close()
    assert [text for text, _ in got] == [" 3 4 5", "", " 8 9 10"]
    failed = got[1][1]
    assert isinstance(failed, InferenceFailed) and "CUDA out of memory" in str(failed)
    assert stats["failed"] == 1 and stats["completed"] == 2


def test_session_when_a_dropped_requests_late_outputs_come_after_its_slot_was_reused_gives_them_to_nobody(  # noqa: E501
        cache: ModelCache) -> None:
    """A cancelled request's reader brings its last outputs (the executor's `cancelled`)
    after the abort; the request admitted into its freed slot meanwhile answers as alone."""
    from edged.backends.base import Piece, Sampling

    def run(session: BatchedLanguageSession, slot: int) -> tuple[str, str | None]:
        text = ""
        for _ in range(200):
            for at, piece in session.step():
                assert at == slot, "an output of another request"
                assert isinstance(piece, Piece)
                text += piece.text
                if piece.finish_reason is not None:
                    return text, piece.finish_reason
        raise AssertionError("no end")

    with cache.acquire("chat") as lease:
        session = lease.session
        assert isinstance(session, BatchedLanguageSession)
        greedy = Sampling(max_tokens=6, temperature=0)
        alone = run(session, session.admit(session.prompt("2"), greedy))
        first = session.admit(session.prompt("1"), Sampling(max_tokens=100, temperature=0))
        while not session.step():  # it has begun: its reader is streaming
            pass
        session.drop(first)
        second = session.admit(session.prompt("2"), greedy)
        assert second == first  # the freed slot, taken before the dropped one's end came
        assert run(session, second) == alone
