"""Pre-warming in the simulator: a timer among busier models becomes prefetch hits."""

from __future__ import annotations

import random

from modelyard.config.settings import PrefetchConfig
from modelyard.simulation.engine import SimResult, simulate
from modelyard.simulation.traces import MIB, ModelSpec, Request, Trace

PREWARM = PrefetchConfig(min_observations=10_000, sole_observations=10_000)
"""Pre-warming only (the Markov chain's predictions are not what is tested here)."""


def _run(trace: Trace, prefetch: PrefetchConfig | None = None) -> SimResult:
    """``arrival-cost`` with no hot rule and no daily cycle: the policy and the windows
    alone decide."""
    return simulate(
        trace, "arrival-cost", 20 * MIB, prefetch=prefetch, hot_fraction=0.0, period_s=0.0
    )


def _timer_trace(calls: int) -> Trace:
    """A timer ``t`` every 60 s; ``a`` and ``b`` at random (Poisson, 1 a second) in the
    first 50 s of each minute, and ``a`` once more at 56 s.

    Budget for two of the three models of 10 MiB: each call of ``t`` needs one of the
    others' room, so without pre-warming every call of ``t`` waits for its 2 s load.
    The request at 56 s is the one a pre-warm decision follows (the prefetcher decides
    after requests); nothing asks for ``a`` or ``b`` while ``t`` loads and waits.
    """
    requests = [Request(60.0 * k, "t") for k in range(calls)]
    rng = random.Random(1)
    for k in range(calls - 1):
        t = 60.0 * k + rng.expovariate(1.0)
        while t < 60.0 * k + 50.0:
            requests.append(Request(t, rng.choice("ab")))
            t += rng.expovariate(1.0)
        requests.append(Request(60.0 * k + 56.0, "a"))
    requests.sort(key=lambda r: r.t)
    models = {n: ModelSpec(n, 10 * MIB, 2.0 if n == "t" else 0.1) for n in ("t", "a", "b")}
    return Trace("timer", requests, models)


def test_every_call_of_a_timer_after_its_sixth_is_a_prefetch_hit() -> None:
    trace = _timer_trace(20)
    off = _run(trace)
    on = _run(trace, PREWARM)
    # Without: every call but the first finds the timer evicted by a or b.
    assert off.loads_by_model["t"] == 20
    assert off.prefetches == 0
    # With: five gaps are known after the sixth call; calls 7-20 find it pre-warmed,
    # due 2 x 2 s + 1 s = 5 s before its window opens and loaded after the request at
    # 56 s, ready at 58 s: none of them waits.
    assert on.prewarms == on.prefetches == 14
    assert on.prefetch_hits == 14
    assert on.prefetch_wasted == 0
    assert on.hidden_s == 14 * 2.0
    assert on.cold_start_s < off.cold_start_s - 14 * 2.0 + 1.0


def test_random_traffic_is_never_prewarmed() -> None:
    # Gaps of 1, 7, 3, 20, 2 s over and over: the idle times disagree, so no window.
    gaps = [1.0, 7.0, 3.0, 20.0, 2.0] * 8
    t, requests = 0.0, []
    for g in gaps:
        t += g
        requests.append(Request(t, "r"))
    requests += [Request(0.25 + i / 2, "ab"[i % 2]) for i in range(int(2 * t))]
    requests.sort(key=lambda r: r.t)
    models = {n: ModelSpec(n, 10 * MIB, 0.5) for n in ("r", "a", "b")}
    trace = Trace("random", requests, models)
    on = _run(trace, PREWARM)
    assert on.prewarms == 0
