"""The llama.cpp backend (llama-cpp-python, the `llm` extra): language models in GGUF files.
A session holds the weights (memory-mapped) and a KV cache of `llm.context` tokens for each
of its `llm.sequences` answers, on `llm.threads` CPU threads so the cameras' models keep the
other cores. With one sequence it is llama-cpp-python's own `Llama.generate`, an answer at a
time (`LlamaSession`); with several, one context decodes a token for every answer under way
in one batch (`edged.backends.llamacpp_batch`). Both turn tokens into text the same way
(`edged.backends.answer`): UTF-8 completed, text that may begin a stop string held back."""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np

from edged.backends.answer import AnswerText
from edged.backends.answer import stop_prefix as _stop_prefix  # noqa: F401  (tests name it)
from edged.backends.base import BackendOptions, LoadSpec, Piece, Prompt, Sampling
from edged.core.errors import InvalidInput, ModelLoadError
from edged.model.config import LanguageConfig
from edged.model.gguf import read_header
from edged.model.tensor import TensorSpec

logger = logging.getLogger(__name__)

# Without a chat template in the GGUF: ChatML, which most small instruct models are tuned on.
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ROLES = ("system", "user", "assistant")
# What llama-cpp-python's Llama.generate samples with besides temperature and top_p; the
# batched path builds the same chain, so an answer does not depend on the path it took.
TOP_K, MIN_P, TYPICAL_P, REPEAT_LAST_N = 40, 0.05, 1.0, 64


class LlamaCppBackend:
    name = "llamacpp"

    def unavailable_reason(self) -> str | None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            return f"llama-cpp-python is not installed (pip install 'edged[llm]'): {exc}"
        return None

    def load(self, spec: LoadSpec, options: BackendOptions) -> Any:
        config = spec.llm or LanguageConfig()
        if config.sequences > 1:
            from edged.backends.llamacpp_batch import LlamaBatchSession

            return LlamaBatchSession(spec, config)
        return LlamaSession(spec, config)

    def auto_precision(self, int8: Any, why: str) -> tuple[str, str] | None:
        return "fp32", "a GGUF file carries its own quantisation"


