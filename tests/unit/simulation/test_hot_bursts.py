"""The hot-model rule with ``arrival-cost`` counts a burst's requests as one episode."""

from __future__ import annotations

import pytest

from modelyard.manager.eviction import (
    HOT_CORRELATED_S,
    ArrivalCostPolicy,
    DemandTracker,
    LruPolicy,
    demand_scale,
)


def test_a_burst_does_not_outrank_a_steady_model_in_the_hot_set() -> None:
    plain, paired = DemandTracker(60.0), DemandTracker(60.0)
    demand_scale(ArrivalCostPolicy(period_s=None), paired)
    assert paired.correlated_s == HOT_CORRELATED_S == 0.2
    for tracker in (plain, paired):
        for i in range(10):  # a burst: ten requests 10 ms apart
            tracker.observe("burst", 100.0 + i * 0.01)
        for t in (98.0, 99.0, 100.5):  # three requests a second or so apart
            tracker.observe("steady", t)
    assert list(plain.hot(100.5, fraction=0.5)) == ["burst"]
    assert list(paired.hot(100.5, fraction=0.5)) == ["steady"]
    # The burst counts its first request and 0.05 of each of the nine after it.
    assert paired.demand("burst", 100.09) == pytest.approx(1 + 9 * 0.05, rel=1e-3)


def test_other_policies_leave_the_hot_rule_counting_requests() -> None:
    tracker = DemandTracker(60.0)
    assert demand_scale(LruPolicy(), tracker) is None
    assert tracker.correlated_s == 0.0
