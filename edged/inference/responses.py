"""The response cache, with Triton's semantics: a model that opts in (`response_cache: true` in
its model.yaml) has requests answered from here when the same model version was already asked
the same thing (every input's name, dtype, shape and bytes, and the outputs asked for). One
byte budget for every model (`cache.responses_mb`), least recently used entries out first; a
version's entries go when it is unloaded, evicted or swapped out. Only the API's requests are
looked up (a camera's frames are never byte-identical, and hashing them costs), and never those
that write outputs into shared memory or that ask a model marked `deterministic: false`.

Inputs up to SMALL_INPUT_BYTES are keyed by their bytes; larger ones by their SHA-256 (OpenSSL's,
~1 GB/s here), so a key never holds a large copy and a collision is not a practical worry.
Entries hold their own read-only copies of the outputs asked for, never views of a batch."""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edged.model.tensor import TensorSpec

Outputs = dict[str, np.ndarray]
# (model, version, outputs asked for, then per input: name, dtype, shape, bytes or digest)
Key = tuple[object, ...]
SMALL_INPUT_BYTES = 4096
# What an entry costs beyond its arrays' bytes: the key, the dict and OrderedDict slots, the
# arrays' headers. Charged so that a budget full of tiny answers still bounds memory.
ENTRY_OVERHEAD_BYTES = 512
OBJECT_ELEMENT_BYTES = 64  # a BYTES output element held as a Python object, beyond its bytes


@dataclass(frozen=True)
class Miss:
    """A lookup that found nothing: what the request's answer is inserted under."""

    model: str
    version: int
    outputs: tuple[str, ...]  # asked for (empty: all): what the entry keeps
    key: Key
    generation: int
    lookup_ns: int


@dataclass
class _Entry:
    outputs: Outputs
    nbytes: int


class ResponseCache:
    """Answers by key under a byte budget (LRU). Thread-safe: lookups come from the event loop,
    inserts from whichever thread ran the batch."""

    def __init__(self, budget_bytes: int, *,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.budget_bytes = budget_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[Key, _Entry] = OrderedDict()
        self._generation: dict[tuple[str, int], int] = {}
        self.bytes = 0
        self.evictions = 0  # entries dropped to stay within the budget
        self.refused = 0  # answers larger than the whole budget, never kept

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def snapshot(self) -> dict[str, int]:
        """What `/metrics` shows of the cache as a whole."""
        with self._lock:
            return {"bytes": self.bytes, "budget_bytes": self.budget_bytes,
                    "entries": len(self._entries), "evictions": self.evictions}

    def lookup(self, model: str, version: int, inputs: Mapping[str, np.ndarray],
               specs: Sequence[TensorSpec], outputs: tuple[str, ...]
               ) -> tuple[Outputs | None, Miss | int]:
        """(the cached answer, how long the lookup took in ns) on a hit; (None, a Miss to
        insert the answer under) otherwise."""
        began = self._clock()
        key = make_key(model, version, inputs, specs, outputs)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry.outputs, self._clock() - began
            generation = self._generation.get((model, version), 0)
        return None, Miss(model, version, outputs, key, generation, self._clock() - began)

    def insert(self, miss: Miss, outputs: Mapping[str, np.ndarray]) -> int | None:
        """Keep `outputs` (copied) under the miss's key; return how long the lookup and this
        insert took in ns, or None when an equal key was already there (another request
        inserted it meanwhile: as Triton, not counted as a miss). A version forgotten since
        the lookup is not cached; an answer larger than the budget is not kept."""
        began = self._clock()
        owned = {name: _owned(array) for name, array in outputs.items()}
        nbytes = ENTRY_OVERHEAD_BYTES + _key_bytes(miss.key) + sum(map(_nbytes, owned.values()))
        with self._lock:
            if miss.key in self._entries:
                return None
            if self._generation.get((miss.model, miss.version), 0) == miss.generation:
                if nbytes > self.budget_bytes:
                    self.refused += 1
                else:
                    self._entries[miss.key] = _Entry(owned, nbytes)
                    self.bytes += nbytes
                    while self.bytes > self.budget_bytes:
                        _, old = self._entries.popitem(last=False)
                        self.bytes -= old.nbytes
                        self.evictions += 1
        return miss.lookup_ns + self._clock() - began

    def forget(self, model: str, version: int) -> None:
        """Drop every entry of `model:version` (unloaded, evicted or swapped out); answers
        still being computed for it are not cached."""
        with self._lock:
            self._generation[(model, version)] = self._generation.get((model, version), 0) + 1
            doomed = [k for k in self._entries if k[0] == model and k[1] == version]
            for key in doomed:
                self.bytes -= self._entries.pop(key).nbytes


def make_key(model: str, version: int, inputs: Mapping[str, np.ndarray],
             specs: Sequence[TensorSpec], outputs: tuple[str, ...]) -> Key:
    """The key of a request already checked against `specs` (the model's inputs, so every
    name is there): its model version, the outputs it asks for, and each input's dtype,
    shape and content."""
    parts: list[object] = [model, version, outputs]
    for spec in specs:
        array = inputs[spec.name]
        parts += (spec.name, array.dtype.str, array.shape, _content(array))
    return tuple(parts)


def _content(array: np.ndarray) -> bytes:
    """The bytes of a small input, or the SHA-256 of a larger one's (BYTES elements length-
    prefixed, so that ["ab", "c"] and ["a", "bc"] differ)."""
    if array.dtype == np.object_:
        digest = hashlib.sha256()
        for item in array.reshape(-1):
            raw = item.encode() if isinstance(item, str) else bytes(item)
            digest.update(len(raw).to_bytes(8, "little"))
            digest.update(raw)
        return b"S" + digest.digest()
    if not array.flags.c_contiguous:
        array = np.ascontiguousarray(array)
    if array.nbytes <= SMALL_INPUT_BYTES:
        return b"B" + array.tobytes()
    return b"H" + hashlib.sha256(array.data.cast("B") if array.size else b"").digest()


def _owned(array: np.ndarray) -> np.ndarray:
    """A read-only copy the entry alone holds (never a view into a batch's outputs)."""
    copy = np.array(array, copy=True, order="C")
    copy.flags.writeable = False
    return copy


def _nbytes(array: np.ndarray) -> int:
    if array.dtype != np.object_:
        return int(array.nbytes)
    return int(array.nbytes) + sum(OBJECT_ELEMENT_BYTES + len(item) for item in array.flat)


def _key_bytes(key: Key) -> int:
    return sum(len(part) for part in key if isinstance(part, bytes))
