"""Turns: calls take a worker one at a time, in arrival order, past timeouts and cancels."""

from __future__ import annotations

import asyncio

import pytest

from modelyard.workers.turns import Turns


async def _call(turns: Turns, name: str, log: list[str], gate: asyncio.Event) -> None:
    """One call as ``ProcessInstance.infer`` makes it; holds the turn until ``gate``."""
    deadline = asyncio.get_running_loop().time() + 60
    if turns.busy or turns.waiting:
        await turns.wait(deadline)
    else:
        turns.busy = True
    try:
        log.append(f"{name} in")
        await gate.wait()
        log.append(f"{name} out")
    finally:
        if turns.waiting:
            turns.pass_on()
        else:
            turns.busy = False


async def test_calls_run_one_at_a_time_in_arrival_order() -> None:
    log: list[str] = []
    turns, gate = Turns(), asyncio.Event()
    tasks = [asyncio.create_task(_call(turns, name, log, gate)) for name in "abc"]
    await asyncio.sleep(0)
    assert log == ["a in"]
    gate.set()
    await asyncio.gather(*tasks)
    assert log == ["a in", "a out", "b in", "b out", "c in", "c out"]
    assert not turns.busy
    assert not turns.waiting


async def test_a_call_arriving_during_a_handover_queues_behind_it() -> None:
    log: list[str] = []
    turns, gate = Turns(), asyncio.Event()
    gate.set()
    turns.busy = True  # a call holds the worker
    second = asyncio.create_task(_call(turns, "b", log, gate))
    await asyncio.sleep(0)
    turns.pass_on()  # it hands over: "b" is woken but has not run yet
    assert turns.busy
    third = asyncio.create_task(_call(turns, "c", log, gate))
    await asyncio.gather(second, third)
    assert log == ["b in", "b out", "c in", "c out"]


async def test_a_timed_out_waiter_leaves_the_queue() -> None:
    turns = Turns()
    turns.busy = True
    with pytest.raises(TimeoutError):
        await turns.wait(asyncio.get_running_loop().time())
    assert not turns.waiting
    turns.pass_on()
    assert not turns.busy


async def test_a_waiter_cancelled_before_its_turn_is_skipped() -> None:
    turns = Turns()
    turns.busy = True
    deadline = asyncio.get_running_loop().time() + 60
    cancelled = asyncio.create_task(turns.wait(deadline))
    waiting = asyncio.create_task(turns.wait(deadline))
    await asyncio.sleep(0)
    cancelled.cancel()
    turns.pass_on()  # before the cancelled one has run: its future is skipped
    await waiting
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert turns.busy
    assert not turns.waiting


async def test_a_waiter_cancelled_as_it_is_handed_the_turn_passes_it_on() -> None:
    turns = Turns()
    turns.busy = True
    deadline = asyncio.get_running_loop().time() + 60
    first = asyncio.create_task(turns.wait(deadline))
    second = asyncio.create_task(turns.wait(deadline))
    await asyncio.sleep(0)
    turns.pass_on()  # "first" is handed the turn ...
    first.cancel()  # ... and cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await first
    await second  # the turn went on to it
    assert turns.busy
    assert not turns.waiting
    turns.pass_on()
    assert not turns.busy
