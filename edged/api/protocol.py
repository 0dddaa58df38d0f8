"""The KServe v2 / Triton inference codec: JSON tensors and Triton's binary tensor extension
(`Inference-Header-Content-Length`, `binary_data_size`, `binary_data`, `binary_data_output`),
with shared-memory references handed to a resolver. Pure functions: no I/O, no server.

Every malformed request becomes an `InvalidInput` naming what is wrong."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edged.api import tensorbytes
from edged.api.http import jsontext
from edged.core.errors import InvalidInput

HEADER_LENGTH = "Inference-Header-Content-Length"
MAX_RANK = 16  # numpy allows 64; no model input has more than a handful
MAX_DIM = 1 << 40
# The most elements a shape may describe, zero-size dims aside: numpy refuses (with a 500's
# "array is too big") shapes whose other dims multiply past what an address can hold.
MAX_ELEMENTS = 1 << 40
# What a BYTES element held as Python bytes costs beyond its own bytes (object header, list and
# object-array slots); charged before a binary BYTES tensor is unpacked.
BYTES_ELEMENT_COST = 48
# What json.loads makes of a request's text beyond the flat JSON_WEIGHT (api.budget) the server
# charges for it: a list or dict per bracket, a str per pair of quotes, a list slot per comma.
# Charged before parsing, so that nested shapes cannot outgrow their charge (issue 20 #6:
# `[[1],[1],...]` and `[{},{},...]` peaked at 24-28x their text, short strings at 19-22x).
CONTAINER_COST = 80
QUOTE_COST = 24
ITEM_COST = 8
MAX_TIMEOUT_US = 24 * 3600 * 10**6  # a day; longer is a mistake, and time_t must hold it
# Triton parameters of features edged does not claim: refused, never silently ignored.
UNCLAIMED_PARAMETERS = {"sequence_id": "the sequence batcher",
                        "sequence_start": "the sequence batcher",
                        "sequence_end": "the sequence batcher"}

TRITON_TO_NUMPY: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}
NUMPY_TO_TRITON = {np.dtype(v).str: k for k, v in TRITON_TO_NUMPY.items() if k != "BYTES"}
# Compact JSON from one encoder made once: json.dumps with separators builds one a call.
_compact = json.JSONEncoder(separators=(",", ":"), check_circular=False).encode
# Little-endian numpy dtypes of the fixed-size datatypes, made once (not per tensor).
_WIRE_DTYPES = {k: np.dtype(v).newbyteorder("<") for k, v in TRITON_TO_NUMPY.items()
                if k != "BYTES"}
_KNOWN = {np.dtype(v): k for k, v in TRITON_TO_NUMPY.items() if k != "BYTES"}


def triton_dtype(dtype: np.dtype) -> str:
    name = _KNOWN.get(dtype)  # the native dtypes outputs come in: one lookup
    if name is not None:
        return name
    if tensorbytes.is_bytes(dtype):
        return "BYTES"
    name = NUMPY_TO_TRITON.get(dtype.newbyteorder("<").str)  # big-endian maps like little
    if name is None:
        raise InvalidInput(f"dtype {dtype} has no KServe v2 datatype")
    return name


@dataclass(frozen=True)
class ShmRef:
    """A tensor that lives in a registered shared-memory region."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: the request-level default
    shm: ShmRef | None = None


@dataclass
class InferRequest:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput] = field(default_factory=list)  # empty: every output
    binary_default: bool = False
    priority: int | None = None
    timeout_s: float | None = None
    # Whether an input was read from a shared memory region (what the parse found, whatever
    # the bytes looked like): such a request is never planned, its region may change.
    shm_inputs: bool = False


_INT = frozenset({int})  # the type of a JSON integer (a JSON true is a bool)
ShmReader = Callable[[ShmRef], memoryview]
Charger = Callable[[int], None]  # told of memory a request is about to take
# A message body as parts (the JSON, then each tensor's bytes), sent without joining them:
# joining would copy every tensor once more.
Parts = list[bytes | memoryview]
ShmWriter = Callable[[ShmRef, np.ndarray], int]  # returns the bytes written


