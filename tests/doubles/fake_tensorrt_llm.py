"""A faithful double of TensorRT-LLM's LLM API (1.x) as edged's tensorrt_llm backend uses it:
`LLM(model=..., **llm_args)` loading a folder with a config.json, its `tokenizer`
(TransformersTokenizer: encode, decode, apply_chat_template, eos_token_id), `generate_async(
inputs, sampling_params=, streaming=)` returning a RequestOutput that iterates as the executor
streams (each step adds `token_ids_diff` and `text_diff` to `outputs[0]`, `finished` and a
`finish_reason` of stop | length | cancelled at the end), `abort()`, `shutdown()`;
`SamplingParams`, and `llmapi.KvCacheConfig` / `GuidedDecodingParams` refusing fields the real
ones lack. The "model" is a tokenizer of words and an executor that runs in flight on a thread
of its own, up to `max_batch_size` requests a step: greedy, it continues a prompt's last
number ("3 4" -> " 5 6 ..."), else counts words; with a temperature it draws words from the
seed; at the prompt's length plus max_tokens, or `max_seq_len`, it stops; the word "end" is
its end of sequence; a prompt holding "boom" fails (its iteration raises, as an error
response's RequestError does). Each use from outside is recorded (`SURFACE`) for tests/gpu_api."""

from __future__ import annotations

import dataclasses
import json
import queue
import random
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

SURFACE: set[tuple[str, str, str]] = set()  # (class, member, detail): what edged used
STEP_S = 0.002  # what one executor step (a token for each request in flight) takes on the GPU
EOS = "end"
LLM_ARGS = frozenset({"model", "tokenizer", "backend", "max_batch_size", "max_num_tokens",
                      "max_seq_len", "kv_cache_config", "guided_decoding_backend", "dtype",
                      "tensor_parallel_size", "trust_remote_code"})


def _used(cls: str, member: str, detail: str = "") -> None:
    SURFACE.add((cls, member, detail))


@dataclasses.dataclass(kw_only=True)
class KvCacheConfig:
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = None
    enable_block_reuse: bool = True

    def __post_init__(self) -> None:
        _used("KvCacheConfig", "__init__", ",".join(
            f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None))


@dataclasses.dataclass(kw_only=True)
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        if sum(bool(v) for v in (self.json, self.regex, self.grammar, self.json_object)) > 1:
            raise ValueError("Only one guide can be used for a request")
        _used("GuidedDecodingParams", "__init__", "json_object" if self.json_object else "json")


@dataclasses.dataclass(kw_only=True)
class SamplingParams:
    max_tokens: int = 32
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    end_id: int | None = None
    stop: str | list[str] | None = None
    guided_decoding: GuidedDecodingParams | None = None
    detokenize: bool = True

    def __post_init__(self) -> None:
        _used("SamplingParams", "__init__", ",".join(sorted(
            f.name for f in dataclasses.fields(self) if getattr(self, f.name) is not None)))


