"""On a machine with an NVIDIA GPU, TensorRT-LLM and a model folder for it (EDGED_TRTLLM_MODEL:
a trtllm-build engine folder, or a Hugging Face checkpoint, with its tokenizer's files): the
backend loads it with its KV cache bounded, answers several greedy prompts at once as it
answers each alone, and a request dropped under way ends. Skipped, with the reason,
everywhere else (TensorRT-LLM is not on the lent GPU hosts' PyPI mirror, nor any engine)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edged.backends import BatchedLanguageSession, LoadSpec, Piece, Sampling
from edged.backends.tensorrt_llm import TensorRTLLMBackend
from edged.model.config import LanguageConfig

PROMPTS = ["The capital of France is", "1, 2, 3, 4,", "Once upon a time"]


@pytest.mark.gpu
def test_tensorrt_llm_when_gpu_present_answers_together_as_alone() -> None:
    folder = os.environ.get("EDGED_TRTLLM_MODEL")
    if not folder:
        pytest.skip("EDGED_TRTLLM_MODEL does not name a TensorRT-LLM model folder")
    reason = TensorRTLLMBackend().unavailable_reason()
    if reason:
        pytest.skip(reason)
    session = TensorRTLLMBackend().load(LoadSpec("chat", 1, Path(folder), (), (), 0, llm=(
        LanguageConfig(context=512, sequences=len(PROMPTS)))), None)  # type: ignore[arg-type]
    assert isinstance(session, BatchedLanguageSession)
    try:
        sampling = Sampling(16, 0.0)
        alone = [list(session.generate(session.prompt(p), sampling)) for p in PROMPTS]
        slots = {session.admit(session.prompt(p), sampling): i for i, p in enumerate(PROMPTS)}
        together: list[list[Piece]] = [[] for _ in PROMPTS]
        while slots:
            for slot, piece in session.step():
                together[slots[slot]].append(piece)
                if piece.finish_reason is not None:
                    session.drop(slot)
                    del slots[slot]
        assert ["".join(p.text for p in a) for a in together] == \
            ["".join(p.text for p in a) for a in alone]
        slot = session.admit(session.prompt(PROMPTS[0]), Sampling(200, 0.0))
        session.step()
        session.drop(slot)
        assert session.free_slots() == len(PROMPTS)
    finally:
        session.close()
