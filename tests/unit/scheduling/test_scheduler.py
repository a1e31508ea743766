"""ModelScheduler end to end with fake models: batching, priorities, deadlines, breaker."""

from __future__ import annotations

import asyncio
import random
import time

import numpy as np
import pytest

from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    InternalError,
    InvalidInputError,
    ModelNotReadyError,
    OverloadedError,
    ServerError,
    WorkerCrashedError,
)
from modelyard.scheduling import BreakerConfig, ModelScheduler, SchedulerConfig
from modelyard.scheduling.scheduler import OUTCOME_COUNTERS

from ._fakes import FakeClock, FakeModel, MakeScheduler, reference_model, settle, tensor

FAR_S = 30.0
"""A deadline no test reaches."""
SHORT_S = 0.05
"""A deadline tests wait out in real time."""


def far(clock: FakeClock | None = None) -> float:
    return (clock.monotonic() if clock is not None else time.monotonic()) + FAR_S


def submit(
    scheduler: ModelScheduler,
    request_id: int,
    *,
    rows: int = 1,
    width: int = 3,
    priority: int | None = None,
    deadline: float | None = None,
) -> asyncio.Task[dict[str, np.ndarray]]:
    inputs = {"x": tensor(request_id, rows=rows, width=width)}
    return asyncio.create_task(
        scheduler.submit(inputs, priority=priority, deadline=deadline or far())
    )


async def started(
    make: MakeScheduler,
    config: SchedulerConfig | None = None,
    clock: FakeClock | None = None,
) -> tuple[ModelScheduler, FakeModel]:
    model = FakeModel()
    scheduler = make(config, model, clock)
    await scheduler.start()
    return scheduler, model


async def blocked(
    make: MakeScheduler, config: SchedulerConfig | None = None, clock: FakeClock | None = None
) -> tuple[ModelScheduler, FakeModel, asyncio.Task[dict[str, np.ndarray]]]:
    """A scheduler whose model is held inside a first call (request id 0)."""
    scheduler, model = await started(make, config, clock)
    model.hold()
    first = submit(scheduler, 0, deadline=far(clock))
    await settle(lambda: len(model.calls) == 1)
    return scheduler, model, first


def queued(scheduler: ModelScheduler, depth: int) -> bool:
    return scheduler.stats()["queue_depth"] == depth


