"""Early rejection and shedding by priority: the wait estimator, the rule, and the
scheduler refusing at admission, all on the fake clock."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from modelyard.errors import DeadlineUnreachableError, LoadShedError, OverloadedError
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from modelyard.scheduling.degradation import SHED_HEADROOM, Refusal, decide
from modelyard.scheduling.scheduler_core import ARRIVAL_WINDOW_S
from modelyard.scheduling.wait_estimate import (
    FRESH_S,
    MIN_SHARE,
    STALE_HALF_LIFE_S,
    RunningCall,
    ServiceTimes,
    estimate_latency_s,
    share_left,
)

from ._fakes import FakeClock, FakeModel, MakeScheduler, settle, tensor

CALL_S = 0.1
"""Fake-clock seconds every model call takes in the scheduler tests."""
FAR_S = 30.0


# ------------------------------------------------------------------ service times


def test_service_times_unknown_until_measured() -> None:
    service = ServiceTimes()
    assert not service.is_known
    assert service.predict_s(4) is None


def test_service_times_smooth_and_interpolate_between_measured_sizes() -> None:
    service = ServiceTimes(alpha=0.5)
    service.observe(4, 0.2)
    service.observe(4, 0.4)
    assert service.predict_s(4) == pytest.approx(0.3)  # EWMA, not the last value
    assert service.predict_s(2) == pytest.approx(0.15)  # below the smallest: through zero
    assert service.predict_s(8) == pytest.approx(0.3)  # above the largest: a lower bound
    service.observe(16, 0.9)
    assert service.predict_s(10) == pytest.approx(0.3 + 0.5 * 0.6)  # interpolated
    service.observe(0, 5.0)  # an empty call says nothing
    assert service.predict_s(1) == pytest.approx(0.075)


def test_one_slow_big_call_says_little_about_one_row() -> None:
    """The lockout of issue 33: 4,500 rows in 0.88 s once made one row cost 0.88 s."""
    service = ServiceTimes()
    service.observe(4500, 0.88)
    one_row = service.predict_s(1)
    assert one_row is not None
    assert one_row < 0.001
    assert service.predict_s(250_000) == pytest.approx(0.88)  # never extrapolated upward


def test_stale_measurements_decay_and_fresh_ones_replace_them() -> None:
    clock = FakeClock()
    service = ServiceTimes(clock=clock)
    service.observe(1, 0.8)
    clock.advance(FRESH_S)
    assert service.predict_s(1) == pytest.approx(0.8)  # fresh: in full
    clock.advance(STALE_HALF_LIFE_S)
    assert service.predict_s(1) == pytest.approx(0.4)  # one half-life stale: halved
    clock.advance(10 * STALE_HALF_LIFE_S)
    assert service.predict_s(1) == pytest.approx(0.8 / 2**11)
    service.observe(1, 0.01)  # the stale value is replaced, not averaged with
    assert service.predict_s(1) == pytest.approx(0.01, rel=0.05)
    assert service.upper_s == pytest.approx(0.01, rel=0.05)


# ------------------------------------------------------------------ the estimate


def _measured(clock: FakeClock) -> ServiceTimes:
    service = ServiceTimes()
    service.observe(1, 0.1)
    service.observe(4, 0.25)
    return service


def test_estimate_none_before_any_measurement() -> None:
    clock = FakeClock()
    estimate = estimate_latency_s(
        ServiceTimes(),
        now=clock.monotonic(),
        rows_ahead=10,
        own_rows=1,
        batch_cap=4,
        concurrency=1,
        running=[],
    )
    assert estimate is None


@pytest.mark.parametrize(
    ("running_rows", "elapsed_s", "rows_ahead", "batch_cap", "concurrency", "expected"),
    [
        # 9 rows: two full batches of 4 (0.25 s each) and one of 1 (0.1 s), after the
        # running call's 0.20 s left (it takes 0.25 s, 0.05 s have passed).
        pytest.param(4, 0.05, 8, 4, 1, 0.20 + 2 * 0.25 + 0.1, id="full-batches-rest-running"),
        # A free slot does not wait for the running call; concurrency divides the rest.
        pytest.param(4, 0.0, 7, 4, 2, 2 * 0.25 / 2, id="free-slot-concurrency-divides"),
        # A call running past its expected time counts as ending now.
        pytest.param(1, 5.0, 0, 1, 1, 0.1, id="overdue-call-ends-now"),
    ],
)
def test_estimate_counts_batches_ahead_and_the_running_calls(
    running_rows: int,
    elapsed_s: float,
    rows_ahead: int,
    batch_cap: int,
    concurrency: int,
    expected: float,
) -> None:
    clock = FakeClock()
    service = _measured(clock)
    running = [RunningCall(started=clock.monotonic(), rows=running_rows)]
    clock.advance(elapsed_s)
    estimate = estimate_latency_s(
        service,
        now=clock.monotonic(),
        rows_ahead=rows_ahead,
        own_rows=1,
        batch_cap=batch_cap,
        concurrency=concurrency,
        running=running,
    )
    assert estimate == pytest.approx(expected)


# ------------------------------------------------------------------ the rule


def _decide(
    estimates: dict[int, float | None],
    *,
    priority: int,
    deadline_in_s: float = FAR_S,
    by_priority_s: dict[int, float] | None = None,
    default_slo_s: float | None = None,
    early_rejection: bool = True,
) -> Refusal | None:
    clock = FakeClock()
    return decide(
        priority=priority,
        now=clock.monotonic(),
        deadline=clock.monotonic() + deadline_in_s,
        estimate_s=lambda q: estimates[q],
        early_rejection=early_rejection,
        by_priority_s=by_priority_s or {},
        default_slo_s=default_slo_s,
    )


def test_rule_refuses_a_request_that_would_miss_its_deadline() -> None:
    refusal = _decide({3: 0.5}, priority=3, deadline_in_s=0.3)
    assert refusal is not None
    assert (refusal.reason, refusal.estimate_s) == ("deadline", 0.5)
    assert refusal.limit_s == pytest.approx(0.3)
    assert _decide({3: 0.5}, priority=3, deadline_in_s=0.6) is None
    assert _decide({3: 0.5}, priority=3, deadline_in_s=0.3, early_rejection=False) is None


def test_rule_admits_everything_before_a_measurement() -> None:
    assert _decide({1: None, 3: None}, priority=3, deadline_in_s=0.001) is None


def test_rule_sheds_lower_class_when_a_higher_one_is_at_risk() -> None:
    slo = {1: 1.0}
    at_risk = SHED_HEADROOM * 1.0 + 0.01
    refusal = _decide({1: at_risk, 3: 0.2}, priority=3, by_priority_s=slo)
    assert refusal is not None
    assert refusal.reason == "shed"
    assert refusal.protected == 1
    # With headroom left for priority 1, priority 3 is admitted.
    assert _decide({1: 0.4, 3: 2.0}, priority=3, by_priority_s=slo) is None


def test_rule_never_sheds_the_most_important_class() -> None:
    slo = {1: 0.1, 3: 0.5}
    assert _decide({1: 5.0}, priority=1, by_priority_s=slo) is None
    # ...but its deadline still counts.
    refusal = _decide({1: 5.0}, priority=1, by_priority_s=slo, deadline_in_s=1.0)
    assert refusal is not None
    assert refusal.reason == "deadline"


def test_rule_sheds_a_class_over_its_own_objective() -> None:
    slo = {1: 1.0, 3: 0.3}
    refusal = _decide({1: 0.1, 3: 0.4}, priority=3, by_priority_s=slo)
    assert refusal == Refusal("shed", 0.4, 0.3, protected=None)
    # A class the map does not name uses the model's objective.
    refusal = _decide({1: 0.1, 3: 0.1, 5: 0.4}, priority=5, by_priority_s=slo, default_slo_s=0.35)
    assert refusal is not None
    assert refusal.limit_s == 0.35
    assert _decide({1: 0.1, 3: 0.1, 5: 0.4}, priority=5, by_priority_s=slo) is None


# ------------------------------------------------------------------ the scheduler


def _submit(
    scheduler: ModelScheduler, clock: FakeClock, rid: int, *, priority: int, deadline_in_s: float
) -> asyncio.Task[dict[str, np.ndarray]]:
    return asyncio.create_task(
        scheduler.submit(
            {"x": tensor(rid)}, priority=priority, deadline=clock.monotonic() + deadline_in_s
        )
    )


async def _measured_and_blocked(
    make: MakeScheduler, config: SchedulerConfig, queued: dict[int, int]
) -> tuple[ModelScheduler, FakeModel, FakeClock, list[asyncio.Task[dict[str, np.ndarray]]]]:
    """A scheduler that measured one call of ``CALL_S``, then holds a call while
    ``queued`` (priority → count) requests wait."""
    clock = FakeClock()
    model = FakeModel(on_call=lambda: clock.advance(CALL_S))
    scheduler = make(config, model, clock)
    await scheduler.start()
    await _submit(scheduler, clock, 0, priority=1, deadline_in_s=FAR_S)
    assert scheduler.service_times.predict_s(1) == pytest.approx(CALL_S)
    model.hold()
    tasks = [_submit(scheduler, clock, 1, priority=1, deadline_in_s=FAR_S)]
    await settle(lambda: len(model.calls) == 2)
    for priority, count in queued.items():
        tasks += [
            _submit(scheduler, clock, 10 + i, priority=priority, deadline_in_s=FAR_S)
            for i in range(count)
        ]
    await settle(lambda: scheduler.stats()["queue_depth"] == sum(queued.values()))
    return scheduler, model, clock, tasks


NO_BATCHING = SchedulerConfig(max_batch_size=1)


async def test_scheduler_refuses_at_once_a_request_that_cannot_meet_its_deadline(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, clock, tasks = await _measured_and_blocked(
        make_scheduler, NO_BATCHING, {3: 4}
    )
    # Five calls, on the nine tenths of the model that priority 1's arrivals leave.
    assert scheduler.estimate_latency_s(3) == pytest.approx(5 * CALL_S / 0.9)
    before = clock.monotonic()
    with pytest.raises(DeadlineUnreachableError) as caught:
        await _submit(scheduler, clock, 99, priority=3, deadline_in_s=0.3)
    assert clock.monotonic() == before  # refused at once, not after waiting
    assert isinstance(caught.value, OverloadedError)  # 429 with Retry-After
    assert caught.value.retry_after_s == pytest.approx(5 * CALL_S / 0.9 - 0.3)
    assert scheduler.counters["rejected_unreachable"] == 1
    # A deadline the queue can meet is admitted; so is a more urgent request that
    # jumps the priority-3 queue.
    tasks.append(_submit(scheduler, clock, 100, priority=3, deadline_in_s=0.8))
    tasks.append(_submit(scheduler, clock, 101, priority=1, deadline_in_s=0.3))
    await settle(lambda: scheduler.stats()["queue_depth"] == 6)
    model.release()
    await asyncio.gather(*tasks)
    assert scheduler.counters["rejected_unreachable"] == 1


async def test_scheduler_without_early_rejection_queues_the_doomed_request(
    make_scheduler: MakeScheduler,
) -> None:
    config = SchedulerConfig(max_batch_size=1, early_rejection=False)
    scheduler, model, clock, tasks = await _measured_and_blocked(make_scheduler, config, {3: 4})
    doomed = _submit(scheduler, clock, 99, priority=3, deadline_in_s=0.3)
    await settle(lambda: scheduler.stats()["queue_depth"] == 5)
    model.release()
    await asyncio.gather(*tasks, doomed, return_exceptions=True)
    assert scheduler.counters["rejected_unreachable"] == 0


async def test_scheduler_sheds_low_priority_to_protect_high_priority(
    make_scheduler: MakeScheduler,
) -> None:
    # Priority 1's objective is 0.5 s: at risk past 0.25 s of estimated wait.
    config = SchedulerConfig(max_batch_size=1, latency_slo_by_priority_s={1: 0.5})
    scheduler, model, clock, tasks = await _measured_and_blocked(make_scheduler, config, {1: 2})
    # Two priority-1 requests queued: a third would wait 0.2 s, not past the headroom.
    tasks.append(_submit(scheduler, clock, 50, priority=3, deadline_in_s=FAR_S))
    await settle(lambda: scheduler.stats()["queue_depth"] == 3)
    tasks.append(_submit(scheduler, clock, 51, priority=1, deadline_in_s=FAR_S))
    await settle(lambda: scheduler.stats()["queue_depth"] == 4)
    # Now priority 1 would wait 0.3 s: priority 3 is shed, priority 1 still admitted.
    with pytest.raises(LoadShedError, match="keep priority 1 within its latency objective"):
        await _submit(scheduler, clock, 52, priority=3, deadline_in_s=FAR_S)
    tasks.append(_submit(scheduler, clock, 53, priority=1, deadline_in_s=FAR_S))
    await settle(lambda: scheduler.stats()["queue_depth"] == 5)
    assert scheduler.counters["rejected_shed"] == 1
    model.release()
    await asyncio.gather(*tasks)


async def test_scheduler_low_priority_backlog_does_not_count_against_high_priority(
    make_scheduler: MakeScheduler,
) -> None:
    config = SchedulerConfig(max_batch_size=1, latency_slo_by_priority_s={1: 0.6})
    scheduler, model, clock, tasks = await _measured_and_blocked(make_scheduler, config, {5: 6})
    assert scheduler.estimate_latency_s(1) == pytest.approx(CALL_S)
    tasks.append(_submit(scheduler, clock, 60, priority=1, deadline_in_s=0.2))
    await settle(lambda: scheduler.stats()["queue_depth"] == 7)
    model.release()
    await asyncio.gather(*tasks)


async def test_queued_request_too_late_for_one_call_is_refused_not_run(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, clock, tasks = await _measured_and_blocked(make_scheduler, NO_BATCHING, {})
    late = _submit(scheduler, clock, 77, priority=3, deadline_in_s=0.5)
    await settle(lambda: scheduler.stats()["queue_depth"] == 1)
    clock.advance(0.45)  # 0.05 s left: less than the 0.1 s one call takes
    model.release()
    with pytest.raises(DeadlineUnreachableError, match="too few for the calls before it"):
        await late
    await asyncio.gather(*tasks)
    assert 77 not in [i for call in model.calls for i in call.ids]
    assert scheduler.counters["unreachable_queued"] == 1


def test_share_left_by_busier_higher_classes() -> None:
    service = ServiceTimes()
    assert share_left(10.0, service, 1) == 1.0  # nothing measured: no correction
    service.observe(4, 0.2)
    assert share_left(0.0, service, 4) == 1.0
    assert share_left(10.0, service, 4) == pytest.approx(0.5)  # 10 rows/s x 0.05 s/row
    assert share_left(100.0, service, 4) == MIN_SHARE


async def test_estimate_grows_with_the_arrivals_of_higher_priorities(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, _, tasks = await _measured_and_blocked(make_scheduler, NO_BATCHING, {})
    # Two priority-1 arrivals in the window (the measuring one and the held one): 1 row/s
    # at 0.1 s a row leaves priority 3 nine tenths of the model.
    assert scheduler.estimate_latency_s(1) == pytest.approx(CALL_S)
    assert scheduler.estimate_latency_s(3) == pytest.approx(CALL_S / 0.9)
    model.release()
    await asyncio.gather(*tasks)


async def test_arrivals_leave_the_estimate_once_out_of_the_window(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, clock, tasks = await _measured_and_blocked(make_scheduler, NO_BATCHING, {})
    assert scheduler.estimate_latency_s(3) == pytest.approx(CALL_S / 0.9)
    model.release()
    await asyncio.gather(*tasks)
    # Past the arrival window, priority 1's two arrivals no longer take a share (the
    # measurement has gone stale meanwhile: the call's time is the decayed one).
    clock.advance(ARRIVAL_WINDOW_S + 0.01)
    assert scheduler.estimate_latency_s(3) == pytest.approx(scheduler.service_times.predict_s(1))
    # A new one counts again, alone: 0.5 row/s at 0.1 s a row leaves 0.95.
    await _submit(scheduler, clock, 2, priority=1, deadline_in_s=FAR_S)
    assert scheduler.estimate_latency_s(3) == pytest.approx(CALL_S / 0.95)


def test_rule_keeps_one_call_of_slack_before_the_deadline() -> None:
    clock = FakeClock()

    def refused(slack_s: float) -> bool:
        refusal = decide(
            priority=3,
            now=clock.monotonic(),
            deadline=clock.monotonic() + 0.5,
            estimate_s=lambda _: 0.45,
            early_rejection=True,
            by_priority_s={},
            default_slo_s=None,
            slack_s=slack_s,
        )
        return refusal is not None

    assert not refused(0.0)
    assert refused(0.1)  # 0.45 s of queue and call, plus a call's slack, passes 0.5 s