class LlamaText:
    """What both sessions share: prompts tokenised and chats templated as the model reads
    them, tokens detokenised, JSON schemas made grammars. Needs `label`, `context_length` and
    `_model` (llama-cpp-python's LlamaModel) set before use."""

    inputs: Sequence[TensorSpec] = ()
    outputs: Sequence[TensorSpec] = ()
    label: str
    context_length: int
    _model: Any

    def _start_text(self) -> None:
        import llama_cpp
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        model = self._model
        self._eos = model.token_eos()
        self._is_eog = llama_cpp.llama_vocab_is_eog  # end of generation: EOS, end of turn
        bos = model.token_bos()
        self._chat = Jinja2ChatFormatter(
            template=model.metadata().get("tokenizer.chat_template") or CHATML,
            eos_token=model.token_get_text(self._eos) if self._eos >= 0 else "",
            bos_token=model.token_get_text(bos) if bos >= 0 else "")

    # -- prompts ------------------------------------------------------------------------------
    def prompt(self, text: str) -> Prompt:
        """A completion's prompt, tokenised as the model reads it (its BOS first)."""
        return Prompt(text, self._tokens(text, bos=True, special=False))

    def chat(self, messages: Sequence[Mapping[str, str]]) -> Prompt:
        """Messages (role, content) made into the prompt by the model's chat template."""
        given: Any = [dict(m) for m in messages]  # role and content, checked by the API
        formatted = self._chat(messages=given)
        stop = formatted.stop
        stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
        # The template writes the BOS itself where the model wants one (llama-cpp-python's own
        # chat handler tokenises it so too).
        return Prompt(formatted.prompt, self._tokens(formatted.prompt, bos=not formatted
                                                     .added_special, special=True),
                      tuple(s for s in stops if s))

    def _tokens(self, text: str, *, bos: bool, special: bool) -> tuple[int, ...]:
        tokens = tuple(self._model.tokenize(text.encode("utf-8"), add_bos=bos,
                                            special=special))
        if len(tokens) >= self.context_length:
            raise InvalidInput(f"{self.label}: the prompt is {len(tokens)} tokens; the context "
                               f"holds {self.context_length} (prompt and answer together, "
                               "llm.context)")
        return tokens

    def _answer(self, prompt: Prompt, sampling: Sampling) -> AnswerText:
        room = self.context_length - len(prompt.tokens)
        return AnswerText(lambda token: self._model.detokenize([token], special=False),
                          lambda token: token == self._eos
                          or bool(self._is_eog(self._model.vocab, token)),
                          prompt.stop + sampling.stop, min(sampling.max_tokens, room))

    def _grammar(self, schema: str | None) -> Any:
        """llama.cpp's grammar for JSON answers: any object for "{}", else the schema's."""
        if schema is None:
            return None
        from llama_cpp.llama_grammar import JSON_GBNF, LlamaGrammar

        try:
            if schema == "{}":
                return LlamaGrammar.from_string(JSON_GBNF, verbose=False)
            return LlamaGrammar.from_json_schema(schema, verbose=False)
        except Exception as exc:  # llama.cpp's converter: an unsupported schema
            raise InvalidInput(f"{self.label}: the JSON schema cannot be made a grammar: "
                               f"{exc}") from exc

    def infer(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise InvalidInput(f"{self.label} is a language model: it generates text "
                           "(POST /v2/models/<m>/generate, /v1/chat/completions), it takes "
                           "no tensors")


class LlamaSession(LlamaText):
    """One GGUF model in one llama.cpp context, an answer at a time (`llm.sequences: 1`)."""

    def __init__(self, spec: LoadSpec, config: LanguageConfig) -> None:
        from llama_cpp import Llama

        header = read_header(spec.path)
        self.label = spec.label
        try:
            self._llm = Llama(model_path=str(spec.path), n_ctx=config.context,
                              n_batch=min(config.batch_size, config.context),
                              n_threads=config.threads,
                              n_threads_batch=config.batch_threads or config.threads,
                              n_gpu_layers=config.gpu_layers, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:  # llama.cpp's "failed to load"
            raise ModelLoadError(f"{spec.label}: llama.cpp cannot load {spec.path}: {exc}"
                                 ) from exc
        self.context_length = self._llm.n_ctx()
        self.nbytes = spec.path.stat().st_size + header.kv_cache_bytes(self.context_length)
        self.providers = [f"llama.cpp ({config.threads} threads"
                          + (f", {config.gpu_layers} GPU layers)" if config.gpu_layers
                             else ", CPU)")]
        self._model = self._llm._model
        self._start_text()

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: Prompt, sampling: Sampling) -> Generator[Piece, None, None]:
        """One Piece per token until the model ends, a stop string comes, `max_tokens` or
        the context is full. Closing the iterator stops it (before the next token). A JSON
        schema llama.cpp cannot follow is refused here, before any token."""
        return self._pieces(prompt, sampling, self._grammar(sampling.json_schema))

    def _pieces(self, prompt: Prompt, sampling: Sampling, grammar: Any
                ) -> Generator[Piece, None, None]:
        import llama_cpp

        answer = self._answer(prompt, sampling)
        if answer.limit <= 0:
            yield Piece("", "length")
            return
        # Llama.generate samples with the Llama's seed: set it for every answer (a seeded one
        # must not leave its seed to the next).
        self._llm.set_seed(llama_cpp.LLAMA_DEFAULT_SEED if sampling.seed is None
                           else sampling.seed)
        # Every prompt is read whole: Llama.generate would keep the KV cache of a prefix it
        # read before and re-read only the rest, and a rest of one token is computed by other
        # kernels than a prompt's, so the same request could answer differently after another
        # (decision 040). An answer never depends on the one before it.
        self._llm.reset()
        tokens = self._llm.generate(list(prompt.tokens), temp=sampling.temperature,
                                    top_p=sampling.top_p, top_k=TOP_K, min_p=MIN_P,
                                    typical_p=TYPICAL_P, repeat_penalty=1.0, reset=True,
                                    grammar=grammar)
        try:
            for token in tokens:
                piece = answer.feed(token)
                yield piece
                if piece.finish_reason is not None:
                    return
        finally:
            tokens.close()

    def close(self) -> None:
        self._llm.close()