def assert_outputs_equal(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


# ---------------------------------------------------------------------- batching


async def test_batched_results_equal_unbatched(make_scheduler: MakeScheduler) -> None:
    scheduler, model, first = await blocked(make_scheduler, SchedulerConfig(max_batch_size=8))
    rows = [1, 3, 2, 2]
    tasks = [submit(scheduler, i + 1, rows=n) for i, n in enumerate(rows)]
    await settle(lambda: queued(scheduler, 4))
    model.release()
    results = await asyncio.gather(first, *tasks)
    assert [call.rows for call in model.calls] == [1, 8]
    assert model.calls[1].ids == [1, 2, 2, 2, 3, 3, 4, 4]
    for i, (n, result) in enumerate(zip(rows, results[1:], strict=True)):
        assert_outputs_equal(result, reference_model({"x": tensor(i + 1, rows=n)}))


async def test_batches_never_exceed_max_rows_but_a_big_request_runs_alone(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, first = await blocked(make_scheduler, SchedulerConfig(max_batch_size=4))
    tasks = [submit(scheduler, i + 1, rows=n) for i, n in enumerate([2, 1, 2, 9, 1])]
    await settle(lambda: queued(scheduler, 5))
    model.release()
    results = await asyncio.gather(first, *tasks)
    assert [call.ids for call in model.calls[1:]] == [[1, 1, 2], [3, 3], [4] * 9, [5]]
    assert_outputs_equal(results[4], reference_model({"x": tensor(4, rows=9)}))


async def test_different_trailing_shapes_run_in_separate_batches(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    tasks = [submit(scheduler, 1, width=3), submit(scheduler, 2, width=4), submit(scheduler, 3)]
    await settle(lambda: queued(scheduler, 3))
    model.release()
    results = await asyncio.gather(first, *tasks)
    assert [call.ids for call in model.calls[1:]] == [[1, 3], [2]]
    assert_outputs_equal(results[2], reference_model({"x": tensor(2, width=4)}))


@pytest.mark.parametrize(
    "config",
    [SchedulerConfig(supports_batching=False), SchedulerConfig(max_batch_size=1)],
    ids=["model-cannot-batch", "max-batch-size-1"],
)
async def test_without_batching_one_request_per_call(
    make_scheduler: MakeScheduler, config: SchedulerConfig
) -> None:
    scheduler, model, first = await blocked(make_scheduler, config)
    tasks = [submit(scheduler, 1, rows=3), submit(scheduler, 2), submit(scheduler, 3)]
    await settle(lambda: queued(scheduler, 3))
    model.release()
    await asyncio.gather(first, *tasks)
    assert [call.ids for call in model.calls] == [[0], [1, 1, 1], [2], [3]]


async def test_oldest_waits_for_company(make_scheduler: MakeScheduler) -> None:
    config = SchedulerConfig(max_batch_size=2, max_queue_delay_s=FAR_S)
    scheduler, model = await started(make_scheduler, config)
    first = submit(scheduler, 1)
    await asyncio.sleep(0.01)  # a real wait: the second request arrives later
    assert not model.calls
    second = submit(scheduler, 2)
    await asyncio.gather(first, second)
    assert [call.ids for call in model.calls] == [[1, 2]]


async def test_a_partial_batch_goes_when_the_delay_runs_out(make_scheduler: MakeScheduler) -> None:
    config = SchedulerConfig(max_batch_size=8, max_queue_delay_s=SHORT_S)
    scheduler, model = await started(make_scheduler, config)
    start = time.monotonic()
    await submit(scheduler, 1)
    assert time.monotonic() - start >= SHORT_S * 0.9
    assert [call.ids for call in model.calls] == [[1]]


@pytest.mark.parametrize(
    "config",
    [
        SchedulerConfig(max_batch_size=2, max_queue_delay_s=FAR_S),
        SchedulerConfig(max_batch_size=8, max_queue_delay_s=FAR_S, preferred_batch_sizes=(2,)),
    ],
    ids=["full-batch", "preferred-size"],
)
async def test_full_or_preferred_batch_goes_without_waiting(
    make_scheduler: MakeScheduler, config: SchedulerConfig
) -> None:
    scheduler, model = await started(make_scheduler, config)
    async with asyncio.timeout(5):
        await asyncio.gather(submit(scheduler, 1), submit(scheduler, 2))
    assert [call.ids for call in model.calls] == [[1, 2]]


async def test_one_invalid_request_does_not_fail_its_batch(make_scheduler: MakeScheduler) -> None:
    def reject_negative(inputs: dict[str, np.ndarray]) -> ServerError | None:
        return InvalidInputError("negative id") if (inputs["x"] < 0).any() else None

    scheduler, model, first = await blocked(make_scheduler)
    model.fail_if = reject_negative
    good, bad, also_good = submit(scheduler, 1), submit(scheduler, -1), submit(scheduler, 2)
    await settle(lambda: queued(scheduler, 3))
    model.release()
    await asyncio.gather(first, good, also_good)
    with pytest.raises(InvalidInputError, match="negative"):
        await bad
    assert [call.ids for call in model.calls[1:]] == [[1, -1, 2], [1], [-1], [2]]
    assert scheduler.stats()["breaker_state"] == "closed"


async def test_batches_run_concurrently_up_to_max_concurrency(
    make_scheduler: MakeScheduler,
) -> None:
    config = SchedulerConfig(max_batch_size=1, max_concurrency=2)
    scheduler, model, first = await blocked(make_scheduler, config)
    tasks = [submit(scheduler, 1), submit(scheduler, 2)]
    await settle(lambda: len(model.calls) == 2 and queued(scheduler, 1))
    assert scheduler.stats()["batches_in_flight"] == 2
    assert scheduler.pending == 3
    model.release()
    await asyncio.gather(first, *tasks)
    assert model.max_running == 2


async def test_on_batch_hook_sees_each_call_and_its_failures_are_ignored(
    make_scheduler: MakeScheduler,
) -> None:
    seen: list[tuple[int, int, float]] = []

    def hook(rows: int, waits_s: list[float], compute_s: float) -> None:
        seen.append((rows, len(waits_s), compute_s))
        raise RuntimeError("broken metrics")

    scheduler, model, first = await blocked(make_scheduler)
    scheduler.on_batch = hook
    tasks = [submit(scheduler, 1, rows=2), submit(scheduler, 2)]
    await settle(lambda: queued(scheduler, 2))
    model.release()
    await asyncio.gather(first, *tasks)
    assert [(rows, count) for rows, count, _ in seen] == [(1, 1), (3, 2)]
    assert all(compute_s >= 0 for _, _, compute_s in seen)


async def test_adaptive_cap_grows_under_the_slo(make_scheduler: MakeScheduler) -> None:
    config = SchedulerConfig(max_batch_size=8, latency_slo_s=FAR_S)
    scheduler, model, first = await blocked(make_scheduler, config)
    assert scheduler.stats()["batch_size_cap"] == 1
    tasks = [submit(scheduler, i) for i in range(1, 9)]
    await settle(lambda: queued(scheduler, 8))
    model.release()
    await asyncio.gather(first, *tasks)
    # Each full batch raised the cap by one: 1, 2, 3 rows; the last 3 did not fill 4.
    assert [call.rows for call in model.calls] == [1, 2, 3, 3]
    assert scheduler.stats()["batch_size_cap"] == 4


# ---------------------------------------------------------------------- admission


async def test_priority_order_under_a_full_queue_and_overflow(
    make_scheduler: MakeScheduler,
) -> None:
    config = SchedulerConfig(max_batch_size=1, max_queue_size=4)
    scheduler, model, first = await blocked(make_scheduler, config)
    tasks = [submit(scheduler, i + 1, priority=p) for i, p in enumerate([3, 2, 1, 3])]
    await settle(lambda: queued(scheduler, 4))
    with pytest.raises(OverloadedError, match="queue full") as refused:
        await scheduler.submit({"x": tensor(9)}, priority=1, deadline=far())
    assert refused.value.retry_after_s is not None
    assert refused.value.retry_after_s > 0
    model.release()
    await asyncio.gather(first, *tasks)
    assert [call.ids[0] for call in model.calls] == [0, 3, 2, 1, 4]
    later = await submit(scheduler, 5)  # room again
    assert_outputs_equal(later, reference_model({"x": tensor(5)}))
    stats = scheduler.stats()
    assert stats["rejected_overloaded"] == 1
    assert stats["succeeded"] == 6


async def test_aging_lets_an_old_low_priority_request_go_first(
    make_scheduler: MakeScheduler,
) -> None:
    clock = FakeClock()
    config = SchedulerConfig(max_batch_size=1, aging_s=1.0)
    scheduler, model, first = await blocked(make_scheduler, config, clock)
    low = submit(scheduler, 1, priority=5, deadline=far(clock))
    await settle(lambda: queued(scheduler, 1))
    clock.advance(4.0)  # 5 - 4 levels: ranks with priority 1, and it came first
    high = submit(scheduler, 2, priority=1, deadline=far(clock))
    await settle(lambda: queued(scheduler, 2))
    model.release()
    await asyncio.gather(first, low, high)
    assert [call.ids[0] for call in model.calls] == [0, 1, 2]


async def test_refusals_before_queueing(make_scheduler: MakeScheduler) -> None:
    clock = FakeClock()
    scheduler = make_scheduler(clock=clock)
    with pytest.raises(ModelNotReadyError):
        await scheduler.submit({"x": tensor(1)}, priority=None, deadline=far(clock))
    await scheduler.start()
    with pytest.raises(InvalidInputError, match="priority"):
        await scheduler.submit({"x": tensor(1)}, priority=0, deadline=far(clock))
    with pytest.raises(DeadlineExceededError):
        await scheduler.submit({"x": tensor(1)}, priority=None, deadline=clock.monotonic())
    assert scheduler.pending == 0


# ---------------------------------------------------------------------- deadlines


async def test_queued_request_past_its_deadline_is_never_run(
    make_scheduler: MakeScheduler,
) -> None:
    clock = FakeClock()
    scheduler, model, first = await blocked(make_scheduler, clock=clock)
    late = submit(scheduler, 1, deadline=clock.monotonic() + 10)
    await settle(lambda: queued(scheduler, 1))
    clock.advance(20)
    model.release()
    await first
    with pytest.raises(DeadlineExceededError, match="queued"):
        await late
    assert [call.ids for call in model.calls] == [[0]]
    assert scheduler.stats()["expired_queued"] == 1


async def test_queued_request_fails_at_its_deadline_in_real_time(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    deadline = time.monotonic() + SHORT_S
    with pytest.raises(DeadlineExceededError, match="queued"):
        await scheduler.submit({"x": tensor(1)}, priority=None, deadline=deadline)
    assert time.monotonic() >= deadline - 0.001
    assert queued(scheduler, 0)
    model.release()
    await first
    assert [call.ids for call in model.calls] == [[0]]


async def test_running_request_fails_at_its_deadline(make_scheduler: MakeScheduler) -> None:
    scheduler, model = await started(make_scheduler)
    model.hold()
    deadline = time.monotonic() + SHORT_S
    with pytest.raises(DeadlineExceededError, match="running"):
        await scheduler.submit({"x": tensor(1)}, priority=None, deadline=deadline)
    assert model.calls[0].deadline == deadline  # execute was told the deadline
    assert scheduler.pending == 1  # the model call itself goes on
    model.release()
    await settle(lambda: scheduler.pending == 0)
    assert scheduler.stats()["expired_running"] == 1


async def test_batch_deadline_is_the_earliest_and_a_late_call_fails_the_late_requests(
    make_scheduler: MakeScheduler,
) -> None:
    clock = FakeClock()
    scheduler, model, first = await blocked(make_scheduler, clock=clock)
    soon = submit(scheduler, 1, deadline=clock.monotonic() + 10)
    later = submit(scheduler, 2, deadline=clock.monotonic() + 50)
    await settle(lambda: queued(scheduler, 2))
    model.on_call = lambda: clock.advance(20)  # the batch call overruns the first deadline
    model.release()
    await first
    with pytest.raises(DeadlineExceededError, match="running"):
        await soon
    assert_outputs_equal(await later, reference_model({"x": tensor(2)}))
    assert model.calls[1].deadline == clock.monotonic() - 20 + 10
    assert scheduler.breaker.snapshot()["window_failures"] == 1  # overran: the model's fault


# ---------------------------------------------------------------------- breaker


BREAKER = BreakerConfig(window=4, failure_ratio=0.5, min_calls=2, cooldown_s=5.0)


async def test_breaker_opens_probes_closes_and_reopens(make_scheduler: MakeScheduler) -> None:
    clock = FakeClock()
    config = SchedulerConfig(max_batch_size=1, breaker=BREAKER)
    scheduler, model = await started(make_scheduler, config, clock)

    async def fail_twice() -> None:
        model.fail_with = WorkerCrashedError("worker 1 exited (-9)")
        for i in range(2):
            with pytest.raises(WorkerCrashedError):
                await submit(scheduler, i, deadline=far(clock))

    await fail_twice()
    assert scheduler.stats()["breaker_state"] == "open"
    clock.advance(2.0)
    with pytest.raises(CircuitOpenError, match=r"open for another 3\.0 s") as refused:
        await submit(scheduler, 3, deadline=far(clock))
    assert refused.value.retry_after_s == pytest.approx(3.0)
    assert scheduler.stats()["breaker_open_for_s"] == pytest.approx(3.0)
    typed = scheduler.snapshot()  # the metrics collector reads this form, no coercions
    assert (typed.breaker_state, typed.breaker_times_opened) == ("open", 1)
    assert typed.breaker_open_for_s == pytest.approx(3.0)
    assert typed.as_dict() == scheduler.stats()
    assert typed.counters["rejected_circuit"] == 1

    clock.advance(3.0)
    assert scheduler.stats()["breaker_state"] == "half_open"
    model.fail_with = None
    await submit(scheduler, 4, deadline=far(clock))  # the probe succeeds
    assert scheduler.stats()["breaker_state"] == "closed"

    await fail_twice()
    clock.advance(5.0)
    with pytest.raises(WorkerCrashedError):
        await submit(scheduler, 5, deadline=far(clock))  # the probe fails
    assert scheduler.stats()["breaker_state"] == "open"
    assert scheduler.stats()["breaker_times_opened"] == 3


async def test_half_open_lets_only_the_probes_through(make_scheduler: MakeScheduler) -> None:
    clock = FakeClock()
    config = SchedulerConfig(max_batch_size=1, breaker=BREAKER)
    scheduler, model = await started(make_scheduler, config, clock)
    model.fail_with = WorkerCrashedError("crash")
    for i in range(2):
        with pytest.raises(WorkerCrashedError):
            await submit(scheduler, i, deadline=far(clock))
    clock.advance(5.0)
    model.fail_with = None
    model.hold()
    probe = submit(scheduler, 1, deadline=far(clock))
    await settle(lambda: len(model.calls) == 2)
    with pytest.raises(CircuitOpenError, match="half-open"):
        await submit(scheduler, 2, deadline=far(clock))
    model.release()
    await probe
    assert scheduler.stats()["breaker_state"] == "closed"


async def test_client_errors_do_not_open_the_breaker(make_scheduler: MakeScheduler) -> None:
    config = SchedulerConfig(max_batch_size=1, breaker=BREAKER)
    scheduler, model = await started(make_scheduler, config)
    model.fail_with = InvalidInputError("bad shape")
    for i in range(4):
        with pytest.raises(InvalidInputError):
            await submit(scheduler, i)
    assert scheduler.stats()["breaker_state"] == "closed"


async def test_queued_requests_fail_fast_when_the_breaker_opens(
    make_scheduler: MakeScheduler,
) -> None:
    config = SchedulerConfig(max_batch_size=1, breaker=BREAKER)
    scheduler, model, first = await blocked(make_scheduler, config)
    second = submit(scheduler, 1)
    third = submit(scheduler, 2)
    await settle(lambda: queued(scheduler, 2))
    model.fail_with = WorkerCrashedError("crash")
    model.release()
    for task in (first, second):
        with pytest.raises(WorkerCrashedError):
            await task
    with pytest.raises(CircuitOpenError):
        await third
    assert [call.ids for call in model.calls] == [[0], [1]]


# ---------------------------------------------------------------------- lifecycle


async def test_cancelled_while_queued_is_removed_and_never_run(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    gone = submit(scheduler, 1)
    await settle(lambda: queued(scheduler, 1))
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert queued(scheduler, 0)
    assert scheduler.pending == 1
    model.release()
    await first
    await settle(lambda: scheduler.pending == 0)
    assert [call.ids for call in model.calls] == [[0]]
    assert scheduler.stats()["cancelled"] == 1


async def test_drain_finishes_queued_work_and_refuses_new(make_scheduler: MakeScheduler) -> None:
    config = SchedulerConfig(max_queue_delay_s=FAR_S)
    scheduler, model = await started(make_scheduler, config)
    model.hold()
    tasks = [submit(scheduler, 1), submit(scheduler, 2)]
    await settle(lambda: queued(scheduler, 2))  # waiting for company, up to FAR_S
    draining = asyncio.create_task(scheduler.drain())
    await settle(lambda: scheduler.stats()["state"] == "draining")
    with pytest.raises(ModelNotReadyError):
        await scheduler.submit({"x": tensor(3)}, priority=None, deadline=far())
    model.release()
    async with asyncio.timeout(5):  # the delay is not waited out while draining
        await draining
    assert scheduler.pending == 0
    assert all(task.done() and task.exception() is None for task in tasks)
    assert [call.ids for call in model.calls] == [[1, 2]]


async def test_close_fails_queued_and_running_and_stops_tasks(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, _, first = await blocked(make_scheduler)
    second = submit(scheduler, 1)
    await settle(lambda: queued(scheduler, 1))
    await scheduler.close()
    for task in (first, second):
        with pytest.raises(ModelNotReadyError):
            await task
    assert scheduler.pending == 0
    with pytest.raises(ModelNotReadyError):
        await scheduler.submit({"x": tensor(3)}, priority=None, deadline=far())


async def test_stats_report_queue_batching_and_breaker(make_scheduler: MakeScheduler) -> None:
    scheduler, model, first = await blocked(make_scheduler, SchedulerConfig(max_batch_size=4))
    second = submit(scheduler, 1)
    await settle(lambda: queued(scheduler, 1))
    stats = scheduler.stats()
    assert stats["queue_depth"] == 1
    assert stats["running_requests"] == 1
    assert stats["pending"] == 2
    assert stats["batch_size_cap"] == 4
    assert stats["queue_delay_s"] == 0.0
    assert stats["breaker_state"] == "closed"
    assert stats["breaker_opened_until"] is None
    model.release()
    await asyncio.gather(first, second)


# ---------------------------------------------------------------------- contract breaches


async def test_outputs_without_the_batch_rows_fail_the_batch_as_internal(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    model.model = lambda inputs: {"y": inputs["x"][:1]}  # one row, whatever the batch
    tasks = [submit(scheduler, 1), submit(scheduler, 2)]
    await settle(lambda: queued(scheduler, 2))
    model.release()
    await first  # alone, one row is right
    for task in tasks:
        with pytest.raises(InternalError, match="axis 0"):
            await task
    assert scheduler.breaker.snapshot()["window_failures"] == 1


async def test_a_foreign_exception_becomes_internal_error(make_scheduler: MakeScheduler) -> None:
    scheduler, model = await started(make_scheduler)
    model.fail_if = lambda inputs: RuntimeError("segfault-ish")
    with pytest.raises(InternalError, match="RuntimeError: segfault-ish"):
        await submit(scheduler, 1)
    assert scheduler.breaker.snapshot()["window_failures"] == 1


async def test_cancelled_while_running_drops_the_result(make_scheduler: MakeScheduler) -> None:
    scheduler, model, first = await blocked(make_scheduler)
    second = submit(scheduler, 1)  # queued behind the first: it will run from the dispatcher
    await settle(lambda: queued(scheduler, 1))
    model.on_call = model.hold  # the next call (the second's) waits at its start
    model.release()
    await first
    await settle(lambda: len(model.calls) == 2)
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert scheduler.pending == 1  # the call goes on; the worker layer owns it
    model.release()
    await settle(lambda: scheduler.pending == 0)
    stats = scheduler.stats()
    assert stats["cancelled"] == 1
    assert stats["succeeded"] == 1


async def test_an_idle_model_runs_a_request_in_the_submitters_task(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler, model = await started(make_scheduler)
    await settle(lambda: scheduler.is_idle)
    submitter = asyncio.current_task()
    seen: list[object] = []
    model.on_call = lambda: seen.append(asyncio.current_task())
    out = await scheduler.submit({"x": tensor(5)}, priority=None, deadline=far())
    assert_outputs_equal(out, reference_model({"x": tensor(5)}))
    assert seen == [submitter], "no dispatcher hop and no batch task on an idle model"
    # A cancelled submitter on that path cancels its own call.
    model.hold()
    task = submit(scheduler, 6)
    await settle(lambda: len(model.calls) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert scheduler.pending == 0
    assert scheduler.stats()["cancelled"] == 1


async def test_every_request_gets_exactly_one_answer(make_scheduler: MakeScheduler) -> None:
    """A seeded storm of priorities, sizes, short deadlines, failures and cancellations."""
    rng = random.Random(20240611)

    def faults(inputs: dict[str, np.ndarray]) -> Exception | None:
        ids = {int(v) for v in inputs["x"][:, 0]}
        if any(i % 37 == 0 for i in ids):
            return WorkerCrashedError("worker exited")
        if any(i % 11 == 0 for i in ids):
            return InvalidInputError("bad row")
        return None

    config = SchedulerConfig(max_batch_size=4, max_queue_size=32, max_concurrency=2)
    scheduler, model = await started(make_scheduler, config)
    model.fail_if = faults
    model.steps = 3
    tasks: dict[int, tuple[int, asyncio.Task[dict[str, np.ndarray]]]] = {}
    for request_id in range(1, 301):
        rows = rng.randint(1, 3)
        short = rng.random() < 0.2
        deadline = time.monotonic() + (rng.uniform(0.001, 0.01) if short else FAR_S)
        task = submit(
            scheduler, request_id, rows=rows, priority=rng.randint(1, 5), deadline=deadline
        )
        tasks[request_id] = (rows, task)
        if rng.random() < 0.1:
            victim = tasks[rng.randint(1, request_id)][1]
            victim.cancel()
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
    answers = await asyncio.gather(*(t for _, t in tasks.values()), return_exceptions=True)
    kinds: set[str] = set()
    for (request_id, (rows, _)), answer in zip(tasks.items(), answers, strict=True):
        if isinstance(answer, dict):
            assert_outputs_equal(answer, reference_model({"x": tensor(request_id, rows=rows)}))
            kinds.add("ok")
        else:
            assert isinstance(answer, ServerError | asyncio.CancelledError), answer
            kinds.add(type(answer).__name__)
    assert {"ok", "CancelledError", "OverloadedError", "InvalidInputError"} <= kinds
    await settle(lambda: scheduler.pending == 0)
    counters = scheduler.counters
    assert counters["accepted"] == sum(counters[key] for key in OUTCOME_COUNTERS)
    assert counters["accepted"] > 100
