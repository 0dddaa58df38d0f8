"""Where a TensorRT engine runs when a model (model.yaml `tensorrt: {dla_core, gpu_fallback}`)
or the daemon (`backends.tensorrt.dla_core`) asks for a DLA: the core, if this machine has it
(Jetson AGX Orin and Orin NX have two; a discrete GPU and Orin Nano none), else the GPU with
one log line per model. The engine cache key carries the core (and `gpu_fallback: false`),
so an engine built for one placement is never loaded for another."""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from typing import Any

from edged.backends.base import BackendOptions
from edged.backends.trt_build import trt_logger

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_cores: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # module -> count
_warned: set[tuple[str, int]] = set()


def cores(trt: Any) -> int:
    """How many DLA cores TensorRT sees here (IBuilder.num_DLA_cores), asked once."""
    with _lock:
        if trt not in _cores:
            try:
                _cores[trt] = int(trt.Builder(trt_logger(trt)).num_DLA_cores)
            except Exception as exc:  # a TensorRT without the attribute, a builder that fails
                logger.info("cannot count DLA cores (%s): taking none", exc)
                _cores[trt] = 0
        return _cores[trt]


def resolve(trt: Any, label: str, options: BackendOptions) -> BackendOptions:
    """`options` as they can run here: a DLA core this machine lacks becomes the GPU."""
    if options.dla_core is None:
        return options
    present = cores(trt)
    if options.dla_core < present:
        return options
    with _lock:
        first = (label, options.dla_core) not in _warned
        _warned.add((label, options.dla_core))
    if first:
        logger.warning("%s: DLA core %d was asked for but this machine has %s; building its "
                       "engine for the GPU", label, options.dla_core,
                       f"{present} DLA core(s)" if present else "no DLA",
                       extra={"model": label.split(":")[0], "code": "dla_unavailable"})
    return dataclasses.replace(options, dla_core=None)


def shown(options: BackendOptions) -> str:
    """What the session's providers add for a DLA engine (status, metrics), e.g. " DLA0+GPU"
    (layers the DLA cannot run fall back to the GPU) or " DLA1"."""
    if options.dla_core is None:
        return ""
    return f" DLA{options.dla_core}" + ("+GPU" if options.dla_gpu_fallback else "")

