"""GenerationGate: parallel slots, priority order, queue limit, deadlines."""

from __future__ import annotations

import asyncio

import pytest

from modelyard.clock import MonotonicClock
from modelyard.errors import DeadlineExceededError, OverloadedError
from modelyard.scheduling.generation_gate import MAX_PREEMPTIONS, GenerationGate


async def test_slots_then_priority_order() -> None:
    clock = MonotonicClock()
    gate = GenerationGate("m", slots=1, max_queue_size=4, clock=clock)
    order: list[str] = []
    release = asyncio.Event()

    async def run(name: str, priority: int) -> None:
        async with gate.slot(priority, None):
            order.append(name)
            await release.wait()

    first = asyncio.create_task(run("first", 5))
    await asyncio.sleep(0)
    low = asyncio.create_task(run("low", 5))
    await asyncio.sleep(0)
    high = asyncio.create_task(run("high", 1))
    await asyncio.sleep(0)
    assert gate.running == 1
    assert gate.queued == 2
    release.set()
    await asyncio.gather(first, low, high)
    assert order == ["first", "high", "low"]
    assert gate.running == 0


async def test_queue_full_and_deadline() -> None:
    clock = MonotonicClock()
    gate = GenerationGate("m", slots=1, max_queue_size=1, clock=clock)
    hold = asyncio.Event()

    async def holder() -> None:
        async with gate.slot(3, None):
            await hold.wait()

    task = asyncio.create_task(holder())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(gate.slot(3, clock.monotonic() + 0.05).__aenter__())
    await asyncio.sleep(0)
    with pytest.raises(OverloadedError, match="max_queue_size"):
        async with gate.slot(3, None):
            pass
    with pytest.raises(DeadlineExceededError, match="generation slots"):
        await waiter
    hold.set()
    await task
    assert gate.running == 0
    async with gate.slot(3, None):
        assert gate.running == 1


async def test_a_more_important_arrival_preempts_the_least_important_holder() -> None:
    gate = GenerationGate("m", slots=2, max_queue_size=4, clock=MonotonicClock(), preempt=True)
    async with gate.slot(3, None) as early, gate.slot(3, None) as late:
        same = asyncio.create_task(gate.slot(3, None).__aenter__())
        await asyncio.sleep(0)
        assert not early.preempt_requested, "an equal priority never preempts"
        assert not late.preempt_requested
        urgent_cm = gate.slot(1, None)
        urgent = asyncio.create_task(urgent_cm.__aenter__())
        await asyncio.sleep(0)
        assert late.preempt_requested, "the latest of the least important is chosen"
        assert not early.preempt_requested
        paused = asyncio.create_task(gate.pause(late, None))
        await asyncio.wait_for(urgent, 1)  # the paused slot went to the urgent request
        assert not paused.done()
        assert gate.preemptions == 1
        await urgent_cm.__aexit__(None, None, None)
        await asyncio.wait_for(paused, 1)  # resumed before the later equal request
        assert not same.done()
        same.cancel()
        await asyncio.gather(same, return_exceptions=True)
    assert gate.running == 0


async def test_without_preempt_an_arrival_only_waits() -> None:
    gate = GenerationGate("m", slots=1, max_queue_size=4, clock=MonotonicClock())
    async with gate.slot(5, None) as holder:
        waiter = asyncio.create_task(gate.slot(1, None).__aenter__())
        await asyncio.sleep(0)
        assert not holder.preempt_requested
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)


async def test_a_stream_is_preempted_at_most_max_preemptions_times() -> None:
    gate = GenerationGate("m", slots=1, max_queue_size=8, clock=MonotonicClock(), preempt=True)
    async with gate.slot(5, None) as long:
        for _ in range(MAX_PREEMPTIONS):
            urgent_cm = gate.slot(1, None)
            urgent = asyncio.create_task(urgent_cm.__aenter__())
            await asyncio.sleep(0)
            assert long.preempt_requested
            paused = asyncio.create_task(gate.pause(long, None))
            await asyncio.wait_for(urgent, 1)
            await urgent_cm.__aexit__(None, None, None)
            await asyncio.wait_for(paused, 1)
        waiter = asyncio.create_task(gate.slot(1, None).__aenter__())
        await asyncio.sleep(0)
        assert not long.preempt_requested, "past the limit the stream keeps its slot"
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
    assert long.preemptions == MAX_PREEMPTIONS
