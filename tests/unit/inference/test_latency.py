"""Request latency as a histogram: each request in its bucket (`le`, inclusive), cumulative
buckets as Prometheus exposes them, and percentiles read back as `histogram_quantile` does."""

from __future__ import annotations

import pytest

from edged.inference.latency import BOUNDS_S, cumulative, empty, merged, observe, percentile


def test_observe_when_a_time_is_on_a_bound_counts_it_in_that_bucket() -> None:
    counts = empty()
    observe(counts, 1_000_000)  # 1 ms exactly: le="0.001"
    observe(counts, 1_000_001)
    observe(counts, 60 * 10**9)  # above every bound
    assert counts[BOUNDS_S.index(0.001)] == 1
    assert counts[BOUNDS_S.index(0.0025)] == 1
    assert counts[-1] == 1


def test_cumulative_when_given_counts_is_prometheus_buckets_ending_in_inf() -> None:
    counts = empty()
    for ns in (100_000, 700_000, 700_000, 3 * 10**9):
        observe(counts, ns)
    buckets = cumulative(counts)
    assert buckets[0] == ("0.0005", 1) and buckets[1] == ("0.001", 3)
    assert buckets[-2] == ("10", 4) and buckets[-1] == ("+Inf", 4)


def test_percentile_when_requests_fill_a_bucket_interpolates_inside_it() -> None:
    counts = empty()
    for _ in range(100):
        observe(counts, 3_000_000)  # all in (2.5 ms, 5 ms]
    assert percentile(counts, 50) == pytest.approx(0.00375)
    assert percentile(counts, 99) == pytest.approx(0.0025 + 0.0025 * 0.99)


def test_percentile_when_no_requests_is_none_and_above_the_bounds_the_last_bound() -> None:
    assert percentile(empty(), 50) is None
    counts = empty()
    observe(counts, 100 * 10**9)
    assert percentile(counts, 99) == BOUNDS_S[-1]


def test_merged_when_two_versions_are_summed_adds_bucket_by_bucket() -> None:
    a, b = empty(), empty()
    observe(a, 1)
    observe(b, 1)
    observe(b, 10**9)
    assert sum(merged(a, b)) == 3 and merged(a, b)[0] == 2
