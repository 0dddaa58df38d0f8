"""Opening one model version: the backend its config or the daemon's default chooses, the file
and precision to load (`model.precision`), the load itself (on the fallback backend while the
chosen one is not ready, e.g. an engine building), and the warm-up inference before anyone is
told the model is ready. The cache decides when to load and what to keep; this decides how."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from edged.backends import (
    Backend,
    BackendOptions,
    FallBack,
    LanguageSession,
    LoadSpec,
    Sampling,
    Session,
    choose_backend,
    get_backend,
)
from edged.core.errors import EdgedError, InvalidModel, ModelLoadError
from edged.inference.loadspec import describe_inputs, load_spec, options_for, warmup_inputs
from edged.inference.precision import choose_precision
from edged.inference.threads import choose_threads
from edged.model.boxsets import check_landmark_width
from edged.model.repository import ModelRepository, ModelVersion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    """A model version loaded and warm, and what the cache needs to know about it."""

    model: ModelVersion
    session: Session
    backend: str  # the backend it really runs on
    precision: str  # fp32 | fp16 | int8, what was loaded
    seconds: float  # load and warm-up
    # Served on a fallback until the chosen backend is ready (an engine building): completes
    # when it is, and the cache then loads the model again with `upgrading=True`.
    upgrade: Future[None] | None = None


class ModelLoader:
    def __init__(self, repository: ModelRepository, options: BackendOptions, *,
                 default_backend: str = "auto",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.repository = repository
        self.options = options
        self.default_backend = default_backend
        self._clock = clock

    def load(self, name: str, version: int, *, upgrading: bool = False) -> Loaded:
        """Load and warm `name:version`. `upgrading`: the model already serves on a fallback
        and its chosen backend says it is ready; a fallback now is an error, not a fallback.
        Raises EdgedError (ModelLoadError for a backend's own failures) or FallBack."""
        model = self.repository.get(name, version)
        if model.is_language:
            return self._load_language(model)
        backend = choose_backend(model.config.backend if model.config.backend != "auto"
                                 else self.default_backend)
        options = options_for(model, self.options)
        started = self._clock()
        # model.onnx or its gated INT8 variant; `auto` may time the two once (remembered).
        choice = choose_precision(model, backend, options)
        spec = load_spec(model, choice.path, choice.precision)
        # ONNX Runtime on the CPU, threads left to edged: 1 or one per core, as times best.
        options = choose_threads(model, backend, spec, options)
        try:
            backend, spec, session, upgrade = self._open(model, backend, spec, options,
                                                         upgrading=upgrading)
        except (EdgedError, FallBack):
            raise
        except Exception as exc:  # a backend's own error types: report, never crash
            logger.exception("%s: %s failed to load it", model.label, backend.name,
                             extra=journal_fields(model, "model_load_failed"))
            raise ModelLoadError(f"{model.label}: {backend.name} failed to load: {exc}") from exc
        warmed = "no warm-up"
        try:
            if model.config.warmup.enabled:
                warm = warmup_inputs(model)
                warmed = f"warmed at {describe_inputs(warm)}"
                warm_outputs = session.infer(warm)
                post = model.config.postprocess
                check_landmark_width(model.head, post.kpt_shape if post else None,
                                     warm_outputs, model.label)
        except InvalidModel:
            session.close()
            raise
        except Exception as exc:  # a backend's own error types, from its first inference
            session.close()
            logger.exception("%s: warm-up inference failed", model.label,
                             extra=journal_fields(model, "model_load_failed"))
            raise ModelLoadError(f"{model.label}: warm-up inference failed: {exc}") from exc
        seconds = self._clock() - started
        logger.info("%s ready on %s (%s) in %.2fs, %.1f MB, %s", model.label, backend.name,
                    ", ".join(session.providers), seconds, session.nbytes / 1e6, warmed,
                    extra=journal_fields(model, "model_ready"))
        return Loaded(model, session, backend.name, spec.precision, seconds, upgrade)

    def _load_language(self, model: ModelVersion) -> Loaded:
        """A language model (model.gguf on llama.cpp, a trtllm/ folder on TensorRT-LLM),
        warmed by generating one token before it is ready."""
        backend = choose_backend(model.config.backend)
        started = self._clock()
        spec = LoadSpec(model.name, model.version, model.model_path, model.inputs,
                        model.outputs, 0, llm=model.config.llm)
        try:
            session = backend.load(spec, self.options)
        except EdgedError:
            raise
        except Exception as exc:  # llama.cpp's own error types: report, never crash
            logger.exception("%s: %s failed to load it", model.label, backend.name,
                             extra=journal_fields(model, "model_load_failed"))
            raise ModelLoadError(f"{model.label}: {backend.name} failed to load: {exc}"
                                 ) from exc
        warmed = "no warm-up"
        if model.config.warmup.enabled and isinstance(session, LanguageSession):
            try:
                for _ in session.generate(session.prompt("Hello"), Sampling(1, 0.0)):
                    pass
                warmed = "warmed by one token"
            except Exception as exc:
                session.close()
                logger.exception("%s: warm-up generation failed", model.label,
                                 extra=journal_fields(model, "model_load_failed"))
                raise ModelLoadError(f"{model.label}: warm-up generation failed: {exc}"
                                     ) from exc
        seconds = self._clock() - started
        logger.info("%s ready on %s (%s) in %.2fs, %.1f MB, %s", model.label, backend.name,
                    ", ".join(session.providers), seconds, session.nbytes / 1e6, warmed,
                    extra=journal_fields(model, "model_ready"))
        return Loaded(model, session, backend.name,
                      "gguf" if backend.name == "llamacpp" else "engine", seconds)

    def _open(self, model: ModelVersion, backend: Backend, spec: LoadSpec,
              options: BackendOptions, *, upgrading: bool
              ) -> tuple[Backend, LoadSpec, Session, Future[None] | None]:
        """`backend.load`, or, when the backend falls back (its engine still building), the
        fallback backend's load and the future that says when to try `backend` again."""
        try:
            return backend, spec, backend.load(spec, options), None
        except FallBack as fallback:
            if upgrading:
                raise
            logger.info("%s: served on %s for now: %s", model.label, fallback.fallback,
                        fallback, extra=journal_fields(model, "model_fallback"))
            backend = get_backend(fallback.fallback)
            choice = choose_precision(model, backend, options)
            spec = dataclasses.replace(spec, path=choice.path, precision=choice.precision)
            return backend, spec, backend.load(spec, options), fallback.upgrade


def journal_fields(model: ModelVersion, code: str) -> dict[str, object]:
    """Journal fields of a log line about `model` (MODEL=, MODEL_VERSION=, CODE=)."""
    return {"model": model.name, "version": model.version, "code": code}
