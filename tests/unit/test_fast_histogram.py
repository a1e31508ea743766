"""FastHistogram writes what prometheus_client's Histogram writes, for the same values."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from modelyard.observability.histogram import FastHistogram
from modelyard.observability.metrics import BATCH_SIZE_BUCKETS, LATENCY_BUCKETS_S

VALUES = (0.0, 0.0005, 0.0007, 1, 2, 3, 30.0, 100.0, 1e9)


@pytest.mark.parametrize("buckets", [LATENCY_BUCKETS_S, BATCH_SIZE_BUCKETS])
def test_exposition_matches_prometheus_client(buckets: tuple[float, ...]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("h_seconds", "doc", ["model", "version"], buckets=buckets, registry=theirs)
    fast = FastHistogram("h_seconds", "doc", ["model", "version"], buckets=buckets, registry=ours)
    for model in ("a", "b"):
        for value in VALUES[: 5 if model == "a" else None]:
            ref.labels(model, "1").observe(value)
            fast.labels(model, "1").observe(value)
    expected = [
        line for line in generate_latest(theirs).decode().splitlines() if "_created" not in line
    ]
    assert generate_latest(ours).decode().splitlines() == expected


def test_value_on_a_bound_counts_in_that_bucket() -> None:
    registry = CollectorRegistry()
    fast = FastHistogram("h", "doc", ["m"], buckets=(1.0, 2.0), registry=registry)
    fast.labels("x").observe(1.0)
    assert registry.get_sample_value("h_bucket", {"m": "x", "le": "1.0"}) == 1.0
    assert registry.get_sample_value("h_count", {"m": "x"}) == 1.0


def test_bad_buckets_and_labels_are_refused() -> None:
    with pytest.raises(ValueError, match="increasing"):
        FastHistogram("h", "doc", ["m"], buckets=(2.0, 1.0), registry=CollectorRegistry())
    fast = FastHistogram("h", "doc", ["m"], buckets=(1.0,), registry=CollectorRegistry())
    with pytest.raises(ValueError, match="labels"):
        fast.labels("a", "b")


def test_a_batch_of_observations_counts_as_one_at_a_time() -> None:
    registry = CollectorRegistry()
    fast = FastHistogram("h_seconds", "doc", ["m"], buckets=LATENCY_BUCKETS_S, registry=registry)
    one, batched = fast.labels("one"), fast.labels("batched")
    waits = [0.0, 0.0005, 0.0007, 0.3, 0.1 + 0.2, 2.0, 1e9]
    for value in waits:
        one.observe(value)
    batched.observe_each(waits)
    for _ in range(5):
        one.observe(0.1)
    batched.observe_repeated(0.1, 5)
    batched.observe_repeated(0.1, 0)  # nothing
    assert batched.counts == one.counts
    assert batched.total == one.total, "the same additions in the same order"