def decode_request(body: bytes | bytearray | memoryview, json_length: int | None = None, *,
                   read_shm: ShmReader | None = None,
                   charge: Charger | None = None) -> InferRequest:
    """Parse an infer request body; binary tensors become views of `body` (no copy).
    `charge` is told what unpacking binary BYTES tensors will take, before it does."""
    body = memoryview(body).cast("B")
    if json_length is None:
        json_length = len(body)
    if not 0 <= json_length <= len(body):
        raise InvalidInput(f"{HEADER_LENGTH} is {json_length} but the body has {len(body)} bytes")
    text = bytes(body[:json_length])
    if charge is not None:
        charge(parse_cost(text))
    header = _parse_json(text)
    params = _mapping(header.get("parameters", {}), "parameters")
    _refuse_unclaimed(params, UNCLAIMED_PARAMETERS, "request")
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("id must be a string")
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("inputs must be a non-empty list")
    blob = body[json_length:]
    offset = 0
    inputs: dict[str, np.ndarray] = {}
    shm_inputs = False
    for i, raw in enumerate(raw_inputs):
        tensor, used = _decode_input(_mapping(raw, f"inputs[{i}]"), i, blob, offset, read_shm,
                                     charge)
        if tensor.name in inputs:
            raise InvalidInput(f"input {tensor.name!r} appears twice")
        inputs[tensor.name] = tensor.array
        offset += used
        shm_inputs = shm_inputs or tensor.shm
    if offset != len(blob):
        raise InvalidInput(f"the body carries {len(blob)} bytes of binary data but the inputs "
                           f"declare {offset}")
    outputs = _decode_outputs(header.get("outputs", []))
    return InferRequest(request_id, inputs, outputs,
                        binary_default=_bool(params.get("binary_data_output", False),
                                             "parameters.binary_data_output"),
                        priority=_priority(params.get("priority")),
                        timeout_s=_timeout(params.get("timeout")), shm_inputs=shm_inputs)


@dataclass
class _Decoded:
    name: str
    array: np.ndarray
    shm: bool = False  # read from a shared memory region


def _decode_input(raw: Mapping[str, Any], i: int, blob: memoryview, offset: int,
                  read_shm: ShmReader | None, charge: Charger | None = None
                  ) -> tuple[_Decoded, int]:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"inputs[{i}].name must be a non-empty string")
    datatype = raw.get("datatype")
    if datatype not in TRITON_TO_NUMPY:
        raise InvalidInput(f"input {name}: unknown datatype {datatype!r}")
    shape = raw.get("shape")
    # Every dim an int (not a bool: its type is not int), in 0..MAX_DIM; C loops, not Python.
    if not isinstance(shape, list) or (shape and not (
            _INT.issuperset(map(type, shape)) and min(shape) >= 0 and max(shape) <= MAX_DIM)):
        raise InvalidInput(f"input {name}: shape must be a list of integers in 0..{MAX_DIM}")
    if len(shape) > MAX_RANK:
        raise InvalidInput(f"input {name}: {len(shape)} dimensions (at most {MAX_RANK})")
    if math.prod(filter(None, shape)) > MAX_ELEMENTS:  # the dims that are not 0
        raise InvalidInput(f"input {name}: shape {shape} describes more than {MAX_ELEMENTS} "
                           "elements")
    count = math.prod(shape)
    if datatype == "BYTES" and charge is not None and "data" not in raw:
        charge(count * BYTES_ELEMENT_COST)  # a Python object per element, whatever its size
    params = _mapping(raw.get("parameters", {}), f"input {name} parameters")
    if "shared_memory_region" in params:
        if read_shm is None:
            raise InvalidInput(f"input {name}: shared memory is not available here")
        ref = _shm_ref(params, f"input {name}")
        array = _from_bytes(read_shm(ref), datatype, count, name)
        return _Decoded(name, array.reshape(shape), shm=True), 0
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidInput(f"input {name}: binary_data_size must be a non-negative integer")
        if offset + size > len(blob):
            raise InvalidInput(f"input {name}: binary_data_size {size} runs past the body")
        array = _from_bytes(blob[offset:offset + size], datatype, count, name)
        return _Decoded(name, array.reshape(shape)), size
    if "data" not in raw:
        raise InvalidInput(f"input {name}: no data, binary_data_size or shared memory")
    return _Decoded(name, _from_json(raw["data"], datatype, shape, name)), 0


def _from_bytes(data: memoryview, datatype: str, count: int, name: str) -> np.ndarray:
    if datatype == "BYTES":
        return tensorbytes.unpack(data, count, name)
    dtype = _WIRE_DTYPES[datatype]
    if len(data) != count * dtype.itemsize:
        raise InvalidInput(f"input {name}: {len(data)} bytes of data for {count} {datatype} "
                           f"elements ({count * dtype.itemsize} bytes expected)")
    return np.frombuffer(data, dtype=dtype, count=count)  # a view: no copy


