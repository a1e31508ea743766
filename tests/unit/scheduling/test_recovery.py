"""Early rejection and shedding that can be wrong and recover (issue 33): one slow call
never locks a model out, an idle refusing model admits a probe now and then, and a
request above the model's ``max_request_rows`` is refused by that limit, not a guess.
All on the fake clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from modelyard.errors import (
    DeadlineExceededError,
    DeadlineUnreachableError,
    LoadShedError,
    PayloadTooLargeError,
)
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from modelyard.scheduling.probe import PROBE_INTERVAL_S

from ._fakes import FakeClock, FakeModel, MakeScheduler, tensor

DEADLINE_S = 1.0
"""The model's ``timeout_s`` in the scenarios of the issue."""


async def _start(
    make: MakeScheduler, config: SchedulerConfig, clock: FakeClock, seconds: Callable[[int], float]
) -> ModelScheduler:
    model = FakeModel()

    def on_call() -> None:
        clock.advance(seconds(model.calls[-1].rows))

    model.on_call = on_call
    scheduler = make(config, model, clock)
    await scheduler.start()
    return scheduler


async def _one(
    scheduler: ModelScheduler, clock: FakeClock, rid: int, rows: int = 1, priority: int = 3
) -> str:
    """Submit one request with the issue's 1 s deadline; its outcome in a word."""
    try:
        await scheduler.submit(
            {"x": tensor(rid, rows)}, priority=priority, deadline=clock.monotonic() + DEADLINE_S
        )
    except DeadlineUnreachableError:
        return "unreachable"
    except LoadShedError:
        return "shed"
    except DeadlineExceededError:
        return "late"
    return "ok"


async def test_one_big_slow_first_call_does_not_lock_the_model_out(
    make_scheduler: MakeScheduler,
) -> None:
    """A fresh model whose first call carries 4,500 rows in 0.88 s then serves one-row
    requests at once (it refused 40 of 40 before)."""
    clock = FakeClock()
    scheduler = await _start(
        make_scheduler, SchedulerConfig(max_batch_size=1), clock, lambda rows: 0.0002 * rows
    )
    assert await _one(scheduler, clock, 0, rows=4500) == "ok"
    outcomes = [await _one(scheduler, clock, i) for i in range(1, 41)]
    assert outcomes == ["ok"] * 40
    assert scheduler.counters["rejected_unreachable"] == 0


async def test_a_paused_first_call_is_forgiven_within_seconds(
    make_scheduler: MakeScheduler,
) -> None:
    """A first call of one row held 0.7 s (a paused worker) makes a 1 s deadline look
    unreachable (0.7 s call plus 0.7 s slack). The idle model admits a probe at most every
    PROBE_INTERVAL_S, each probe's fast call pulls the estimate down, and the stale slow
    one decays: of one request every 0.1 s for 10 s, at least 90 % are served (92 of 92
    were refused before), and all of the last half."""
    clock = FakeClock()
    slow = [0.7]
    scheduler = await _start(
        make_scheduler,
        SchedulerConfig(max_batch_size=1),
        clock,
        lambda rows: slow.pop() if slow else 0.002,
    )
    assert await _one(scheduler, clock, 0) == "ok"
    assert await _one(scheduler, clock, 1) == "ok"  # the first refusal is a probe
    assert scheduler.counters["probes"] == 1
    outcomes = []
    for i in range(2, 102):
        clock.advance(0.1)
        outcomes.append(await _one(scheduler, clock, i))
    assert outcomes.count("ok") >= 90
    assert outcomes[50:] == ["ok"] * 50
    assert outcomes.count("unreachable") == scheduler.counters["rejected_unreachable"]


