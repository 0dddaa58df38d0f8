"""Request latency (queue wait + compute) as a histogram: counts per fixed bucket, kept by the
batcher per model version (a bisect and an increment per request), exported to Prometheus as
`edged_inference_request_latency_seconds` and read back as percentiles the way Prometheus'
`histogram_quantile` reads them (the status page's p50/p99)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

# Upper bounds (Prometheus' `le`), seconds: a Jetson's sub-millisecond classifier to a
# multi-second first run.
BOUNDS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
            10.0)
_BOUNDS_NS = tuple(round(b * 1e9) for b in BOUNDS_S)


def empty() -> list[int]:
    """Counts per bucket: one per bound, and the last for what is above every bound."""
    return [0] * (len(BOUNDS_S) + 1)


def observe(counts: list[int], ns: int) -> None:
    counts[bisect_left(_BOUNDS_NS, ns)] += 1


def observe_each(counts: list[int], waits_ns: Sequence[int], ns: int) -> None:
    """A batch's requests: each one's own wait + the batch's `ns`, in one call."""
    for wait in waits_ns:
        counts[bisect_left(_BOUNDS_NS, wait + ns)] += 1


def merged(a: Sequence[int], b: Sequence[int]) -> list[int]:
    return [x + y for x, y in zip(a, b, strict=True)]


def cumulative(counts: Sequence[int]) -> list[tuple[str, int]]:
    """(le, requests at or under it) as Prometheus' histogram buckets, `+Inf` last."""
    out, total = [], 0
    for bound, count in zip((*(f"{b:g}" for b in BOUNDS_S), "+Inf"), counts, strict=True):
        total += count
        out.append((bound, total))
    return out


def percentile(counts: Sequence[int], q: float) -> float | None:
    """The q-th percentile (0..100) in seconds, interpolated linearly inside its bucket as
    `histogram_quantile` does; None with no requests. Above the last bound: the last bound."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q / 100 * total
    seen = 0
    for i, count in enumerate(counts):
        if count and seen + count >= rank:
            if i == len(BOUNDS_S):
                return BOUNDS_S[-1]
            low = BOUNDS_S[i - 1] if i else 0.0
            return low + (BOUNDS_S[i] - low) * (rank - seen) / count
        seen += count
    return BOUNDS_S[-1]