def _from_json(data: Any, datatype: str, shape: list[int], name: str) -> np.ndarray:
    flat = _flatten(data)
    if len(flat) != math.prod(shape):
        raise InvalidInput(f"input {name}: {len(flat)} values for shape {shape}")
    if datatype == "BYTES":
        return tensorbytes.from_json(flat, name).reshape(shape)
    try:
        return np.array(flat, dtype=TRITON_TO_NUMPY[datatype]).reshape(shape)
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidInput(f"input {name}: data is not {datatype}: {exc}") from exc


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        raise InvalidInput("data must be a list")
    out: list[Any] = []
    stack = [data]
    while stack:  # iterative: a hostile, deeply nested list cannot blow the stack
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _decode_outputs(raw_outputs: Any) -> list[RequestedOutput]:
    outputs: list[RequestedOutput] = []
    for i, raw in enumerate(_list(raw_outputs, "outputs")):
        out = _decode_output(_mapping(raw, f"outputs[{i}]"), i)
        if any(seen.name == out.name for seen in outputs):
            raise InvalidInput(f"output {out.name!r} is requested twice")
        outputs.append(out)
    return outputs


def _decode_output(raw: Mapping[str, Any], i: int) -> RequestedOutput:
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"outputs[{i}].name must be a non-empty string")
    params = _mapping(raw.get("parameters", {}), f"output {name} parameters")
    _refuse_unclaimed(params, {"classification": "classification outputs"}, f"output {name}")
    shm = _shm_ref(params, f"output {name}") if "shared_memory_region" in params else None
    binary = params.get("binary_data")
    return RequestedOutput(name, None if binary is None else _bool(binary, f"output {name} "
                                                                           "binary_data"), shm)


def encode_response(model: str, version: int, request_id: str | None,
                    outputs: Mapping[str, np.ndarray], requested: list[RequestedOutput],
                    binary_default: bool, *, write_shm: ShmWriter | None = None
                    ) -> tuple[Parts, int | None]:
    """The response body and, when binary data follows the JSON, the JSON's length.
    `binary_default` (the request's `binary_data_output`) applies when the request names no
    outputs; an output it names is binary only when it says so (as Triton answers)."""
    wanted = requested or [RequestedOutput(name, binary_default) for name in outputs]
    entries = []
    blobs: Parts = []
    for out in wanted:
        if out.name not in outputs:
            raise InvalidInput(f"model {model} has no output {out.name!r} "
                               f"(outputs: {', '.join(outputs)})")
        array = np.asarray(outputs[out.name])
        if out.shm is None:
            entries.append(_tensor_entry(out.name, array, bool(out.binary), blobs))
            continue
        if write_shm is None:
            raise InvalidInput(f"output {out.name}: shared memory is not available here")
        written = write_shm(out.shm, array)
        entries.append({"name": out.name, "datatype": triton_dtype(array.dtype),
                        "shape": list(array.shape),
                        "parameters": {"shared_memory_region": out.shm.region,
                                       "shared_memory_byte_size": written}})
    header: dict[str, Any] = {"model_name": model, "model_version": str(version),
                              "outputs": entries}
    if request_id is not None:
        header["id"] = request_id
    head = _compact(header).encode()
    return [head, *blobs], len(head) if blobs else None


@dataclass(frozen=True)
class ShmTensor:
    """A client's input that already sits in a registered region."""

    ref: ShmRef
    datatype: str
    shape: tuple[int, ...]


def encode_request(inputs: Mapping[str, np.ndarray | ShmTensor],
                   outputs: list[RequestedOutput], *, binary: bool = True,
                   request_id: str | None = None, parameters: Mapping[str, Any] | None = None
                   ) -> tuple[Parts, int | None]:
    """A client's infer request body and, when binary data follows the JSON, its length."""
    entries: list[dict[str, Any]] = []
    blobs: Parts = []
    for name, value in inputs.items():
        if isinstance(value, ShmTensor):
            entries.append({"name": name, "datatype": value.datatype, "shape": list(value.shape),
                            "parameters": _shm_params(value.ref)})
            continue
        entries.append(_tensor_entry(name, np.asarray(value), binary, blobs))
    header: dict[str, Any] = {"inputs": entries}
    if outputs:
        header["outputs"] = [_output_entry(o, binary) for o in outputs]
    params = dict(parameters or {})
    if binary:
        params["binary_data_output"] = True
    if params:
        header["parameters"] = params
    if request_id is not None:
        header["id"] = request_id
    head = _compact(header).encode()
    return [head, *blobs], len(head) if blobs else None


def _tensor_entry(name: str, array: np.ndarray, binary: bool, blobs: Parts) -> dict[str, Any]:
    """A tensor's JSON entry: its bytes appended to `blobs` (binary) or inline as `data`."""
    entry: dict[str, Any] = {"name": name, "datatype": triton_dtype(array.dtype),
                             "shape": list(array.shape)}
    if binary:
        raw = _to_bytes(array, name)
        entry["parameters"] = {"binary_data_size": len(raw)}
        blobs.append(raw)
    else:
        entry["data"] = _to_json(array, name)
    return entry


