"""The hottest model is evicted last of all: not while the others could make room by waiting.

Issue 16's fifty-model run: four hot models over one 64 MiB file held most of the
budget; a cold load found every colder model busy or still loading, so the hot ones were
next, and the hottest went too to free its private 6 MiB, while loads a few ms from
READY would have made the room (reloaded 3-5 times in 3,000 requests where the target is
twice at most).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from modelyard.clock import MonotonicClock
from modelyard.config.model_config import ModelConfig
from modelyard.manager.admission import Admission
from modelyard.manager.budget import MemoryBudget
from modelyard.manager.demand import DemandTracker
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState
from tests.unit.manager.admission_scene import lru_admission, new_model, notify


def _record(name: str, state: ModelState, budget: MemoryBudget, nbytes: int) -> ModelRecord:
    record = ModelRecord(ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name))
    record.state = state
    record.device = "cpu"
    assert budget.try_reserve("cpu", record.key, nbytes)
    record.reserved_bytes = nbytes
    return record


def _scene() -> tuple[MemoryBudget, list[ModelRecord], list[str], Admission]:
    """100 bytes: the hottest (30) and a less hot model (20) idle, a cold load in progress
    holding 15, 35 free; a new cold model to admit; and the names evicted, in order."""
    budget = MemoryBudget({"cpu": 100})
    records = [
        _record("hottest", ModelState.READY, budget, 30),
        _record("warm", ModelState.READY, budget, 20),
        _record("loading", ModelState.LOADING, budget, 15),
    ]
    demand = DemandTracker()
    now = MonotonicClock().monotonic()
    for record, requests in zip(records, (50, 20, 1), strict=True):
        for _ in range(requests):
            demand.observe(record.key, now)
    records.append(new_model())
    # Both idle models are hot (the top half of the known ones).
    admission, evicted = lru_admission(budget, records, MonotonicClock(), demand)
    assert set(admission.hot()) == {records[0].key, records[1].key}
    return budget, records, evicted, admission


async def test_the_hottest_waits_out_a_load_that_will_make_room() -> None:
    budget, (hottest, _, loading, new), evicted, admission = _scene()
    # 65 needed, 30 missing. Evicting the warm one alone frees 20: the hottest is not
    # taken for the rest while the load in progress can give it.
    admitting = asyncio.create_task(admission.admit(new, 65, None))
    await asyncio.sleep(0.1)
    assert evicted == []
    assert not admitting.done()
    loading.state = ModelState.READY
    await notify(admission)
    await asyncio.wait_for(admitting, timeout=5)
    assert sorted(evicted) == ["loading", "warm"]
    assert hottest.state is ModelState.READY
    assert budget.reserved("cpu", new.key) == 65


async def test_the_hottest_goes_when_nothing_else_ever_could_make_room() -> None:
    budget, (*_, new), evicted, admission = _scene()
    # 80 needed, 45 missing: the warm one and the load together give 35, so only the
    # hottest can, and it is evicted at once rather than waited for.
    await asyncio.wait_for(admission.admit(new, 80, None), timeout=5)
    assert "hottest" in evicted
    assert budget.reserved("cpu", new.key) == 80
