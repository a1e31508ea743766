"""MemoryBudget and the eviction policy: pure accounting, no processes."""

from __future__ import annotations

from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.manager.budget import MemoryBudget
from modelyard.manager.eviction import LruPolicy, select_victims
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState

A, B, C = ModelKey("a", "1"), ModelKey("b", "1"), ModelKey("c", "1")


def test_reserve_within_budget_only() -> None:
    budget = MemoryBudget({"cpu": 100})
    assert budget.try_reserve("cpu", A, 60)
    assert not budget.try_reserve("cpu", B, 50)
    assert budget.device("cpu").reserved_bytes == 60
    assert budget.try_reserve("cpu", B, 40)
    assert budget.device("cpu").free_bytes == 0


def test_resize_shrinks_always_and_grows_within_budget() -> None:
    budget = MemoryBudget({"cpu": 100})
    budget.try_reserve("cpu", A, 60)
    budget.try_reserve("cpu", B, 30)
    assert budget.resize("cpu", A, 20)
    assert budget.reserved("cpu", A) == 20
    assert not budget.resize("cpu", A, 80)
    assert budget.reserved("cpu", A) == 20, "a refused resize leaves the reservation as it was"
    assert budget.release("cpu", A) == 20
    assert budget.device("cpu").reserved_bytes == 30


def _record(
    name: str, *, priority: int, last_used: float, nbytes: int, busy: bool = False
) -> ModelRecord:
    cfg = ModelConfig(name=name, path=name, priority=priority)
    r = ModelRecord(key=ModelKey(name, "1"), config=cfg, path=Path(name), state=ModelState.READY)
    r.stats.last_used = last_used
    r.reserved_bytes = nbytes
    r.in_flight = 1 if busy else 0
    return r


def test_lru_prefers_idle_then_less_important_then_oldest() -> None:
    old = _record("old", priority=3, last_used=1, nbytes=10)
    new = _record("new", priority=3, last_used=5, nbytes=10)
    low = _record("low", priority=5, last_used=9, nbytes=10)
    busy = _record("busy", priority=9, last_used=0, nbytes=10, busy=True)
    order = [r.key.name for r in LruPolicy().order([new, busy, old, low])]
    assert order == ["low", "old", "new", "busy"]


def test_select_victims_takes_the_shortest_prefix_or_none() -> None:
    a = _record("a", priority=3, last_used=1, nbytes=30)
    b = _record("b", priority=3, last_used=2, nbytes=30)
    assert [r.key.name for r in select_victims(LruPolicy(), [b, a], 40) or []] == ["a", "b"]
    assert select_victims(LruPolicy(), [a, b], 0) == []
    assert select_victims(LruPolicy(), [a, b], 61) is None


def test_cost_aware_keeps_what_is_expensive_popular_and_small() -> None:
    from modelyard.manager.eviction import CostAwarePolicy

    cheap = _record("cheap", priority=3, last_used=9, nbytes=10 * 1024 * 1024)
    cheap.timings.total_s = 0.01
    costly = _record("costly", priority=3, last_used=1, nbytes=10 * 1024 * 1024)
    costly.timings.total_s = 2.0
    policy = CostAwarePolicy()
    # LRU would evict "costly" (older); cost-aware evicts the cheap-to-reload one.
    assert [r.key.name for r in policy.order([costly, cheap])] == ["cheap", "costly"]
    assert [r.key.name for r in LruPolicy().order([costly, cheap])] == ["costly", "cheap"]


def test_cost_aware_inflation_ages_out_old_favourites() -> None:
    from modelyard.manager.eviction import CostAwarePolicy

    policy = CostAwarePolicy()
    old = _record("old", priority=3, last_used=0, nbytes=1024 * 1024)
    old.timings.total_s = 0.1
    old.stats.requests = 50
    assert policy.value(old) == 5.0
    for i in range(3):
        victim = _record(f"v{i}", priority=3, last_used=0, nbytes=1024 * 1024)
        victim.timings.total_s = 0.1
        victim.stats.requests = 100
        policy.on_evict(victim)
    fresh = _record("fresh", priority=3, last_used=0, nbytes=1024 * 1024)
    fresh.timings.total_s = 0.1
    fresh.stats.requests = 1
    assert policy.inflation == 30.0  # each victim valued at the inflation it met, plus 10
    assert policy.value(fresh) > policy.value(old), "a newcomer starts above a stale favourite"