async def test_a_long_paused_first_call_is_forgiven_by_its_first_probe(
    make_scheduler: MakeScheduler,
) -> None:
    """A first call held 5 s (five deadlines): the first probe's fast call replaces the
    measurement that refused it, rather than being averaged with it."""
    clock = FakeClock()
    slow = [5.0]
    scheduler = await _start(
        make_scheduler,
        SchedulerConfig(max_batch_size=1),
        clock,
        lambda rows: slow.pop() if slow else 0.002,
    )
    assert await _one(scheduler, clock, 0) == "late"  # measured all the same
    assert await _one(scheduler, clock, 1) == "ok"  # the probe
    outcomes = [await _one(scheduler, clock, i) for i in range(2, 22)]
    assert outcomes == ["ok"] * 20
    assert scheduler.counters["probes"] == 1


async def test_the_estimate_decays_with_time_even_without_a_probe(
    make_scheduler: MakeScheduler,
) -> None:
    """The measurement of the slow call fades as time passes with nothing running: the
    estimate itself comes under the deadline (not only a probe gets through)."""
    clock = FakeClock()
    slow = [0.9]
    scheduler = await _start(
        make_scheduler,
        SchedulerConfig(max_batch_size=1),
        clock,
        lambda rows: slow.pop() if slow else 0.002,
    )
    assert await _one(scheduler, clock, 0) == "ok"
    first = scheduler.estimate_latency_s(3)
    assert first is not None
    assert first == pytest.approx(0.9)
    clock.advance(6.0)
    later = scheduler.estimate_latency_s(3)
    assert later is not None
    assert later < 0.25 * first


async def test_an_idle_model_sheds_nothing_after_one_long_call(
    make_scheduler: MakeScheduler,
) -> None:
    """With ``latency_slo_by_priority_s``, one 2 s call over half of priority 1's objective
    once shed every priority-3 request on an idle model. Shedding protects the wait, and
    nothing waits on an idle model."""
    clock = FakeClock()
    slow = [2.0]
    config = SchedulerConfig(max_batch_size=1, latency_slo_by_priority_s={1: 3.0})
    scheduler = await _start(
        make_scheduler, config, clock, lambda rows: slow.pop() if slow else 0.01
    )
    await scheduler.submit({"x": tensor(0)}, priority=1, deadline=clock.monotonic() + 30.0)
    for i in range(1, 6):
        await scheduler.submit({"x": tensor(i)}, priority=3, deadline=clock.monotonic() + 30.0)
    assert scheduler.counters["rejected_shed"] == 0


async def test_no_probe_while_the_model_is_busy(make_scheduler: MakeScheduler) -> None:
    """A probe is for an idle model: a model with calls running measures anyway."""
    clock = FakeClock()
    model = FakeModel(on_call=lambda: clock.advance(0.6))
    scheduler = make_scheduler(SchedulerConfig(max_batch_size=1), model, clock)
    await scheduler.start()
    await scheduler.submit({"x": tensor(0)}, priority=3, deadline=clock.monotonic() + 30.0)
    model.hold()
    held = asyncio.create_task(
        scheduler.submit({"x": tensor(1)}, priority=3, deadline=clock.monotonic() + 30.0)
    )
    for _ in range(50):
        await asyncio.sleep(0)
    clock.advance(PROBE_INTERVAL_S)
    with pytest.raises(DeadlineUnreachableError):
        await scheduler.submit({"x": tensor(2)}, priority=3, deadline=clock.monotonic() + 0.5)
    assert scheduler.counters["probes"] == 0
    model.release()
    await held


async def test_a_request_above_max_request_rows_is_refused_by_the_limit(
    make_scheduler: MakeScheduler,
) -> None:
    clock = FakeClock()
    scheduler = await _start(
        make_scheduler,
        SchedulerConfig(max_batch_size=1, max_request_rows=100),
        clock,
        lambda rows: 0.001,
    )
    assert await _one(scheduler, clock, 0, rows=100) == "ok"
    with pytest.raises(PayloadTooLargeError, match="at most 100 rows per request"):
        await _one(scheduler, clock, 1, rows=101)
    assert scheduler.counters["rejected_too_large"] == 1
    assert scheduler.counters["model_calls"] == 1