def _shm_params(ref: ShmRef) -> dict[str, Any]:
    return {"shared_memory_region": ref.region, "shared_memory_offset": ref.offset,
            "shared_memory_byte_size": ref.byte_size}


def _output_entry(out: RequestedOutput, binary: bool) -> dict[str, Any]:
    """A named output's entry; binary_data_output does not reach a named output, so a
    binary request says binary_data on each one that leaves it open."""
    params: dict[str, Any] = _shm_params(out.shm) if out.shm is not None else {}
    if out.shm is None and (out.binary is not None or binary):
        params["binary_data"] = binary if out.binary is None else out.binary
    return {"name": out.name, "parameters": params} if params else {"name": out.name}


@dataclass
class InferResponse:
    model: str
    version: str
    id: str | None
    outputs: dict[str, np.ndarray]  # JSON and binary outputs
    in_shm: dict[str, tuple[str, tuple[int, ...]]]  # outputs written to shm: datatype, shape


def decode_response(body: bytes, json_length: int | None = None) -> InferResponse:
    """A client's view of an infer response (the inverse of `encode_response`)."""
    json_length = len(body) if json_length is None else json_length
    header = _parse_json(body[:json_length])
    blob = memoryview(body)[json_length:]
    offset = 0
    outputs: dict[str, np.ndarray] = {}
    in_shm: dict[str, tuple[str, tuple[int, ...]]] = {}
    for raw in _list(header.get("outputs", []), "outputs"):
        entry = _mapping(raw, "output")
        name, datatype, shape = entry["name"], entry["datatype"], list(entry["shape"])
        params = _mapping(entry.get("parameters", {}), f"output {name} parameters")
        if "shared_memory_region" in params:
            in_shm[name] = (datatype, tuple(shape))
        elif "binary_data_size" in params:
            size = params["binary_data_size"]
            array = _from_bytes(blob[offset:offset + size], datatype, math.prod(shape), name)
            outputs[name] = array.reshape(shape)
            offset += size
        else:
            outputs[name] = _from_json(entry.get("data", []), datatype, shape, name)
    return InferResponse(header.get("model_name", ""), header.get("model_version", ""),
                         header.get("id"), outputs, in_shm)


def _to_bytes(array: np.ndarray, name: str) -> bytes | memoryview:
    if tensorbytes.is_bytes(array.dtype):
        return tensorbytes.pack(array, name)
    if array.size == 0:
        return b""  # a memoryview cannot be cast where a dim is 0
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return np.ascontiguousarray(little).data.cast("B")  # sent as it is: no copy


def _to_json(array: np.ndarray, name: str) -> list[Any]:
    if tensorbytes.is_bytes(array.dtype):
        return tensorbytes.to_json(array, name)
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return array.reshape(-1).tolist()


def parse_cost(text: bytes) -> int:
    """Bytes that parsing `text` makes in objects beyond its flat weight: counted with four
    C-speed scans before `json.loads` runs. Brackets and quotes inside strings count too: a
    charge may be high, never low."""
    return (CONTAINER_COST * (text.count(b"[") + text.count(b"{"))
            + QUOTE_COST * text.count(b'"') + ITEM_COST * text.count(b","))


def _parse_json(raw: bytes) -> dict[str, Any]:
    header = jsontext.loads(raw)
    if not isinstance(header, dict):
        raise InvalidInput("the request must be a JSON object")
    return header


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be an object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidInput(f"{what} must be a list")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be true or false")
    return value


def _shm_ref(params: Mapping[str, Any], what: str) -> ShmRef:
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    offset = params.get("shared_memory_offset", 0)
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{what}: shared_memory_region must be a non-empty string")
    for key, value in (("shared_memory_byte_size", size), ("shared_memory_offset", offset)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidInput(f"{what}: {key} must be a non-negative integer")
    return ShmRef(region, offset, size)  # type: ignore[arg-type]


def _refuse_unclaimed(params: Mapping[str, Any], unclaimed: Mapping[str, str],
                      what: str) -> None:
    if params.keys().isdisjoint(unclaimed):
        return
    for key, feature in unclaimed.items():
        if key in params:
            raise InvalidInput(f"{what}: parameter {key!r} needs {feature}, which edged does "
                               "not support")


def _priority(value: Any) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput("parameters.priority must be a non-negative integer")
    return value


def _timeout(value: Any) -> float | None:
    """Triton's `timeout` parameter is in microseconds; 0 means none."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_TIMEOUT_US:
        raise InvalidInput("parameters.timeout must be an integer number of microseconds in "
                           f"0..{MAX_TIMEOUT_US}")
    return value / 1e6 or None
