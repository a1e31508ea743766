"""Admission's shortcut (no latency estimate when none could reach the deadline) decides
exactly as the full estimate does, in every state of queue, running calls and arrivals."""

from __future__ import annotations

import asyncio
import random

import numpy as np

from modelyard.scheduling import SchedulerConfig
from modelyard.scheduling.breaker import Permit
from modelyard.scheduling.degradation import Refusal, decide
from modelyard.scheduling.request_queue import QueuedRequest
from modelyard.scheduling.scheduler_core import SchedulerCore
from modelyard.scheduling.wait_estimate import (
    MIN_SHARE,
    RunningCall,
    ServiceTimes,
    admission_bound_s,
    estimate_latency_s,
)

from ._fakes import FakeClock


async def _never(inputs: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
    raise AssertionError("no model call in this test")


def _full_decision(
    core: SchedulerCore, priority: int, rows: int, now: float, deadline: float
) -> Refusal | None:
    """What admission decided before the shortcut: always from the estimate."""
    config = core.config
    return decide(
        priority=priority,
        now=now,
        deadline=deadline,
        estimate_s=lambda q: core.estimate_latency_s(q, max(1, rows) if q == priority else 0),
        early_rejection=config.early_rejection,
        by_priority_s=config.latency_slo_by_priority_s,
        default_slo_s=config.latency_slo_s,
        slack_s=core.service_times.predict_s(rows) or 0.0,
    )


async def test_shortcut_decides_as_the_estimate_does() -> None:
    rng = random.Random(18)
    clock = FakeClock()
    loop = asyncio.get_running_loop()
    skipped = refused = 0
    for _ in range(2000):
        clock.advance(rng.uniform(0.0, 1.0))
        now = clock.monotonic()
        config = SchedulerConfig(
            max_batch_size=rng.choice([1, 2, 4, 8]),
            max_concurrency=rng.choice([1, 1, 2, 4]),
            supports_batching=rng.random() < 0.7,
        )
        core = SchedulerCore("m", config, _never, clock)
        for _ in range(rng.randint(0, 4)):
            core.service_times.observe(rng.randint(0, 9), rng.uniform(0.0, 0.3))
        for seq in range(rng.choice([0, 0, 1, 5, 40])):
            core._queue.push(
                QueuedRequest(
                    inputs={},
                    priority=rng.randint(1, 4),
                    deadline=now + 10.0,
                    arrival=now - rng.uniform(0.0, 3.0),
                    seq=seq,
                    rows=rng.randint(0, 4),
                    batch_key=None,
                    future=loop.create_future(),
                    permit=Permit(0, is_probe=False),
                )
            )
        for i in range(rng.choice([0, 0, 1, 2, 4])):
            core._in_call[i] = RunningCall(now - rng.uniform(0.0, 0.5), rng.randint(0, 8))
        for _ in range(rng.randint(0, 30)):
            core._note_arrival(rng.randint(1, 4), rng.randint(1, 4), now - rng.uniform(0.0, 2.5))
        priority, rows = rng.randint(1, 4), rng.randint(0, 6)
        # Deadlines from just past now to far beyond any estimate: both sides of the bound.
        deadline = now + 10 ** rng.uniform(-4.0, 2.0)
        expected = _full_decision(core, priority, rows, now, deadline)
        got = core._refusal(priority, rows, now, deadline)
        assert got == expected
        refused += expected is not None
        skipped += core.service_times.is_known and expected is None
    # The draw reaches both outcomes often, so the comparison means something.
    assert refused > 100
    assert skipped > 100


async def test_a_busy_batched_model_is_admitted_without_estimating() -> None:
    """MiniLM under sixteen clients: 8 rows in a call of ~45 ms, 8 more queued, the
    default 10 s deadline. Counting rows one call each, the bound (~15 s with its margin)
    came near the deadline and every request walked the queue; counted in batches of the
    cap it is ~3 s, so admission decides without the estimate."""
    clock = FakeClock()
    loop = asyncio.get_running_loop()
    core = SchedulerCore("m", SchedulerConfig(max_batch_size=8), _never, clock)
    for rows, seconds in ((1, 0.012), (4, 0.028), (8, 0.045)):
        core.service_times.observe(rows, seconds)
    now = clock.monotonic()
    for seq in range(8):
        core._queue.push(
            QueuedRequest(
                inputs={},
                priority=3,
                deadline=now + 10.0,
                arrival=now,
                seq=seq,
                rows=1,
                batch_key=None,
                future=loop.create_future(),
                permit=Permit(0, is_probe=False),
            )
        )
    core._in_call[0] = RunningCall(now - 0.01, 8)
    estimates: list[int] = []
    full_estimate = core.estimate_latency_s

    def counted(priority: int, rows: int = 1) -> float | None:
        estimates.append(priority)
        return full_estimate(priority, rows)

    core.estimate_latency_s = counted  # type: ignore[method-assign]
    assert core._refusal(3, 1, now, now + 10.0) is None
    assert estimates == []
    # The same state with a deadline the bound cannot clear is still estimated (and
    # decided as before): the shortcut only skips work, never a refusal.
    assert _full_decision(core, 3, 1, now, now + 0.05) == core._refusal(3, 1, now, now + 0.05)
    assert estimates


def test_the_bound_is_never_below_an_estimate_plus_its_slack() -> None:
    """admission_bound_s over random measurements, queues and running calls: at least the
    estimate at the smallest share left (MIN_SHARE) plus the request's own call."""
    rng = random.Random(15)
    batched = 0
    for _ in range(3000):
        service = ServiceTimes()
        for _ in range(rng.randint(1, 5)):
            service.observe(rng.randint(1, 12), rng.uniform(0.001, 0.3))
        cap = rng.choice([1, 2, 4, 8, 16])
        concurrency = rng.choice([1, 1, 2, 4])
        now = 100.0
        running = [
            RunningCall(now - rng.uniform(0.0, 0.5), rng.randint(0, 12))
            for _ in range(rng.choice([0, 0, 1, 2, 4]))
        ]
        queued, own = rng.choice([0, 1, 7, 8, 9, 40, 300]), rng.randint(0, 20)
        estimate = estimate_latency_s(
            service,
            now=now,
            rows_ahead=queued,
            own_rows=own,
            batch_cap=cap,
            concurrency=concurrency,
            running=running,
        )
        bound = admission_bound_s(
            service,
            queued_rows=queued,
            own_rows=own,
            running_rows=[call.rows for call in running],
            batch_cap=cap,
        )
        assert estimate is not None
        assert bound is not None
        slack = service.predict_s(own) or 0.0
        assert bound >= (estimate / MIN_SHARE + slack) * (1 - 1e-9)
        upper = service.upper_s
        assert upper is not None
        row_bound = upper * (
            (queued + max(1, own) + sum(max(1, c.rows) for c in running)) / MIN_SHARE + max(1, own)
        )
        batched += bound < row_bound
    # The draw reaches states where counting batches is the tighter bound, often.
    assert batched > 500
