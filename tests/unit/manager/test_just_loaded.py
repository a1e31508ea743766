"""A model just loaded for the requests waiting on it is not taken back before they run.

Issue 16's fifty-model run with ``arrival-cost``: a load that had waited out its patience
evicts busy colder models, and the second-hottest model (busy, outside the hot set) was
evicted again as soon as its reload finished, before the requests it was reloaded for
had been routed to it; after three such turns they failed with "not ready".
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.manager.admission import _MAX_WAIT_S
from modelyard.manager.budget import MemoryBudget
from modelyard.manager.demand import DemandTracker
from modelyard.manager.hot_set import awaited, just_loaded
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState
from tests.unit.manager.admission_scene import lru_admission, new_model


class _Clock:
    """A clock the test moves: the load's patience runs out without waiting for it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def _record(name: str, budget: MemoryBudget, nbytes: int, last_used: float) -> ModelRecord:
    record = ModelRecord(ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name))
    record.device = "cpu"
    record.state = ModelState.READY
    record.leases = 1  # a request routed to it and not finished: busy
    record.stats.last_used = last_used
    record.state_since = last_used - 60  # loaded long ago
    assert budget.try_reserve("cpu", record.key, nbytes)
    record.reserved_bytes = nbytes
    return record


async def test_an_impatient_load_takes_the_older_busy_model_not_the_one_just_loaded() -> None:
    clock = _Clock()
    budget = MemoryBudget({"cpu": 100})
    # Both busy and colder than nothing (no demand tracker: no hot set). By LRU the
    # reloaded one goes first: its last use is older.
    reloaded = _record("reloaded", budget, 40, last_used=clock.now - 5)
    steady = _record("steady", budget, 40, last_used=clock.now - 1)
    new = new_model()
    records = [reloaded, steady, new]
    admission, evicted = lru_admission(budget, records, clock)
    admitting = asyncio.create_task(admission.admit(new, 50, None))
    await asyncio.sleep(0.05)
    assert evicted == []  # patient: both will be idle soon
    # The load runs out of patience just as "reloaded" comes READY again for its waiters.
    clock.now += _MAX_WAIT_S + 1
    reloaded.state_since = clock.now
    assert set(just_loaded(records, "cpu", clock.now, _MAX_WAIT_S)) == {reloaded.key}
    await asyncio.wait_for(admitting, timeout=5)
    assert evicted == ["steady"]
    assert reloaded.state is ModelState.READY


async def test_once_its_grace_is_over_a_reloaded_busy_model_is_a_victim_again() -> None:
    clock = _Clock()
    budget = MemoryBudget({"cpu": 100})
    reloaded = _record("reloaded", budget, 40, last_used=clock.now - 5)
    idle = _record("idle", budget, 10, last_used=clock.now)
    idle.leases = 0
    assert just_loaded([reloaded, idle], "cpu", clock.now, _MAX_WAIT_S) == {}
    reloaded.state_since = clock.now
    # Requests must wait for it: an idle model just loaded is not protected.
    reloaded.leases = 0
    assert just_loaded([reloaded, idle], "cpu", clock.now, _MAX_WAIT_S) == {}


async def test_no_load_takes_a_model_before_the_requests_it_was_loaded_for_wake_up() -> None:
    # The load that finished notified the loads waiting for room first: they run before
    # its own waiters are routed. One that must take hot models took the just-loaded one
    # (cold, so before them), though it was patient, and its requests found it draining.
    clock = _Clock()
    budget = MemoryBudget({"cpu": 100})
    hot = _record("hot", budget, 50, last_used=clock.now)
    hot.leases = 0
    loaded = _record("loaded", budget, 30, last_used=clock.now - 5)
    loaded.state_since = clock.now  # READY just now ...
    loaded.requests_awaiting_load = 1  # ... and its request has not woken up yet
    demand = DemandTracker()
    for _ in range(20):
        demand.observe(hot.key, clock.now)
    demand.observe(loaded.key, clock.now - 5)
    new = new_model()
    records = [hot, loaded, new]
    admission, evicted = lru_admission(budget, records, clock, demand)
    assert set(admission.hot()) == {hot.key}
    assert awaited(records, "cpu") == {loaded.key}
    # 60 needed, 40 missing: the loaded one (30) cannot make it alone, so the hot ones
    # are in play; the loaded one came first of them and the hot one went with it.
    await asyncio.wait_for(admission.admit(new, 60, None), timeout=5)
    assert "loaded" not in evicted
    assert loaded.state is ModelState.READY
    assert budget.reserved("cpu", new.key) == 60
