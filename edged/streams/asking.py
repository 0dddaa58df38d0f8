"""One picture asked of a model from a stream's thread: its pre-processing, the scheduler at the
stream's priority, and a bounded wait whose timeout is a typed error naming the model. Used by
the cascades and the states of regions, which each ask a model beside the stream's own."""

from __future__ import annotations

from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import numpy as np

from edged.core.errors import Timeout
from edged.inference.scheduler import Outputs, Scheduler
from edged.model.repository import ModelVersion
from edged.processing.pre import Geometry, image_preprocess, preprocess


def answer(future: Future[Outputs], timeout_s: float, what: str) -> Outputs:
    """The request's outputs within `timeout_s`; Timeout naming `what` (e.g. "state model
    gate") when they do not come."""
    try:
        return future.result(timeout=timeout_s)
    except FutureTimeout:
        raise Timeout(f"{what} did not answer in {timeout_s:g} s") from None


def ask_image(scheduler: Scheduler, name: str, image: np.ndarray, *, priority: int | None,
              timeout_s: float, what: str) -> tuple[ModelVersion, Outputs, Geometry]:
    """`image` through model `name`'s pre-processing and the scheduler: the version that
    answered, its outputs (batch dim kept where the model has one) and the geometry that maps
    them back onto `image`."""
    model = scheduler.model(name)
    spec = model.inputs[0]
    batched = model.max_batch_size > 0
    pre = image_preprocess(model.config.preprocess, model.label, spec, batched)
    tensor, geometry = preprocess(image, pre, spec)
    future = scheduler.submit(name, {spec.name: tensor if batched else tensor[0]},
                              version=model.version, priority=priority)
    return model, answer(future, timeout_s, what), geometry
