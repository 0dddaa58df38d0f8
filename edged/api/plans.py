"""Request plans: an infer request whose header was seen before (the same JSON bytes, the same
binary sizes, for the same model version) reuses what checking it came to, instead of parsing
and checking it again. perf_analyzer, tritonclient loops and cameras send one header thousands
of times; parsing and checking it was most of what edged did per request beyond the floor
(`docs/decisions/030-responses-and-plans.md`).

A plan is learned only from a request that passed today's full path: the header parsed and
checked (`protocol.decode_request`), the requested outputs checked against the model, the
inputs checked against the model's signature and the request's priority against its policy
(`Checked`). It holds that path's results: where each binary input lies in the body (its
dtype, count, shape and offset), the JSON inputs' arrays (the header holds their values), the
request's id, outputs, priority and timeout, and the answer's JSON header for outputs of a
given dtype and shape. A request with any other header byte, another body length, or for
another model version (a swap, a config change) takes the full path, and may leave a plan of
its own. So nothing checked there goes unchecked here: the header is the same bytes, checked
against the same model version; what is left to vary is the binary bytes, which no check
reads for the dtypes planned (BYTES inputs, whose elements are checked one by one, and
requests that name shared memory, whose regions may change between requests, are never
planned).

The table is small and bounded (MAX_PLANS, each header at most MAX_HEADER_BYTES); it lives on
the event loop's thread, so it takes no lock."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from edged.api.http.messages import Response
from edged.api.protocol import (
    HEADER_LENGTH,
    InferRequest,
    Parts,
    RequestedOutput,
    encode_response,
)
from edged.inference.batching import Checked
from edged.model.repository import ModelVersion

MAX_PLANS = 256
# A binary answer up to this size is joined into one buffer and sent with its headers in one
# write: written part by part it took three sends, ~19% of the daemon's samples (py-spy,
# tiny_cls under perf_analyzer, c=8), where copying 64 KiB costs a few microseconds.
JOIN_BYTES = 64 * 1024
MAX_HEADER_BYTES = 8 * 1024
MAX_TEMPLATES = 4  # answer headers kept per plan (output dtypes and shapes rarely vary)
Key = tuple[str, "int | None", "int | None", int, bytes]


# One input as the full path decoded it: its name, dtype, element count, shape, and the offset
# of its bytes in the body; or, for an input given as JSON, the read-only array the header's
# values made (`constant`; offset -1).
_Input = tuple[str, np.dtype, int, tuple[int, ...], int, "np.ndarray | None"]


@dataclass(eq=False)
class Plan:
    """What the full path made of one header, for one model version."""

    checked: Checked
    layout: tuple[_Input, ...]
    request_id: str | None
    outputs: list[RequestedOutput]
    binary_default: bool
    priority: int | None
    timeout_s: float | None
    cached: tuple[str, ...] = ()  # the outputs asked for, as the response cache keys them
    replays: int = 0  # requests its connection answered by replaying it (`edged.api.replays`)
    # (version, each wanted output's dtype and shape) -> the answer's JSON header
    templates: dict[tuple[object, ...], bytes] = field(default_factory=dict)
    # The last answer of one binary output: its version, output, dtype and shape, its JSON
    # header and the HTTP headers that carry its length.
    _last: tuple[int, str, np.dtype, tuple[int, ...], bytes, dict[str, str]] | None = None

    def __post_init__(self) -> None:
        self.cached = tuple(out.name for out in self.outputs)

    @property
    def model(self) -> ModelVersion:
        return self.checked.model

    def inputs(self, body: memoryview) -> dict[str, np.ndarray]:
        """The request's inputs: the binary ones views of the body (no copy), as the full
        path decodes them."""
        if len(self.layout) == 1:
            name, dtype, count, shape, offset, constant = self.layout[0]
            return {name: constant if constant is not None else
                    np.frombuffer(body, dtype, count, offset).reshape(shape)}
        return {name: constant if constant is not None else
                np.frombuffer(body, dtype, count, offset).reshape(shape)
                for name, dtype, count, shape, offset, constant in self.layout}

    def request(self, body: memoryview) -> InferRequest:
        """The request the body is, as `decode_request` would make it."""
        return InferRequest(self.request_id, self.inputs(body), self.outputs,
                            self.binary_default, self.priority, self.timeout_s)

    def answer(self, model: str, version: int, outputs: Mapping[str, np.ndarray]) -> Response:
        """The answer to send: as `infer_answer(*self.encode(...))`, the last one's JSON
        header reused when it is again one binary output of the same dtype and shape."""
        last = self._last
        if last is not None and last[0] == version and (self.outputs or len(outputs) == 1):
            _, name, dtype, shape, head, headers = last
            array = outputs.get(name)
            if array is not None and array.dtype == dtype and array.shape == shape \
                    and array.flags.c_contiguous:
                if len(head) + array.nbytes <= JOIN_BYTES:
                    return Response(b"".join((head, array.data)), headers=headers)
                return Response(parts=[head, array.data.cast("B")], headers=headers)
        parts, length = self.encode(model, version, outputs)
        wanted = self.outputs or [RequestedOutput(name, self.binary_default)
                                  for name in outputs]
        sent = outputs.get(wanted[0].name) if len(wanted) == 1 else None
        if length is not None and len(parts) == 2 and sent is not None and _sendable(sent):
            self._last = (version, wanted[0].name, sent.dtype, sent.shape, bytes(parts[0]),
                          {HEADER_LENGTH: str(length)})
        return infer_answer(parts, length)

    def encode(self, model: str, version: int, outputs: Mapping[str, np.ndarray]
               ) -> tuple[Parts, int | None]:
        """The answer, as `encode_response` makes it: its JSON header from a template when
        every output asked for goes out as binary data and was of this dtype, shape and
        layout before (native little-endian, C-ordered, not empty: sent as they are); else
        in full (and kept as a template when it can be)."""
        wanted = self.outputs or [RequestedOutput(name, self.binary_default)
                                  for name in outputs]
        key: list[object] = [version]
        arrays = []
        for out in wanted:
            array = outputs.get(out.name)
            if array is None or not out.binary:
                break
            key += (array.dtype, array.shape, array.flags.c_contiguous)
            arrays.append(array)
        else:
            head = self.templates.get(tuple(key))
            if head is not None:
                return [head, *[array.data.cast("B") for array in arrays]], len(head)
        parts, length = encode_response(model, version, self.request_id, outputs, self.outputs,
                                        self.binary_default)
        if len(arrays) == len(wanted) and len(self.templates) < MAX_TEMPLATES \
                and all(map(_sendable, arrays)):
            self.templates[tuple(key)] = bytes(parts[0])
        return parts, length


def infer_answer(parts: Parts, json_length: int | None) -> Response:
    """An infer answer: plain JSON, or JSON and binary data (joined when small)."""
    if json_length is None:
        return Response(parts[0], content_type="application/json")
    headers = {HEADER_LENGTH: str(json_length)}
    if sum(map(len, parts)) <= JOIN_BYTES:  # one buffer: one send
        return Response(b"".join(parts), headers=headers)
    # Large tensor bytes go out as they are: joining them to the JSON would copy them again.
    return Response(parts=list(parts), headers=headers)


class PlanTable:
    """The plans of the headers seen last (least recently used out first)."""

    def __init__(self, max_plans: int = MAX_PLANS) -> None:
        self.max_plans = max_plans
        self._plans: OrderedDict[Key, Plan] = OrderedDict()
        self.hits = 0
        self.learned = 0

    def __len__(self) -> int:
        return len(self._plans)

    def replays(self) -> int:
        """Requests answered by replaying one of the plans held now."""
        return sum(plan.replays for plan in self._plans.values())

    def find(self, name: str, version: int | None, body: memoryview, json_length: int | None,
             model: ModelVersion) -> Plan | None:
        """The plan of this header for `model` (the version served now), or None."""
        head = len(body) if json_length is None else json_length
        if head > MAX_HEADER_BYTES:
            return None
        key = (name, version, json_length, len(body), body[:head].tobytes())
        plan = self._plans.get(key)
        if plan is None:
            return None
        if plan.checked.model is not model:  # another version now: checked afresh
            del self._plans[key]
            return None
        self._plans.move_to_end(key)
        self.hits += 1
        return plan

    def learn(self, name: str, version: int | None, body: memoryview, json_length: int | None,
              parsed: InferRequest, checked: Checked) -> Plan | None:
        """Keep the plan of a request that passed the full path (`parsed`, `checked`), where
        one can be made: a JSON header no larger than MAX_HEADER_BYTES, no BYTES input, no
        empty input, no shared memory (the caller leaves those out)."""
        head = len(body) if json_length is None else json_length
        if not 0 < head <= MAX_HEADER_BYTES:
            return None
        inputs = _layout(body, head, parsed.inputs)
        if inputs is None:
            return None
        key = (name, version, json_length, len(body), body[:head].tobytes())
        plan = self._plans[key] = Plan(checked, inputs, parsed.id, parsed.outputs,
                                       parsed.binary_default, parsed.priority,
                                       parsed.timeout_s)
        self._plans.move_to_end(key)
        self.learned += 1
        while len(self._plans) > self.max_plans:
            self._plans.popitem(last=False)
        return plan


def _layout(body: memoryview, head: int, inputs: Mapping[str, np.ndarray]
            ) -> tuple[_Input, ...] | None:
    """Where the decoded inputs came from: a binary input is a view of the body after the
    JSON (its offset read off its address), any other was built from the JSON's values, which
    the same header always holds (kept, read-only). None when an input cannot be planned."""
    base = np.frombuffer(body, np.uint8).ctypes.data
    start, end = base + head, base + len(body)
    planned = []
    for name, array in inputs.items():
        if array.dtype == np.object_ or array.size == 0 or not array.flags.c_contiguous:
            return None
        address = array.ctypes.data
        if start <= address and address + array.nbytes <= end:
            planned.append((name, array.dtype, array.size, array.shape, address - base, None))
        elif address + array.nbytes <= base or address >= end:  # built from the JSON
            constant = array.copy()
            constant.flags.writeable = False
            planned.append((name, array.dtype, array.size, array.shape, -1, constant))
        else:
            return None
    return tuple(planned)


def _sendable(array: np.ndarray) -> bool:
    """Whether an output's bytes go out as they are (what `encode_response` would send)."""
    dtype = array.dtype
    return (dtype != np.object_ and dtype.byteorder in "=<|" and array.flags.c_contiguous
            and array.size > 0 and np.little_endian)
