"""The llama.cpp backend (llama-cpp-python, the `llm` extra): language models in GGUF files.
A session is one llama.cpp context: the weights (memory-mapped) and a KV cache for
`llm.context` tokens, on `llm.threads` CPU threads so the cameras' models keep the other
cores. It generates a token at a time (`LlamaSession.generate`), detokenising as UTF-8
completes and holding back text that may begin a stop string; one generation at a time."""

from __future__ import annotations

import codecs
import logging
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np

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


class LlamaCppBackend:
    name = "llamacpp"

    def unavailable_reason(self) -> str | None:
        try:
            import llama_cpp  # noqa: F401
        except ImportError as exc:
            return f"llama-cpp-python is not installed (pip install 'edged[llm]'): {exc}"
        return None

    def load(self, spec: LoadSpec, options: BackendOptions) -> LlamaSession:
        return LlamaSession(spec, spec.llm or LanguageConfig())

    def auto_precision(self, int8: Any, why: str) -> tuple[str, str] | None:
        return "fp32", "a GGUF file carries its own quantisation"


class LlamaSession:
    """One GGUF model in one llama.cpp context."""

    inputs: Sequence[TensorSpec] = ()
    outputs: Sequence[TensorSpec] = ()

    def __init__(self, spec: LoadSpec, config: LanguageConfig) -> None:
        import llama_cpp
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

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
        self._eos = self._llm.token_eos()
        self._vocab = self._llm._model.vocab
        self._is_eog = llama_cpp.llama_vocab_is_eog  # end of generation: EOS, end of turn
        model = self._llm._model
        self._chat = Jinja2ChatFormatter(
            template=self._llm.metadata.get("tokenizer.chat_template") or CHATML,
            eos_token=model.token_get_text(self._eos) if self._eos >= 0 else "",
            bos_token=model.token_get_text(self._llm.token_bos())
            if self._llm.token_bos() >= 0 else "")

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
        tokens = tuple(self._llm.tokenize(text.encode("utf-8"), add_bos=bos, special=special))
        if len(tokens) >= self.context_length:
            raise InvalidInput(f"{self.label}: the prompt is {len(tokens)} tokens; the context "
                               f"holds {self.context_length} (prompt and answer together, "
                               "llm.context)")
        return tokens

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: Prompt, sampling: Sampling) -> Generator[Piece, None, None]:
        """One Piece per token until the model ends, a stop string comes, `max_tokens` or
        the context is full. Closing the iterator stops it (before the next token). A JSON
        schema llama.cpp cannot follow is refused here, before any token."""
        return self._pieces(prompt, sampling, self._grammar(sampling.json_schema))

    def _pieces(self, prompt: Prompt, sampling: Sampling, grammar: Any
                ) -> Generator[Piece, None, None]:
        room = self.context_length - len(prompt.tokens)
        limit = min(sampling.max_tokens, room)
        stops = tuple(dict.fromkeys(prompt.stop + sampling.stop))
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = ""  # text that may be the start of a stop string
        count = 0
        if limit <= 0:
            yield Piece("", "length")
            return
        tokens = self._llm.generate(list(prompt.tokens), temp=sampling.temperature,
                                    top_p=sampling.top_p, top_k=40, min_p=0.05,
                                    repeat_penalty=1.0, reset=True,
                                    grammar=grammar)
        try:
            for token in tokens:
                if token == self._eos or self._is_eog(self._vocab, token):
                    yield Piece(held + decoder.decode(b"", final=True), "stop")
                    return
                count += 1
                held += decoder.decode(self._llm.detokenize([token], special=False))
                cut = _first_stop(held, stops)
                if cut is not None:
                    yield Piece(held[:cut], "stop")
                    return
                keep = _stop_prefix(held, stops)
                text, held = held[:len(held) - keep], held[len(held) - keep:]
                if count >= limit:
                    yield Piece(text + held + decoder.decode(b"", final=True), "length")
                    return
                yield Piece(text)
        finally:
            tokens.close()

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

    def close(self) -> None:
        self._llm.close()


def _first_stop(text: str, stops: Sequence[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _stop_prefix(text: str, stops: Sequence[str]) -> int:
    """How many characters at the end of `text` may begin a stop string."""
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
