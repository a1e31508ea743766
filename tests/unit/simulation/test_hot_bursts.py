"""The hot-model rule with ``arrival-cost`` counts a burst's requests as one episode."""

from __future__ import annotations

import pytest

from modelyard.manager.episodes import HOT_CORRELATED_S, EpisodeWeights, hot_weights
from modelyard.manager.eviction import ArrivalCostPolicy, DemandTracker, LruPolicy


def test_a_burst_does_not_outrank_a_steady_model_in_the_hot_set() -> None:
    plain, paired = DemandTracker(60.0), DemandTracker(60.0)
    weights = hot_weights(ArrivalCostPolicy(period_s=None))
    assert isinstance(weights, EpisodeWeights)
    assert weights.correlated_s == HOT_CORRELATED_S == 0.2
    requests = [("burst", 100.0 + i * 0.01) for i in range(10)]  # ten, 10 ms apart
    requests += [("steady", t) for t in (98.0, 99.0, 100.5)]  # three, a second or so apart
    for key, t in sorted(requests, key=lambda kt: kt[1]):
        plain.observe(key, t)
        paired.observe(key, t, weights(key, t))
    assert list(plain.hot(100.5, fraction=0.5)) == ["burst"]
    assert list(paired.hot(100.5, fraction=0.5)) == ["steady"]
    # The burst counts its first request and 0.05 of each of the nine after it.
    assert paired.demand("burst", 100.09) == pytest.approx(1 + 9 * 0.05, rel=1e-3)


def test_other_policies_leave_the_hot_rule_counting_requests() -> None:
    assert hot_weights(LruPolicy()) is None


def test_episode_weights_are_bounded() -> None:
    weights = EpisodeWeights(0.2, max_models=1)
    assert weights("a", 0.0) == 1.0
    assert weights("a", 0.1) == pytest.approx(0.5)
    assert weights("b", 0.1) == 1.0
    assert weights("b", 0.11) == 1.0, "not tracked: past the bound, every request weighs 1"
