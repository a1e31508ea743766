"""Every eviction policy on hand-written traces with known answers, Belady's MIN included.

The traces are replayed by the simulator with the manager's own policy objects; models
are all one size unless a test says otherwise, requests a second apart so every load
has finished before the next request.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from modelyard.config.model_config import ModelConfig
from modelyard.manager.eviction import (
    ArrivalCostPolicy,
    CostAwarePolicy,
    DecayedGdsfPolicy,
    DemandTracker,
    LfuPolicy,
    LruPolicy,
    cap_hot,
    demand_scale,
    make_policy,
    select_victims,
)
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.simulation.engine import SimResult, simulate
from modelyard.simulation.traces import MIB, ModelSpec, Request, Trace

SIZE = 10 * MIB


def _trace(names: str, *, sizes: dict[str, int] | None = None, load_s: float = 0.1) -> Trace:
    """One request per character of ``names``, a second apart."""
    sizes = sizes or {}
    models = {n: ModelSpec(n, sizes.get(n, SIZE), load_s) for n in dict.fromkeys(names)}
    return Trace("hand", [Request(float(i), n) for i, n in enumerate(names)], models)


def _sim(trace: Trace, policy: str, budget: int, pinned: frozenset[str] = frozenset()) -> SimResult:
    """Replay with no hot rule, no service time and unbounded parallel loads."""
    return simulate(
        trace, policy, budget, hot_fraction=0.0, service_s=0.0, load_slots=0, pinned=pinned
    )


# The textbook reference string (Belady 1966; 3 frames: OPT 7 faults, LRU 10).
REFERENCE = "abcdabeabcde"


def test_belady_makes_the_optimal_seven_misses_on_the_reference_string() -> None:
    result = _sim(_trace(REFERENCE), "belady", 3 * SIZE)
    assert result.cold_starts == 7
    assert result.loads == 7


def test_lru_makes_ten_misses_on_the_reference_string() -> None:
    result = _sim(_trace(REFERENCE), "lru", 3 * SIZE)
    assert result.cold_starts == 10


@pytest.mark.parametrize("policy", ["lru", "lfu", "cost", "gdsf-decay", "arrival-cost"])
def test_no_online_policy_beats_belady(policy: str) -> None:
    trace = _trace("abcabdabeacbdeabfabcadbe" * 3)
    online = _sim(trace, policy, 3 * SIZE)
    best = _sim(trace, "belady", 3 * SIZE)
    assert best.cold_starts <= online.cold_starts


def test_lru_evicts_the_least_recently_used() -> None:
    # a b c a d: at d, b is the least recently used (a was used again).
    trace = _trace("abcad" + "b")
    result = _sim(trace, "lru", 3 * SIZE)
    assert result.loads_by_model["b"] == 2, "b was evicted for d and loaded again"
    assert result.loads_by_model["a"] == 1


def test_lfu_keeps_the_frequent_model_even_when_it_is_old() -> None:
    # a is asked three times, then b, c, d: LRU would evict a for d; LFU evicts b.
    trace = _trace("aaabcd" + "a")
    lfu = _sim(trace, "lfu", 3 * SIZE)
    lru = _sim(trace, "lru", 3 * SIZE)
    assert lfu.loads_by_model["a"] == 1
    assert lru.loads_by_model["a"] == 2


def test_gdsf_keeps_the_model_that_is_expensive_to_reload() -> None:
    # Same size, same requests; "slow" takes 5 s to load, "fast" 0.1 s: GDSF evicts fast.
    models = {
        "slow": ModelSpec("slow", SIZE, 5.0),
        "fast": ModelSpec("fast", SIZE, 0.1),
        "new": ModelSpec("new", SIZE, 0.1),
    }
    reqs = [Request(0, "slow"), Request(10, "fast"), Request(20, "new"), Request(30, "slow")]
    trace = Trace("cost", reqs, models)
    gdsf = _sim(trace, "cost", 2 * SIZE)
    lru = _sim(trace, "lru", 2 * SIZE)
    assert gdsf.loads_by_model["slow"] == 1
    assert lru.loads_by_model["slow"] == 2
    assert gdsf.cold_start_s < lru.cold_start_s


def test_gdsf_prefers_evicting_the_big_model() -> None:
    # Equal popularity and reload time: x (small, oldest) then b (twice the size) fill
    # the room; y needs one more slot. LRU evicts x, the oldest; GDSF evicts b, the
    # lowest value per byte, so x is still there when asked again.
    trace = _trace("xbyx", sizes={"b": 2 * SIZE})
    gdsf = _sim(trace, "cost", 3 * SIZE)
    lru = _sim(trace, "lru", 3 * SIZE)
    assert gdsf.loads_by_model["x"] == 1
    assert lru.loads_by_model["x"] == 2


def test_decayed_gdsf_forgets_yesterdays_favourite() -> None:
    # "old" was asked 50 times an hour ago; "now" twice in the last minute. Plain GDSF
    # (all-time counts) keeps old; the decayed one keeps now.
    models = {n: ModelSpec(n, SIZE, 0.1) for n in ("old", "now", "other")}
    reqs = [Request(i * 0.1, "old") for i in range(50)]
    reqs += [Request(3600.0, "now"), Request(3601.0, "now"), Request(3602.0, "other")]
    reqs += [Request(3603.0, "now"), Request(3604.0, "old")]
    trace = Trace("decay", reqs, models)
    decayed = _sim(trace, "gdsf-decay", 2 * SIZE)
    plain = _sim(trace, "cost", 2 * SIZE)
    assert decayed.loads_by_model["now"] == 1, "decayed GDSF evicted old for other"
    assert plain.loads_by_model["now"] == 2, "plain GDSF evicted now: old has 50 requests"


def test_arrival_cost_does_not_keep_a_burst_over_a_steady_model() -> None:
    # s every 10 s; b: 30 requests in 0.3 s (one cold start); x needs b's or s's room.
    # LFU and GDSF over decayed demand count b's 30 requests and evict s, which is asked
    # again at 30 s; arrival-cost counts b's burst as one episode and evicts b.
    models = {n: ModelSpec(n, SIZE, 0.1) for n in ("s", "b", "x")}
    reqs = [Request(t, "s") for t in (0.0, 10.0, 20.0)]
    reqs += [Request(21.0 + i * 0.01, "b") for i in range(30)]
    reqs += [Request(25.0, "x"), Request(30.0, "s")]
    trace = Trace("burst", reqs, models)
    assert _sim(trace, "arrival-cost", 2 * SIZE).loads_by_model["s"] == 1
    for other in ("lfu", "gdsf-decay"):
        assert _sim(trace, other, 2 * SIZE).loads_by_model["s"] == 2, other


def _day_and_night() -> Trace:
    """A 100-s day: d asked for in its first half (days 0-2), n in its second (days 0-1);
    at t = 250 (night) x needs room for one of them, and n is asked for at 256."""
    models = {n: ModelSpec(n, SIZE, 0.1) for n in ("d", "n", "x")}
    reqs = [Request(day * 100 + b * 10 + 5.0, "d") for day in range(3) for b in range(5)]
    reqs += [Request(day * 100 + b * 10 + 55.0, "n") for day in range(2) for b in range(4)]
    reqs += [Request(250.0, "x"), Request(256.0, "n")]
    return Trace("day", sorted(reqs, key=lambda r: r.t), models)


def test_arrival_cost_evicts_the_model_whose_day_is_over() -> None:
    # Without the cycle, d (15 episodes, idle 5 s) outranks n (8, idle 65 s) and n is
    # evicted, to be reloaded 6 s later; with it, d is known to sleep until morning.
    trace = _day_and_night()
    runs = [
        simulate(
            trace,
            "arrival-cost",
            2 * SIZE,
            hot_fraction=0.0,
            service_s=0.0,
            load_slots=0,
            period_s=period,
        )
        for period in (100.0, 0.0)
    ]
    daily, flat = runs
    assert daily.loads_by_model["n"] == 1
    assert flat.loads_by_model["n"] == 2


def test_the_hot_rule_ranks_demand_by_the_time_of_day() -> None:
    d = DemandTracker(half_life_s=60.0)
    for i in range(20):
        for _ in range(i + 1):
            d.observe(f"m{i}", 0.0)
    # m19 has the most recent demand but its day is over: m18 and m17 are hot now.
    assert set(d.hot(0.0, scale=lambda k, now: 0.1 if k == "m19" else 1.0)) == {"m18", "m17"}
    d.scale = lambda k, now: 0.1 if k == "m18" else 1.0  # what the manager pairs it with
    assert set(d.hot(0.0)) == {"m19", "m17"}
    # arrival-cost pairs it with its hot_scale: the time of day's factor times the
    # reload seconds per MiB (tests/unit/simulation/test_hot_bursts.py).
    for period in (100.0, None):
        policy = ArrivalCostPolicy(period_s=period)
        assert demand_scale(policy) == policy.hot_scale
    assert demand_scale(LruPolicy()) is None


# ---------------------------------------------------------------- rules every policy keeps


def _record(name: str, *, last_used: float = 0.0, requests: int = 1, pending: int = 0,
            priority: int = 1, size: int = SIZE) -> ModelRecord:  # fmt: skip
    r = ModelRecord(
        ModelKey(name, "1"), ModelConfig(name=name, path=name, priority=priority), Path(name)
    )
    r.stats.last_used = last_used
    r.stats.requests = requests
    r.leases = pending
    r.reserved_bytes = size
    r.timings.total_s = 0.1
    return r


@pytest.mark.parametrize("name", ["lru", "lfu", "cost", "gdsf-decay", "arrival-cost"])
def test_idle_before_busy_and_less_important_first(name: str) -> None:
    policy = make_policy(name)
    busy = _record("busy", last_used=0.0, requests=1, pending=2)
    idle = _record("idle", last_used=10.0, requests=100)
    minor = _record("minor", last_used=20.0, requests=1000, priority=5)
    assert [r.key.name for r in policy.order([busy, idle, minor])] == ["minor", "idle", "busy"]


def test_pinned_models_are_never_evicted_in_the_simulator() -> None:
    trace = _trace("pabcdpabcd")
    result = _sim(trace, "lru", 2 * SIZE, pinned=frozenset({"p"}))
    assert result.loads_by_model["p"] == 1


def test_a_hot_model_is_the_victim_only_after_every_colder_one() -> None:
    hot = _record("hot", last_used=0.0)  # LRU's first choice
    cold = [_record(f"c{i}", last_used=10.0 + i) for i in range(3)]
    policy = LruPolicy()
    victims = select_victims(policy, [hot, *cold], 2 * SIZE, {hot.key: 50.0})
    assert victims is not None
    assert hot not in victims
    assert [v.key.name for v in victims] == ["c0", "c1"]
    everything = select_victims(policy, [hot, *cold], 4 * SIZE, {hot.key: 50.0})
    assert everything is not None
    assert everything[-1] is hot


def test_demand_decays_by_half_each_half_life() -> None:
    d = DemandTracker(half_life_s=10.0)
    for _ in range(8):
        d.observe("a", 0.0)
    assert d.demand("a", 0.0) == pytest.approx(8.0)
    assert d.demand("a", 10.0) == pytest.approx(4.0)
    assert d.demand("a", 30.0) == pytest.approx(1.0)
    d.observe("a", 30.0)
    assert d.demand("a", 30.0) == pytest.approx(2.0)


def test_the_hot_decile_is_the_top_tenth_by_recent_demand() -> None:
    d = DemandTracker(half_life_s=60.0)
    for i in range(20):
        for _ in range(i + 1):
            d.observe(f"m{i}", 0.0)
    assert set(d.hot(0.0)) == {"m19", "m18"}
    # Capped by size: the hottest always, the next only if both fit.
    assert set(cap_hot(d.hot(0.0), {"m19": 60, "m18": 50}, 100)) == {"m19"}
    assert set(cap_hot(d.hot(0.0), {"m19": 60, "m18": 40}, 100)) == {"m19", "m18"}


def test_the_policies_are_the_configured_ones() -> None:
    assert isinstance(make_policy("lru"), LruPolicy)
    assert isinstance(make_policy("lfu"), LfuPolicy)
    assert type(make_policy("cost")) is CostAwarePolicy
    assert isinstance(make_policy("gdsf-decay"), DecayedGdsfPolicy)
    assert isinstance(make_policy("arrival-cost"), ArrivalCostPolicy)
    with pytest.raises(ValueError, match="belady"):
        make_policy("belady")
    assert math.isfinite(DecayedGdsfPolicy().value(_record("x")))


def test_load_slots_queue_simultaneous_loads_that_an_unbounded_replay_runs_at_once() -> None:
    # Four models, all requested at t=0, all fitting: no eviction, so the only
    # difference between the replays is the slot queue. With two slots the third and
    # fourth loads start when the first two end: waits 1, 1, 2, 2 s against 1 each.
    models = {n: ModelSpec(n, SIZE, 1.0) for n in "abcd"}
    trace = Trace("burst", [Request(0.0, n) for n in "abcd"], models)
    runs = {
        slots: simulate(trace, "lru", 4 * SIZE, hot_fraction=0.0, service_s=0.0, load_slots=slots)
        for slots in (0, 2, 4)
    }
    assert runs[0].cold_start_s == pytest.approx(4.0)
    assert runs[2].cold_start_s == pytest.approx(6.0)
    assert runs[4].cold_start_s == pytest.approx(4.0), "as many slots as loads: no queue"
    assert all(r.loads == 4 and r.evictions == 0 for r in runs.values())
