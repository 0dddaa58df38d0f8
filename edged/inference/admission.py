"""Admitting a request to a model's batcher: checking it against the version served (names,
dtypes, shapes, priority), stamping it (arrival, deadline), and the response cache on either
side of the model: looked up once checked, filled once run (`edged.inference.responses`)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edged.core.errors import InvalidInput
from edged.inference.batching import BatchPolicy, Checked, Request, validate
from edged.inference.responses import Miss, ResponseCache
from edged.model.repository import ModelVersion


def caches(model: ModelVersion) -> bool:
    """Whether the model's answers may come from the response cache."""
    return model.config.response_cache and model.config.deterministic


def check(label: str, model: ModelVersion, policy: BatchPolicy,
          inputs: Mapping[str, np.ndarray], priority: int | None,
          timeout_s: float | None) -> Checked:
    """Check a request's inputs and priority against `model` (and its batching `policy`)."""
    rows, shape_key = validate(model, inputs)
    if not priority:
        priority = policy.default_priority
    elif not 1 <= priority <= policy.levels:
        raise InvalidInput(f"{label}: priority {priority} is outside 1..{policy.levels}")
    # 0 or None: no timeout, as Triton
    return Checked(model, rows, shape_key, priority, timeout_s or policy.default_timeout_s)


def stamp(inputs: Mapping[str, np.ndarray], checked: Checked, now: float) -> Request:
    """A checked request, stamped with its arrival (and its deadline)."""
    timeout_s = checked.timeout_s
    return Request(inputs, checked.rows, checked.shape_key, checked.priority,
                   now + timeout_s if timeout_s else None, now, checked=checked)


def look_up(request: Request, responses: ResponseCache, outputs: tuple[str, ...]) -> int | None:
    """Answer a checked request from the response cache: its future done and how long the
    lookup took returned (to count it as Triton counts a hit); else None, the request
    marked to have its answer put there once run."""
    assert request.checked is not None
    model = request.checked.model
    found, miss = responses.lookup(model.name, model.version, request.inputs, model.inputs,
                                   outputs)
    if isinstance(miss, Miss):
        request.miss = miss
        return None
    assert found is not None
    request.inputs = {}
    request.future.version = model.version
    request.future.set_running_or_notify_cancel()
    request.future.set_result(found)
    return miss


def keep_answers(batch: list[Request], outputs: Mapping[str, np.ndarray],
                 responses: ResponseCache, version: int) -> list[int]:
    """Put the answers of a batch's missed requests in the response cache before they are
    handed out (as Triton inserts before it responds: the same request sent again once
    answered finds it): each request's rows of `outputs`, only the outputs it asked for,
    and none run by another version than the one looked up. Returns how long each miss
    took (lookup and insert) where it counts."""
    counted = []
    offset = 0
    for request in batch:
        end = offset + request.rows
        miss = request.miss
        if miss is not None and miss.version == version:
            names = miss.outputs or outputs.keys()
            mine = {k: outputs[k] if len(batch) == 1 else outputs[k][offset:end]
                    for k in names if k in outputs}
            ns = responses.insert(miss, mine)
            if ns is not None:
                counted.append(ns)
        offset = end
    return counted
