"""What a request counts for in the hot-model rule's demand, when bursts count once.

With ``arrival-cost`` the hot rule (admission's: the top decile of recent demand is
evicted last) counts a request closer than :data:`HOT_CORRELATED_S` to its model's
previous one by its share of that time, as the policy counts episodes. Counted as
plain requests, a burst of sixty requests in two seconds held its model in the hot
set, and up to half the budget with the others, for minutes after the burst (issue
16, the bursty trace). Session 8 counted at 0.2 s (0.747x -> 0.726x LRU's cold-start
seconds); since the policy keeps a model inside a burst last of all while the burst
lasts (``MID_EPISODE_S``), the hot rule counts at the policy's own 1 s (with the demand
ranked per MiB, 0.702x -> 0.694x; BENCHMARKS.md §17 session 9). Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from modelyard.manager.eviction import CORRELATED_S, ArrivalCostPolicy, EvictionPolicy

HOT_CORRELATED_S = CORRELATED_S
"""Requests of one model closer than this are (part of) one episode for the hot rule."""


class EpisodeWeights:
    """``weights(key, now)``: the weight of a request for ``key`` at ``now``, from the
    time since its previous one (1 for the first, and for any ``correlated_s`` or more
    later). Bounded: past ``max_models`` models, new ones weigh 1."""

    def __init__(self, correlated_s: float = HOT_CORRELATED_S, max_models: int = 10_000) -> None:
        if correlated_s <= 0:
            raise ValueError("correlated_s must be positive")
        self.correlated_s = correlated_s
        self._max_models = max_models
        self._last: dict[Hashable, float] = {}

    def __call__(self, key: Hashable, now: float) -> float:
        last = self._last.get(key)
        if last is None and len(self._last) >= self._max_models:
            return 1.0
        self._last[key] = now
        if last is None:
            return 1.0
        return min(1.0, max(0.0, now - last) / self.correlated_s)

    def run(self, key: Hashable, times: Sequence[float]) -> list[float]:
        """The weights of requests for ``key`` at ``times`` (ascending): one call per
        request, in order, without a call each."""
        last = self._last.get(key)
        if last is None and len(self._last) >= self._max_models:
            return [1.0] * len(times)
        correlated = self.correlated_s
        weights = []
        for now in times:  # min(1.0, max(0.0, gap) / correlated), without calls
            if last is None:
                weights.append(1.0)
            else:
                gap = now - last
                weight = (gap if gap > 0.0 else 0.0) / correlated
                weights.append(weight if weight < 1.0 else 1.0)
            last = now
        self._last[key] = times[-1]
        return weights


def hot_weights(policy: EvictionPolicy) -> EpisodeWeights | None:
    """The request weights the hot rule's demand uses with ``policy`` (None: 1 each)."""
    return EpisodeWeights() if isinstance(policy, ArrivalCostPolicy) else None
