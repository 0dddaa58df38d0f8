"""The llama.cpp backend on the real SmolLM2 GGUF (from its wheel): loaded through the warm
cache under its byte budget and warmed, a token per piece, stop strings, max_tokens and a full
context, the prompt too long for the context, and a corrupt file that fails its load while the
version before it serves on; each on both paths, several sequences batched (`smol`, the
default `llm.sequences`) and one at a time (`smol1`, `sequences: 1`). The model's answers are
poor: only their shape is checked."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edged.backends import (
    BatchedLanguageSession,
    LanguageSession,
    Piece,
    Sampling,
    choose_backend,
)
from edged.backends.llamacpp import _stop_prefix
from edged.core.errors import InvalidInput, ModelLoadError
from edged.inference.cache import ModelCache
from edged.model.gguf import read_header
from edged.model.repository import GGUF_FILE, ModelRepository
from tools.real_models import LANGUAGE_MODEL

CONTEXT = 256  # llama.cpp pads a context to a multiple of 256


@pytest.fixture(scope="module")
def gguf(real_models: Path) -> Path:
    return real_models / LANGUAGE_MODEL


@pytest.fixture(scope="module")
def repo(gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> ModelRepository:
    root = tmp_path_factory.mktemp("llm") / "models"
    for version in (1, 2):
        (root / "smol" / str(version)).mkdir(parents=True)
    (root / "smol" / "1" / GGUF_FILE).symlink_to(gguf)
    # Version 2 is the same file cut short in its tensors: its header reads, its load fails.
    with gguf.open("rb") as src, (root / "smol" / "2" / GGUF_FILE).open("wb") as dst:
        dst.write(src.read(gguf.stat().st_size // 2))
    (root / "smol" / "model.yaml").write_text(
        f"llm: {{context: {CONTEXT}, threads: 1, max_tokens: 8}}\n"
        "version_policy: {all: true}\n")
    (root / "smol" / "active").write_text("1\n")
    (root / "smol1" / "1").mkdir(parents=True)
    (root / "smol1" / "1" / GGUF_FILE).symlink_to(gguf)
    (root / "smol1" / "model.yaml").write_text(
        f"llm: {{context: {CONTEXT}, threads: 1, max_tokens: 8, sequences: 1}}\n")
    return ModelRepository(root)


@pytest.fixture(scope="module")
def cache(repo: ModelRepository) -> Iterator[ModelCache]:
    cache = ModelCache(repo, budget_bytes=512 * 1024 * 1024)
    cache.load("smol")
    cache.load("smol1")
    yield cache
    cache.close(timeout_s=10)


@pytest.fixture(params=["smol", "smol1"])
def session(cache: ModelCache, request: pytest.FixtureRequest) -> Iterator[LanguageSession]:
    with cache.acquire(request.param) as lease:
        assert isinstance(lease.session, LanguageSession)
        yield lease.session


def run(session: LanguageSession, text: str, sampling: Sampling) -> list[Piece]:
    return list(session.generate(session.prompt(text), sampling))


def test_choose_backend_when_auto_never_picks_llamacpp_for_onnx() -> None:
    assert choose_backend("auto").name != "llamacpp"
    assert choose_backend("llamacpp").unavailable_reason() is None


@pytest.mark.parametrize(("name", "sequences", "providers"), [
    ("smol", 4, "llama.cpp (1 threads, CPU, 4 sequences)"),
    ("smol1", 1, "llama.cpp (1 threads, CPU)")])
def test_cache_when_gguf_loaded_charges_weights_and_kv_cache_of_every_sequence(
        cache: ModelCache, gguf: Path, name: str, sequences: int, providers: str) -> None:
    status = {row.version: row for row in cache.status() if row.name == name}
    kv = read_header(gguf).kv_cache_bytes(CONTEXT) * sequences
    with cache.acquire(name) as lease:
        assert lease.session.nbytes == gguf.stat().st_size + kv
        assert lease.session.providers == [providers]
        assert lease.model.version == 1
        assert isinstance(lease.session, BatchedLanguageSession) == (sequences > 1)
    assert status[1].state.value == "READY" and status[1].backend == "llamacpp"
    assert status[1].nbytes == gguf.stat().st_size + kv


def test_generate_when_max_tokens_reached_ends_with_length(session: LanguageSession) -> None:
    pieces = run(session, "1 2 3 4 5 6 7 8 9 10", Sampling(max_tokens=5, temperature=0))
    assert len(pieces) == 5  # one piece per token
    assert [p.finish_reason for p in pieces] == [None] * 4 + ["length"]
    assert "".join(p.text for p in pieces).strip().startswith("11")


def test_generate_when_greedy_gives_the_same_text_twice(session: LanguageSession) -> None:
    sampling = Sampling(max_tokens=6, temperature=0)
    first = "".join(p.text for p in run(session, "The capital of France is", sampling))
    assert first == "".join(p.text for p in run(session, "The capital of France is", sampling))


def test_generate_when_the_same_prompt_comes_again_answers_it_the_same(
        session: LanguageSession) -> None:
    """llama-cpp-python would re-read only the last token of a prompt it read before, by other
    kernels than a prompt's: this prompt's greedy answer then changed at its fourth word."""
    text = "Once upon a time, in a town by the sea, there lived"
    first = run(session, text, Sampling(24, 0.0))
    assert run(session, text, Sampling(24, 0.0)) == first
    run(session, text + " a", Sampling(2, 0.0))  # a longer prompt sharing its start, between
    assert run(session, text, Sampling(24, 0.0)) == first


def test_generate_when_stop_string_comes_ends_before_it(session: LanguageSession) -> None:
    pieces = run(session, "1, 2, 3, 4, 5,", Sampling(max_tokens=8, temperature=0, stop=(",",)))
    text = "".join(p.text for p in pieces)
    assert pieces[-1].finish_reason == "stop"
    assert "," not in text and text.strip() == "6"


def test_generate_when_context_fills_ends_with_length(session: LanguageSession) -> None:
    prompt = session.prompt("1 2 3 4 5 6 7 8 9 10 " * 11)
    room = CONTEXT - len(prompt.tokens)
    pieces = list(session.generate(prompt, Sampling(max_tokens=1000, temperature=0)))
    assert len(pieces) <= room and pieces[-1].finish_reason in ("length", "stop")


def test_generate_when_closed_stops_before_the_next_token(session: LanguageSession) -> None:
    pieces = session.generate(session.prompt("1 2 3 4 5"), Sampling(64, 0.0))
    next(pieces)
    pieces.close()
    again = run(session, "1 2 3 4 5", Sampling(2, 0.0))  # the context is free again
    assert len(again) == 2


def test_chat_when_messages_given_uses_the_models_template(session: LanguageSession) -> None:
    prompt = session.chat([{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hi"}])
    assert "<|im_start|>user\nHi<|im_end|>" in prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n")
    assert "<|im_end|>" in prompt.stop
    pieces = list(session.generate(prompt, Sampling(8, 0.0)))
    assert pieces[-1].finish_reason in ("stop", "length")
    assert "<|im_end|>" not in "".join(p.text for p in pieces)


def test_prompt_when_longer_than_context_names_the_limits(session: LanguageSession) -> None:
    with pytest.raises(InvalidInput, match=rf"the prompt is \d+ tokens; the context holds "
                                           rf"{CONTEXT}"):
        session.prompt("word " * 400)


def test_infer_when_asked_refuses_tensors(session: LanguageSession) -> None:
    with pytest.raises(InvalidInput, match="is a language model"):
        session.infer({"text_input": np.array([b"hi"], dtype=object)})


def test_cache_when_new_gguf_is_corrupt_fails_its_load_and_old_serves(
        cache: ModelCache) -> None:
    with pytest.raises(ModelLoadError, match=r"smol:2: llama\.cpp cannot load"):
        cache.load("smol", 2)
    with cache.acquire("smol") as lease:
        assert lease.model.version == 1
        session = lease.session
        assert isinstance(session, LanguageSession)
        assert len(run(session, "Hello", Sampling(2, 0.0))) == 2


def test_stop_prefix_when_text_ends_with_a_stops_start_holds_it_back() -> None:
    assert _stop_prefix("hello <|im", ("<|im_end|>",)) == 4
    assert _stop_prefix("hello", ("<|im_end|>",)) == 0
    assert _stop_prefix("ab", ("bc", "abc")) == 2

