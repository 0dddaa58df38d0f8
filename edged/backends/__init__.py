"""Backends are registered as import strings, so a backend that is absent (TensorRT on a CPU box)
costs nothing until it is chosen, and tests can register fakes."""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable

from edged.backends.base import (
    Backend,
    BackendOptions,
    BatchedLanguageSession,
    EngineBuilding,
    FallBack,
    LanguageSession,
    LoadSpec,
    PausingLanguageSession,
    Piece,
    Prompt,
    Sampling,
    Session,
    ShapeRange,
)
from edged.core.errors import BackendUnavailable

logger = logging.getLogger(__name__)

__all__ = ["Backend", "BackendOptions", "BatchedLanguageSession", "EngineBuilding", "FallBack",
           "LanguageSession", "LoadSpec", "PausingLanguageSession", "Piece", "Prompt",
           "Sampling", "Session", "ShapeRange",
           "choose_backend", "get_backend", "register_backend", "registered"]

# Best first: `auto` walks this order and takes the first backend usable here.
_REGISTRY: dict[str, str | Callable[[], Backend]] = {
    "tensorrt": "edged.backends.tensorrt:TensorRTBackend",
    "onnxruntime": "edged.backends.onnxruntime:OrtBackend",
    # Language models (model.gguf, a trtllm/ folder): chosen by the files, never by `auto`.
    "llamacpp": "edged.backends.llamacpp:LlamaCppBackend",
    "tensorrt_llm": "edged.backends.tensorrt_llm:TensorRTLLMBackend",
}
AUTO_ORDER = ["tensorrt", "onnxruntime"]
LANGUAGE_BACKENDS = frozenset({"llamacpp", "tensorrt_llm"})

_instances: dict[str, Backend] = {}
_lock = threading.Lock()


def register_backend(name: str, target: str | Callable[[], Backend]) -> None:
    """Register (or replace) a backend by import string "module:Class" or factory."""
    with _lock:
        _REGISTRY[name] = target
        _instances.pop(name, None)


def registered() -> list[str]:
    return [name for name in AUTO_ORDER if name in _REGISTRY] + sorted(
        name for name in _REGISTRY if name not in AUTO_ORDER)


def get_backend(name: str) -> Backend:
    """The backend instance for `name`, imported on first use."""
    with _lock:
        if name in _instances:
            return _instances[name]
        target = _REGISTRY.get(name)
        if target is None:
            raise BackendUnavailable(f"no backend named {name!r} (known: {', '.join(_REGISTRY)})")
        if isinstance(target, str):
            module_name, _, attr = target.partition(":")
            try:
                factory = getattr(importlib.import_module(module_name), attr)
            except ImportError as exc:
                raise BackendUnavailable(f"backend {name!r} cannot be imported: {exc}") from exc
        else:
            factory = target
        backend: Backend = factory()
        _instances[name] = backend
        return backend


def choose_backend(preference: str) -> Backend:
    """The named backend if usable, or for `auto` the best usable one; logs why others lost."""
    candidates = [name for name in registered() if name not in LANGUAGE_BACKENDS] \
        if preference == "auto" else [preference]
    reasons: list[str] = []
    for name in candidates:
        try:
            backend = get_backend(name)
            reason = backend.unavailable_reason()
        except BackendUnavailable as exc:
            reason = str(exc)
        if reason is None:
            if reasons:
                logger.info("backend %s chosen (%s)", name, "; ".join(reasons))
            return backend
        reasons.append(f"{name}: {reason}")
    raise BackendUnavailable("no usable backend: " + "; ".join(reasons))
