"""Scheduler fixtures: every scheduler made in a test is closed, and no task outlives it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from modelyard.clock import Clock
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from modelyard.scheduling.scheduler import OUTCOME_COUNTERS

from ._fakes import FakeModel, MakeScheduler


@pytest.fixture
async def make_scheduler() -> AsyncIterator[MakeScheduler]:
    made: list[ModelScheduler] = []

    def make(
        config: SchedulerConfig | None = None,
        model: FakeModel | None = None,
        clock: Clock | None = None,
    ) -> ModelScheduler:
        scheduler = ModelScheduler("m", config or SchedulerConfig(), model or FakeModel(), clock)
        made.append(scheduler)
        return scheduler

    yield make
    for scheduler in made:
        await scheduler.close()
        assert scheduler.pending == 0
    await asyncio.sleep(0)  # let submitters failed by close() see their answers
    for scheduler in made:
        counters = scheduler.counters
        settled = sum(counters[key] for key in OUTCOME_COUNTERS)
        assert counters["accepted"] == settled, f"one answer each: {counters}"
    leftover = {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}
    assert not leftover, f"tasks left running: {leftover}"
