"""The priority queue: order, aging, bounds, removal."""

from __future__ import annotations

import asyncio

import pytest

from modelyard.scheduling.breaker import Permit
from modelyard.scheduling.request_queue import QueuedRequest, RequestQueue

from ._fakes import tensor

AGING_S = 1.0


@pytest.fixture
def queue() -> RequestQueue:
    return RequestQueue(max_size=4, aging_s=AGING_S)


async def make(seq: int, priority: int, arrival: float = 0.0) -> QueuedRequest:
    return QueuedRequest(
        inputs={"x": tensor(seq)},
        priority=priority,
        deadline=arrival + 100.0,
        arrival=arrival,
        seq=seq,
        rows=1,
        batch_key=None,
        future=asyncio.get_running_loop().create_future(),
        permit=Permit(0, is_probe=False),
    )


async def test_lower_number_first_then_fifo(queue: RequestQueue) -> None:
    for seq, priority in enumerate([3, 1, 3, 1]):
        queue.push(await make(seq, priority))
    assert [r.seq for r in queue.ordered(now=0.0)] == [1, 3, 0, 2]


async def test_aging_lifts_a_waiting_request_one_level_per_aging_s(queue: RequestQueue) -> None:
    old_low = await make(0, priority=4, arrival=0.0)
    new_high = await make(1, priority=1, arrival=3.0)
    queue.push(old_low)
    queue.push(new_high)
    assert queue.effective_priority(old_low, now=2.9) == 2
    assert [r.seq for r in queue.ordered(now=2.9)] == [1, 0]
    # After 3 s it ranks with priority 1 and arrived first.
    assert queue.effective_priority(old_low, now=3.0) == 1
    assert [r.seq for r in queue.ordered(now=3.0)] == [0, 1]
    assert queue.effective_priority(old_low, now=60.0) == 1  # never better than 1


async def test_bounded_and_remove(queue: RequestQueue) -> None:
    requests = [await make(seq, 2) for seq in range(4)]
    for request in requests:
        queue.push(request)
    assert queue.is_full
    assert queue.remove(requests[1])
    assert not queue.remove(requests[1])
    assert len(queue) == 3
    assert not queue.is_full
    queue.take(requests[2:])
    assert [r.seq for r in queue.ordered(now=0.0)] == [0]
    assert queue.clear() == [requests[0]]
    assert len(queue) == 0