class Tokenizer:
    """Words (and the spaces before them) are tokens; ids are their places in a vocabulary
    the tokenizer grows as it meets them."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {EOS: 0}
        self._words: list[str] = [EOS]
        self._lock = threading.Lock()

    @property
    def eos_token_id(self) -> int:
        _used("TransformersTokenizer", "eos_token_id")
        return 0

    def _id(self, word: str) -> int:
        with self._lock:
            if word not in self._ids:
                self._ids[word] = len(self._words)
                self._words.append(word)
            return self._ids[word]

    def encode(self, text: str, *args: Any, **kwargs: Any) -> list[int]:
        _used("TransformersTokenizer", "encode", ",".join(sorted(kwargs)))
        return [self._id(word) for word in text.split()]

    def decode(self, token_ids: list[int], *args: Any, **kwargs: Any) -> str:
        return "".join(" " + self._words[t] for t in token_ids if t != 0)

    def apply_chat_template(self, conversation: list[dict[str, str]], *args: Any,
                            **kwargs: Any) -> str:
        _used("TransformersTokenizer", "apply_chat_template", ",".join(sorted(kwargs)))
        text = " ".join(f"{m['role']}: {m['content']}" for m in conversation)
        return text + (" assistant:" if kwargs.get("add_generation_prompt") else "")


@dataclasses.dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    finish_reason: str | None = None
    _last_text_len: int = 0
    _last_token_ids_len: int = 0

    @property
    def text_diff(self) -> str:
        _used("CompletionOutput", "text_diff")
        return self.text[self._last_text_len:]

    @property
    def token_ids_diff(self) -> list[int]:
        _used("CompletionOutput", "token_ids_diff")
        return self.token_ids[self._last_token_ids_len:]


class RequestOutput:
    """Iterates (the sync side of GenerationResult) as its executor streams updates."""

    def __init__(self, llm: LLM, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.sampling_params = params
        self.outputs = [CompletionOutput(0)]
        self.finished = False
        self._llm = llm
        self._queue: queue.Queue[tuple[list[int], str | None]] = queue.Queue()
        self._aborted = False
        self._made = 0  # tokens the executor generated

    def __iter__(self) -> RequestOutput:
        _used("RequestOutput", "__iter__")
        return self

    def __next__(self) -> RequestOutput:
        if self.finished:
            raise StopIteration
        tokens, finish = self._queue.get(timeout=30)
        if finish == "error":  # as GenerationResult raises an error response's RequestError
            self.finished = True
            raise RuntimeError("Encountered an error in forward function: CUDA out of memory")
        out = self.outputs[0]
        out._last_text_len, out._last_token_ids_len = len(out.text), len(out.token_ids)
        out.token_ids = out.token_ids + tokens
        out.text = self._llm.tokenizer.decode(out.token_ids)
        out.finish_reason = finish
        self.finished = finish is not None
        return self

    def abort(self) -> None:
        _used("RequestOutput", "abort")
        self._aborted = True


class LLM:
    def __init__(self, model: str, **kwargs: Any) -> None:
        unknown = set(kwargs) - LLM_ARGS
        if unknown:
            raise TypeError(f"LLM() got unexpected arguments {sorted(unknown)}")
        _used("LLM", "__init__", ",".join(sorted(kwargs)))
        config = Path(model) / "config.json"
        if not config.is_file():
            raise ValueError(f"{model} is not an engine or checkpoint folder")
        json.loads(config.read_text())
        self.args = dict(kwargs, model=model)
        self.max_batch_size = kwargs.get("max_batch_size", 8)
        self.max_seq_len = kwargs.get("max_seq_len", 1024)
        self.tokenizer = Tokenizer()
        self.requests: list[RequestOutput] = []  # every request, for tests
        self.largest_step = 0  # the most requests one executor step served
        self._active: list[RequestOutput] = []
        self._cond = threading.Condition()
        self._stopped = False
        self._executor = threading.Thread(target=self._run, daemon=True,
                                          name="fake-trtllm-executor")
        self._executor.start()

    def generate_async(self, inputs: Any, sampling_params: SamplingParams | None = None,
                       *, streaming: bool = False, **kwargs: Any) -> RequestOutput:
        _used("LLM", "generate_async", f"streaming={streaming}," + ",".join(sorted(kwargs)))
        tokens = self.tokenizer.encode(inputs) if isinstance(inputs, str) else list(inputs)
        params = sampling_params or SamplingParams()
        if len(tokens) + params.max_tokens > self.max_seq_len:
            raise ValueError(f"The sum of prompt length ({len(tokens)}) and max_tokens "
                             f"({params.max_tokens}) should not exceed max_seq_len "
                             f"({self.max_seq_len})")
        if params.end_id is None:
            params.end_id = self.tokenizer.eos_token_id
        result = RequestOutput(self, tokens, params)
        with self._cond:
            self.requests.append(result)
            self._active.append(result)
            self._cond.notify()
        return result

    def _run(self) -> None:
        """In-flight batching: each step gives the first max_batch_size active requests a
        token; an aborted one ends with `cancelled` at its next step."""
        while True:
            with self._cond:
                while not self._active and not self._stopped:
                    self._cond.wait()
                if self._stopped:
                    return
                batch = self._active[:self.max_batch_size]
                self.largest_step = max(self.largest_step, len(batch))
                self._cond.wait(STEP_S)  # the step's GPU time; a shutdown ends it early
            for request in batch:
                finish = self._next(request)
                if finish is not None:
                    with self._cond:
                        self._active.remove(request)

    def _next(self, request: RequestOutput) -> str | None:
        params = request.sampling_params
        if request._aborted:
            request._queue.put(([], "cancelled"))
            return "cancelled"
        if "boom" in self.tokenizer.decode(request.prompt_token_ids):  # a request that fails
            request._queue.put(([], "error"))
            return "error"
        token = self._token(request, request._made)
        tokens = [token] if token != params.end_id else []
        request._made += len(tokens)
        length = request._made >= params.max_tokens or \
            len(request.prompt_token_ids) + request._made + 1 >= self.max_seq_len
        finish = "stop" if token == params.end_id else "length" if length else None
        request._queue.put((tokens, finish))
        return finish

    def _token(self, request: RequestOutput, made: int) -> int:
        words = [self.tokenizer.decode([t]).strip() for t in request.prompt_token_ids]
        params = request.sampling_params
        if params.temperature:
            rng = random.Random(f"{params.seed}:{made}")
            return self.tokenizer._id(rng.choice(["red", "car", "night", "fox", EOS]))
        last = next((int(w) for w in reversed(words) if w.isdigit()), None)
        word = str(last + made + 1) if last is not None else f"w{made}"
        return self.tokenizer._id(word)

    def shutdown(self) -> None:
        _used("LLM", "shutdown")
        with self._cond:
            self._stopped = True
            self._cond.notify()


def install(monkeypatch: pytest.MonkeyPatch) -> list[LLM]:
    """`tensorrt_llm` and `tensorrt_llm.llmapi` in sys.modules; the LLMs made, in order."""
    made: list[LLM] = []

    class RecordedLLM(LLM):
        def __init__(self, model: str, **kwargs: Any) -> None:
            super().__init__(model, **kwargs)
            made.append(self)

    package = types.ModuleType("tensorrt_llm")
    llmapi = types.ModuleType("tensorrt_llm.llmapi")
    package.LLM = RecordedLLM  # type: ignore[attr-defined]
    package.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    package.llmapi = llmapi  # type: ignore[attr-defined]
    llmapi.LLM = RecordedLLM  # type: ignore[attr-defined]
    llmapi.KvCacheConfig = KvCacheConfig  # type: ignore[attr-defined]
    llmapi.GuidedDecodingParams = GuidedDecodingParams  # type: ignore[attr-defined]
    llmapi.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "tensorrt_llm", package)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    return made


def write_model(folder: Path, *, layers: int = 4, hidden: int = 64, heads: int = 4,
                kv_heads: int = 2) -> Path:
    """A trtllm/ folder as trtllm-build writes one: config.json (its pretrained_config) and
    a rank0.engine (bytes standing for the engine)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({
        "version": "1.0", "pretrained_config": {
            "architecture": "LlamaForCausalLM", "dtype": "float16",
            "num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads},
        "build_config": {"max_batch_size": 8, "max_seq_len": 1024}}))
    (folder / "rank0.engine").write_bytes(b"\0" * 4096)
    return folder
