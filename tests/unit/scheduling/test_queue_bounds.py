"""The cheap bounds the request path reads instead of walking the queue."""

from __future__ import annotations

import asyncio
import math
import random

import numpy as np
import pytest

from modelyard.errors import DeadlineUnreachableError
from modelyard.scheduling import SchedulerConfig
from modelyard.scheduling.breaker import Permit
from modelyard.scheduling.request_queue import QueuedRequest, RequestQueue

from ._fakes import FakeClock, FakeModel, MakeScheduler, settle, tensor

CALL_S = 0.1
FAR_S = 30.0


def _request(seq: int, priority: int, deadline: float) -> QueuedRequest:
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[dict[str, np.ndarray]] = loop.create_future()
    finally:
        loop.close()
    return QueuedRequest({}, priority, deadline, 0.0, seq, 1, None, future, Permit(0, False))


def test_the_earliest_deadline_stays_a_lower_bound_of_the_queued_ones() -> None:
    rng = random.Random(7)
    queue = RequestQueue(max_size=100, aging_s=1.0)
    queued: list[QueuedRequest] = []
    assert queue.earliest_deadline == math.inf
    for seq in range(2000):
        op = rng.random()
        if op < 0.5 or not queued:
            request = _request(seq, rng.randint(1, 3), rng.uniform(0.0, 100.0))
            queue.push(request)
            queued.append(request)
        elif op < 0.75:
            request = queued.pop(rng.randrange(len(queued)))
            queue.remove(request)
        elif op < 0.95:
            batch = list(queue.ordered(0.0))[: rng.randint(1, 4)]
            queue.take(batch)
            queued = [r for r in queued if r not in batch]
        else:
            queue.clear()
            queued = []
        if queued:
            assert queue.earliest_deadline <= min(r.deadline for r in queued)
        else:
            assert queue.earliest_deadline == math.inf, "an empty queue has no bound"
        if rng.random() < 0.05 and queued:
            queue.note_earliest(min(r.deadline for r in queued))


async def test_a_request_too_late_behind_the_next_batch_is_still_refused(
    make_scheduler: MakeScheduler,
) -> None:
    clock = FakeClock()
    model = FakeModel(on_call=lambda: clock.advance(CALL_S))
    scheduler = make_scheduler(SchedulerConfig(max_batch_size=1), model, clock)
    await scheduler.start()

    def submit(rid: int, deadline_in_s: float) -> asyncio.Task[dict[str, np.ndarray]]:
        deadline = clock.monotonic() + deadline_in_s
        return asyncio.create_task(
            scheduler.submit({"x": tensor(rid)}, priority=3, deadline=deadline)
        )

    await submit(0, FAR_S)  # one call measured: CALL_S
    model.hold()
    running = submit(1, FAR_S)
    await settle(lambda: len(model.calls) == 2)
    far = submit(2, FAR_S)
    late = submit(3, 0.6)
    await settle(lambda: scheduler.stats()["queue_depth"] == 2)
    # Behind the next batch (the far request's call) it would need 0.1 s, then its own
    # call with the slack of one more: 0.3 s. It has 0.25 s left.
    clock.advance(0.35)
    model.release()
    model.hold()  # the far request's call is held: only the walk after it can refuse
    await settle(lambda: late.done())
    with pytest.raises(DeadlineUnreachableError):
        await late
    assert not far.done(), "refused while the batch ahead of it still ran"
    model.release()
    await asyncio.gather(running, far)
    assert 3 not in [i for call in model.calls for i in call.ids]
    assert scheduler.counters["unreachable_queued"] == 1
