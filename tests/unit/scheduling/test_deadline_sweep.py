"""The scheduler's deadline sweep: one timer answers every request at its deadline."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from modelyard.errors import DeadlineExceededError
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from modelyard.scheduling.breaker import Permit
from modelyard.scheduling.deadline_sweep import DeadlineSweep
from modelyard.scheduling.request_queue import QueuedRequest

from ._fakes import FakeModel, MakeScheduler, settle, tensor

FAR_S = 30.0
"""A deadline no test reaches."""
HANG_S = 10.0
"""Only a broken sweep (a deadline never answered) waits this long."""


def submit(
    scheduler: ModelScheduler, request_id: int, deadline: float
) -> asyncio.Task[dict[str, np.ndarray]]:
    return asyncio.create_task(
        scheduler.submit({"x": tensor(request_id)}, priority=None, deadline=deadline)
    )


async def blocked(
    make: MakeScheduler, config: SchedulerConfig | None = None
) -> tuple[ModelScheduler, FakeModel, asyncio.Task[dict[str, np.ndarray]]]:
    """A started scheduler whose model is held inside a first call (request id 0)."""
    model = FakeModel()
    scheduler = make(config, model)
    await scheduler.start()
    model.hold()
    first = submit(scheduler, 0, time.monotonic() + FAR_S)
    await settle(lambda: len(model.calls) == 1)
    return scheduler, model, first


def queued(scheduler: ModelScheduler, depth: int) -> Callable[[], bool]:
    return lambda: scheduler.stats()["queue_depth"] == depth


async def test_queued_requests_expire_in_deadline_order_and_never_run(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    now = time.monotonic()
    # Queued out of deadline order: the timer armed for the first must be moved earlier.
    tasks = {
        request_id: submit(scheduler, request_id, now + offset_s)
        for request_id, offset_s in ((1, 0.09), (2, 0.03), (3, 0.06))
    }
    order: list[int] = []
    for request_id, task in tasks.items():
        task.add_done_callback(lambda _, i=request_id: order.append(i))  # type: ignore[misc]
    await settle(queued(scheduler, 3))
    async with asyncio.timeout(HANG_S):
        for task in tasks.values():
            with pytest.raises(DeadlineExceededError, match="queued"):
                await task
    assert order == [2, 3, 1]
    assert scheduler.stats()["queue_depth"] == 0
    model.release()
    await first
    assert [call.ids for call in model.calls] == [[0]]
    assert scheduler.stats()["expired_queued"] == 3


async def test_one_timer_for_every_queued_request(
    make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler, model, first = await blocked(make_scheduler, SchedulerConfig(max_queue_size=64))
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting_call_at(when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
        armed.append(when)
        return call_at(when, callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_at", counting_call_at)
    now = time.monotonic()
    # Each earlier than the held request's (armed for already), the first moves the timer.
    later = [submit(scheduler, i, now + FAR_S / 2 + i / 100) for i in range(1, 21)]
    await settle(queued(scheduler, 20))
    assert len(armed) == 1  # one per request before the sweep
    sooner = submit(scheduler, 21, now + FAR_S / 4)  # an earlier deadline moves it again
    await settle(queued(scheduler, 21))
    assert len(armed) == 2
    monkeypatch.undo()
    model.release()
    await first
    for task in [*later, sooner]:
        await task
    assert scheduler.stats()["succeeded"] == 22


async def test_a_cancelled_request_hands_the_timer_to_the_next_deadline(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    now = time.monotonic()
    gone = submit(scheduler, 1, now + 0.02)
    late = submit(scheduler, 2, now + 0.05)
    await settle(queued(scheduler, 2))
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    async with asyncio.timeout(HANG_S):
        with pytest.raises(DeadlineExceededError, match="queued"):
            await late
    model.release()
    await first
    stats = scheduler.stats()
    assert (stats["cancelled"], stats["expired_queued"]) == (1, 1)
    assert [call.ids for call in model.calls] == [[0]]


async def test_drain_and_close_leave_no_timer_armed(make_scheduler: MakeScheduler) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    waiting = submit(scheduler, 1, time.monotonic() + FAR_S)
    await settle(queued(scheduler, 1))
    assert scheduler._sweep.is_armed
    model.release()
    await scheduler.drain()
    await first
    await waiting
    assert not scheduler._sweep.is_armed
    assert len(scheduler._sweep) == 0
    other, held, _ = await blocked(make_scheduler)
    queued_one = submit(other, 1, time.monotonic() + FAR_S)
    await settle(queued(other, 1))
    await other.close()
    assert not other._sweep.is_armed
    queued_one.cancel()
    held.release()


# ------------------------------------------------------------------ the sweep alone


def _request(seq: int) -> QueuedRequest:
    loop = asyncio.get_running_loop()
    return QueuedRequest(
        inputs={},
        priority=1,
        deadline=0.0,
        arrival=0.0,
        seq=seq,
        rows=1,
        batch_key=None,
        future=loop.create_future(),
        permit=Permit(generation=0, is_probe=False),
    )


async def test_the_sweep_holds_about_twice_the_requests_waiting() -> None:
    sweep = DeadlineSweep(lambda request: None)
    loop = asyncio.get_running_loop()
    waiting = []
    for seq in range(2000):
        entry = sweep.watch(loop, loop.time() + FAR_S + seq, _request(seq))
        if seq % 10:
            entry[2] = None  # answered at once
        else:
            waiting.append(entry)
        assert len(sweep) <= max(64, 2 * len(waiting)) + 1
    sweep.close()
    assert len(sweep) == 0
    assert not sweep.is_armed


async def test_the_sweep_expires_each_entry_once_and_skips_answered_ones() -> None:
    expired: list[int] = []
    sweep = DeadlineSweep(lambda request: expired.append(request.seq))
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    entries = [sweep.watch(loop, loop.time() + 0.01 * (seq + 1), _request(seq)) for seq in range(4)]
    entries[1][2] = None
    last = sweep.watch(loop, loop.time() + 0.05, _request(9))
    loop.call_at(last[0] + 0.01, done.set)
    async with asyncio.timeout(HANG_S):
        await done.wait()
    assert expired == [0, 2, 3, 9]
    assert not sweep.is_armed
    assert len(sweep) == 0
