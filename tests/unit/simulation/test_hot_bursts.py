"""The hot-model rule with ``arrival-cost``: a burst's requests count as one episode (as
the policy counts them), and demand is ranked by the reload seconds per MiB it saves."""

from __future__ import annotations

import pytest

from modelyard.manager.episodes import HOT_CORRELATED_S, EpisodeWeights, hot_weights
from modelyard.manager.eviction import (
    CORRELATED_S,
    ArrivalCostPolicy,
    DemandTracker,
    LruPolicy,
    demand_scale,
)
from tests.unit.manager.test_arrival_cost import _ask, _record


def test_a_burst_does_not_outrank_a_steady_model_in_the_hot_set() -> None:
    plain, paired = DemandTracker(60.0), DemandTracker(60.0)
    weights = hot_weights(ArrivalCostPolicy(period_s=None))
    assert isinstance(weights, EpisodeWeights)
    assert weights.correlated_s == HOT_CORRELATED_S == CORRELATED_S == 1.0
    requests = [("burst", 100.0 + i * 0.01) for i in range(10)]  # ten, 10 ms apart
    requests += [("steady", t) for t in (98.0, 99.0, 100.5)]  # three, a second or so apart
    for key, t in sorted(requests, key=lambda kt: kt[1]):
        plain.observe(key, t)
        paired.observe(key, t, weights(key, t))
    assert list(plain.hot(100.5, fraction=0.5)) == ["burst"]
    assert list(paired.hot(100.5, fraction=0.5)) == ["steady"]
    # The burst counts its first request and 0.01 of each of the nine after it.
    assert paired.demand("burst", 100.09) == pytest.approx(1 + 9 * 0.01, rel=1e-3)


def test_other_policies_leave_the_hot_rule_counting_requests() -> None:
    assert hot_weights(LruPolicy()) is None


def test_episode_weights_are_bounded() -> None:
    weights = EpisodeWeights(0.2, max_models=1)
    assert weights("a", 0.0) == 1.0
    assert weights("a", 0.1) == pytest.approx(0.5)
    assert weights("b", 0.1) == 1.0
    assert weights("b", 0.11) == 1.0, "not tracked: past the bound, every request weighs 1"


def test_the_hot_set_ranks_demand_by_reload_seconds_per_mib() -> None:
    # "big" (200 MiB, 0.62 s to load: 0.0031 s/MiB) has three requests, "small" (10 MiB,
    # 0.05 s: 0.005 s/MiB) two. By demand alone big is hotter; per byte kept, small
    # saves more reload seconds (2 x 0.005 > 3 x 0.0031), so it holds the hot place.
    policy = ArrivalCostPolicy(period_s=None)
    big, small = _record("big", mib=200, load_s=0.62), _record("small", mib=10, load_s=0.05)
    plain, scaled = DemandTracker(60.0), DemandTracker(60.0)
    scaled.scale = demand_scale(policy)
    for record, times in ((big, [1.0, 3.0, 5.0]), (small, [2.0, 4.0])):
        _ask([policy], record, times)
        for t in times:
            plain.observe(record.key, t)
            scaled.observe(record.key, t)
    assert list(plain.hot(5.0, fraction=0.5)) == [big.key]
    assert list(scaled.hot(5.0, fraction=0.5)) == [small.key]
    assert policy.hot_scale(big.key, 5.0) == pytest.approx(0.62 / 200)


def test_a_model_never_seen_resident_has_no_hot_place() -> None:
    # Its cost per MiB is unknown until it has held memory; it cannot be evicted before.
    policy = ArrivalCostPolicy(period_s=None)
    absent = _record("absent")
    absent.reserved_bytes = 0
    _ask([policy], absent, [1.0, 2.0])
    assert policy.hot_scale(absent.key, 2.0) == 0.0
