"""What the cache reports about model versions: a state row per version (the API's index,
`/metrics`, the stats message, retained states and `edged status` read it) and each model's
load counters. Plain data, so readers need not import the cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edged.core.states import ModelState

if TYPE_CHECKING:
    from edged.inference.batching import BatcherStats


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: int
    state: ModelState
    backend: str | None = None
    providers: tuple[str, ...] = ()
    nbytes: int = 0
    in_use: int = 0
    pinned: bool = False
    load_seconds: float | None = None
    reason: str | None = None
    precision: str | None = None  # of the loaded session

    @property
    def device(self) -> str | None:
        """Where the loaded version runs: "dla0"/"dla1" (a TensorRT engine on a Jetson DLA
        core; its providers say "DLA<n>"), "gpu" or "cpu"; None when not loaded."""
        if self.backend is None or self.state is not ModelState.READY:
            return None
        for provider in self.providers:
            if " DLA" in provider:
                return "dla" + provider.split(" DLA", 1)[1][:1]
        if self.backend == "tensorrt" or any(
                p in ("TensorrtExecutionProvider", "CUDAExecutionProvider")
                for p in self.providers):
            return "gpu"
        return "cpu"


@dataclass
class ModelCounters:
    """One model's counts since the cache was made (they only grow), and how long each
    version's last load and warm-up took. Unloading a version by request (a swap, an unload
    call) is not an eviction: evictions are what the byte budget forced."""

    name: str
    loads: int = 0
    failed_loads: int = 0
    evictions: int = 0
    load_seconds: Mapping[int, float] = field(default_factory=dict)  # version -> seconds


@dataclass(frozen=True)
class InferenceCounters:
    """One model version's counters as `/metrics` and the stats message read them (Triton's
    meanings: a request may hold several rows, a batch execution runs several requests)."""

    model: str
    version: int
    success: int
    failure: int  # timeouts included
    inference_count: int
    exec_count: int
    request_ns: int
    queue_ns: int
    compute_ns: int
    pending: int  # requests queued now
    rejected: int = 0  # refused at submit: the queue was full (not in `failure`)
    timeouts: int = 0  # expired while queued, never run (also in `failure`)
    latency: tuple[int, ...] = ()  # requests per latency bucket (edged.inference.latency)
    cache_hits: int = 0  # answered from the response cache (also in `success`)
    cache_hit_ns: int = 0
    cache_misses: int = 0
    cache_miss_ns: int = 0

    @classmethod
    def of(cls, model: str, version: int, stats: BatcherStats, pending: int
           ) -> InferenceCounters:
        return cls(model, version, stats.success, stats.failure, stats.inference_count,
                   stats.exec_count, stats.request_ns, stats.queue_ns, stats.compute_ns,
                   pending, stats.rejected, stats.timeouts, tuple(stats.latency),
                   stats.cache_hits, stats.cache_hit_ns, stats.cache_misses,
                   stats.cache_miss_ns)
