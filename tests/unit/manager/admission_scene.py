"""Admission scenes for unit tests: an LRU admission over hand-made records on one "cpu"
budget, whose victims are gone at once (what the manager's eviction task does)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from modelyard.clock import Clock
from modelyard.config.model_config import ModelConfig
from modelyard.manager.admission import Admission
from modelyard.manager.budget import MemoryBudget
from modelyard.manager.demand import DemandTracker
from modelyard.manager.eviction import make_policy
from modelyard.manager.records import ModelKey, ModelRecord
from modelyard.manager.states import ModelState


async def notify(admission: Admission) -> None:
    """What the manager's eviction task does once the victim has gone."""
    async with admission.changed:
        admission.changed.notify_all()


def new_model(name: str = "new") -> ModelRecord:
    """A model not loaded yet, placed on "cpu": the one to admit."""
    record = ModelRecord(ModelKey(name, "1"), ModelConfig(name=name, path=name), Path(name))
    record.device = "cpu"
    return record


def lru_admission(
    budget: MemoryBudget,
    records: list[ModelRecord],
    clock: Clock,
    demand: DemandTracker | None = None,
) -> tuple[Admission, list[str]]:
    """LRU admission over ``records`` whose evictions finish at once, with the names
    evicted, in order (with ``demand``, the top half of the known models is hot)."""
    evicted: list[str] = []

    def evict(record: ModelRecord, why: str) -> None:
        evicted.append(record.key.name)
        record.state = ModelState.UNLOADED
        budget.release("cpu", record.key)
        record.reserved_bytes = 0
        asyncio.get_running_loop().create_task(notify(admission))

    admission = Admission(
        budget, make_policy("lru"), lambda: records, evict, clock, demand=demand,
        hot_fraction=0.5,
    )  # fmt: skip
    return admission, evicted
