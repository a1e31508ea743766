"""The ``arrival-cost`` eviction policy's ordering decisions, on hand-made request histories.

Its value of a model is ``episodes * reload_seconds / MiB * urgency`` (docs/caching.md):
each test pins one factor and checks the order against the policies that lack it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.manager.eviction import (
    MID_EPISODE_S,
    ArrivalCostPolicy,
    DecayedGdsfPolicy,
    EvictionPolicy,
    LfuPolicy,
    make_policy,
    select_victims,
)
from modelyard.manager.gap_histogram import GapHistograms
from modelyard.manager.records import ModelKey, ModelRecord

MIB = 1024 * 1024


def _record(name: str, *, mib: int = 10, load_s: float = 0.1) -> ModelRecord:
    r = ModelRecord(ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name))
    r.reserved_bytes = mib * MIB
    r.timings.total_s = load_s
    return r


def _ask(policies: Sequence[EvictionPolicy], record: ModelRecord, times: list[float]) -> None:
    """Tell every policy of requests for ``record`` at ``times`` (as the manager does)."""
    for t in times:
        record.stats.requests += 1
        record.stats.last_used = t
        for p in policies:
            p.on_request(record, t)


def _names(records: list[ModelRecord]) -> list[str]:
    return [r.key.name for r in records]


def test_a_burst_counts_as_one_episode() -> None:
    # "burst": 50 requests within half a second (one cold start); "steady": one a minute.
    # LFU and GDSF over decayed demand count requests and evict steady; arrival-cost
    # counts episodes and evicts the burst.
    policy, lfu, gdsf = ArrivalCostPolicy(), LfuPolicy(), DecayedGdsfPolicy()
    burst, steady, other = _record("burst"), _record("steady"), _record("other")
    _ask([policy, lfu, gdsf], burst, [i * 0.01 for i in range(50)])
    _ask([policy, lfu, gdsf], steady, [0.0, 60.0, 120.0])
    _ask([policy, lfu, gdsf], other, [150.0])
    assert (
        policy.episodes.demand(burst.key, 150.0) < 2.0 < policy.episodes.demand(steady.key, 150.0)
    )
    assert _names(policy.order([steady, burst])) == ["burst", "steady"]
    assert _names(lfu.order([steady, burst])) == ["steady", "burst"]
    assert _names(gdsf.order([steady, burst])) == ["steady", "burst"]


def test_a_model_inside_a_burst_leaves_after_every_other_idle_model() -> None:
    # "steady" is asked once a minute; "burst" twenty times, 30 ms apart, ending at
    # t = 130.57. Its episode rate is lower (one burst is one episode), but while its
    # requests are still arriving its next one is due within milliseconds: it goes
    # last until MID_EPISODE_S has passed without a request, then first.
    policy = ArrivalCostPolicy(period_s=None)
    steady, burst, other = _record("steady"), _record("burst"), _record("other")
    _ask([policy], steady, [0.0, 60.0, 120.0])
    _ask([policy], burst, [130.0 + i * 0.03 for i in range(20)])
    assert policy.value(burst) < policy.value(steady)
    assert _names(policy.order([steady, burst])) == ["steady", "burst"]
    _ask([policy], other, [130.58 + MID_EPISODE_S])
    assert _names(policy.order([steady, burst])) == ["burst", "steady"]


def test_reload_seconds_per_mib_decide_between_equally_used_models() -> None:
    policy = ArrivalCostPolicy()
    big = _record("big", mib=100, load_s=0.32)  # fast per byte: ONNX, 100 MiB
    small = _record("small", mib=5, load_s=0.32)  # the same load time for 5 MiB
    slow = _record("slow", mib=100, load_s=3.0)  # a big model slow to start
    for r in (big, small, slow):
        _ask([policy], r, [0.0, 30.0, 60.0])
    assert _names(policy.order([small, slow, big])) == ["big", "slow", "small"]


def test_a_lapsed_model_leaves_before_a_timer_that_is_due() -> None:
    # "lapsed": 21 requests 10 s apart, then silent for 800 s (its gaps were never over
    # 10 s). "timer": every 100 s, idle for 90 s. Lapsed has more (decayed) episodes, so
    # a frequency alone would evict the timer just before it is due; the gap histograms
    # say the timer is due and lapsed has stopped.
    policy = ArrivalCostPolicy()
    lapsed, timer = _record("lapsed"), _record("timer")
    _ask([policy], lapsed, [i * 10.0 for i in range(21)])
    _ask([policy], timer, [10.0 + i * 100.0 for i in range(10)])
    _ask([policy], _record("clock"), [1000.0])
    now = 1000.0
    assert policy.episodes.demand(lapsed.key, now) > policy.episodes.demand(timer.key, now)
    assert policy.gaps.urgency(timer.key, 90.0) > 1.0 > policy.gaps.urgency(lapsed.key, 800.0)
    assert _names(policy.order([timer, lapsed])) == ["lapsed", "timer"]


def test_yesterdays_favourite_is_forgotten() -> None:
    # 50 episodes five hours ago against 3 in the last minutes (half-life: half an hour).
    policy = ArrivalCostPolicy()
    old, new = _record("old"), _record("new")
    _ask([policy], old, [i * 2.0 for i in range(50)])
    _ask([policy], new, [18_000.0, 18_060.0, 18_120.0])
    assert _names(policy.order([new, old])) == ["old", "new"]
    assert _names(make_policy("cost").order([new, old])) == ["new", "old"]


def test_idle_before_busy_and_less_important_first_still_hold() -> None:
    policy = ArrivalCostPolicy()
    busy, idle = _record("busy", mib=200, load_s=0.02), _record("idle")
    _ask([policy], busy, [0.0])
    _ask([policy], idle, [i * 5.0 for i in range(20)])
    busy.leases = 1  # a request is using it: after every idle one, whatever its value
    assert policy.value(busy) < policy.value(idle)
    assert _names(policy.order([busy, idle])) == ["idle", "busy"]


def test_a_hot_model_is_the_victim_only_after_every_colder_one() -> None:
    # The hot model is the policy's first choice (big and cheap to reload), but it is in
    # the top decile of recent demand: colder models go first.
    policy = ArrivalCostPolicy()
    hot = _record("hot", mib=100, load_s=0.05)
    cold = [_record(f"c{i}", mib=10, load_s=1.0) for i in range(3)]
    _ask([policy], hot, [0.0])
    for i, r in enumerate(cold):
        _ask([policy], r, [float(i), 10.0 + i, 20.0 + i])
    assert policy.order([hot, *cold])[0] is hot
    victims = select_victims(policy, [hot, *cold], 20 * MIB, {hot.key: 50.0})
    assert victims is not None
    assert hot not in victims


def test_urgency_of_regular_gaps() -> None:
    gaps = GapHistograms(prior_gaps=0.0)
    assert gaps.urgency("never", 5.0) == 1.0
    for _ in range(10):
        gaps.add("timer", 100.0)
    assert gaps.urgency("timer", 90.0) > 5.0  # due within seconds of its 100 s period
    mean = gaps.urgency("timer", 10_000.0) * 10_000.0
    assert mean == pytest.approx(100.0, rel=0.2)  # beyond every gap: mean gap / idle time
    shrunk = GapHistograms(prior_gaps=10.0)
    for _ in range(10):
        shrunk.add("timer", 100.0)
    assert 1.0 < shrunk.urgency("timer", 90.0) < gaps.urgency("timer", 90.0)


def test_memoryless_gaps_give_an_urgency_near_one() -> None:
    # Gaps of an exponential distribution (mean 10 s) at its quantiles: the expected wait
    # does not depend on the idle time (up to the mean; beyond it the finite sample's
    # thin tail makes the estimate drift up, which the prior damps).
    gaps = GapHistograms(prior_gaps=0.0)
    n = 400
    for i in range(n):
        gaps.add("poisson", -10.0 * math.log(1 - (i + 0.5) / n))
    for idle in (0.0, 2.0, 5.0, 10.0):
        assert gaps.urgency("poisson", idle) == pytest.approx(1.0, abs=0.25), idle


def test_it_is_configurable_by_name() -> None:
    assert isinstance(make_policy("arrival-cost"), ArrivalCostPolicy)
    assert make_policy("arrival-cost").name == "arrival-cost"


def test_a_load_slowed_by_contention_does_not_set_the_reload_time() -> None:
    # Its first load took 0.1 s; the next waited for a core behind three others and
    # measured 0.4 s. The policy keeps ranking it by 0.1 s until five slow loads in a row.
    policy = ArrivalCostPolicy()
    r = _record("m", load_s=0.1)
    r.stats.loads = 1
    assert policy.reload_s(r) == pytest.approx(0.1)
    r.stats.loads, r.timings.total_s = 2, 0.4
    assert policy.reload_s(r) == pytest.approx(0.1)
    for n in range(3, 7):
        r.stats.loads = n
        policy.reload_s(r)
    assert policy.reload_s(r) == pytest.approx(0.4)
    # A queue wait the loader measured (load slots) is not the model's own time either.
    q = _record("q", load_s=0.5)
    q.stats.loads, q.timings.queue_wait_s = 1, 0.3
    assert policy.reload_s(q) == pytest.approx(0.2)
