"""Admission never has two loads wait for each other's memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from modelyard.clock import MonotonicClock
from modelyard.config.model_config import ModelConfig
from modelyard.errors import MemoryBudgetError
from modelyard.manager.admission import Admission
from modelyard.manager.budget import MemoryBudget
from modelyard.manager.eviction import make_policy
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState


def _warming(name: str) -> ModelRecord:
    record = ModelRecord(
        ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name), state=ModelState.WARMING
    )
    record.device = "cpu"
    return record


async def test_two_loads_growing_after_measuring_do_not_wait_for_each_other() -> None:
    # Two loads hold 45 of 100 bytes each and measured 60: each needs the other's room.
    # Waiting for a load in progress is right when it will finish; not when it is
    # itself waiting for room, which was the case here: both waited forever.
    budget = MemoryBudget({"cpu": 100})
    a, b = _warming("a"), _warming("b")
    for r in (a, b):
        assert budget.try_reserve("cpu", r.key, 45)
    admission = Admission(
        budget, make_policy("lru"), lambda: [a, b], lambda r, why: None, MonotonicClock()
    )

    async def grow(record: ModelRecord) -> str:
        try:
            await admission.admit(record, 60, None)
        except MemoryBudgetError:
            # What the loader does with a refused load: give its reservation back.
            admission.release(record)
            async with admission.changed:
                admission.changed.notify_all()
            return "refused"
        return "admitted"

    outcome = await asyncio.wait_for(asyncio.gather(grow(a), grow(b)), timeout=5)
    assert sorted(outcome) == ["admitted", "refused"]
    winner = a if outcome[0] == "admitted" else b
    assert budget.reserved("cpu", winner.key) == 60


async def test_a_load_waits_for_an_admitted_load_that_is_not_waiting() -> None:
    # The other load holds its room and is not blocked in admission: it will finish
    # (or fail) and give room back, so waiting for it is right, not a refusal.
    budget = MemoryBudget({"cpu": 100})
    a, b = _warming("a"), _warming("b")
    assert budget.try_reserve("cpu", b.key, 80)
    admission = Admission(
        budget, make_policy("lru"), lambda: [a, b], lambda r, why: None, MonotonicClock()
    )
    waiting = asyncio.create_task(admission.admit(a, 40, None))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    budget.release("cpu", b.key)
    await asyncio.wait_for(waiting, timeout=5)
    assert budget.reserved("cpu", a.key) == 40
