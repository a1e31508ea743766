"""GenerationScheduler: the tensor scheduler's admission, breaker, queue limit and
deadlines for the streams of one replica.

The worker's stream is a fake (``FakeWorker``) that stands in for the worker's channel and
injects its faults (a crash mid-stream, a stall before the first token).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from modelyard.clock import MonotonicClock
from modelyard.config.model_config import BreakerConfig
from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    InvalidInputError,
    ModelNotReadyError,
    OverloadedError,
    WorkerCrashedError,
)
from modelyard.protocol.generate import GenerateChunk, GenerateRequest, SamplingParams
from modelyard.scheduling.breaker import BreakerState, CircuitBreaker
from modelyard.scheduling.generation_scheduler import (
    GenerationLimits,
    GenerationLoad,
    GenerationScheduler,
)

FAR = 1e9
"""A deadline that never comes, on the monotonic clock."""


def request(max_tokens: int = 3) -> GenerateRequest:
    return GenerateRequest(
        model="m",
        version=None,
        prompt="hi",
        messages=None,
        sampling=SamplingParams(max_tokens=max_tokens),
    )


class FakeWorker:
    """A worker's stream: ``max_tokens`` chunks, the last with a finish; or a fault."""

    def __init__(self) -> None:
        self.calls = 0
        self.closed = 0
        self.crash_after: int | None = None
        """Raise WorkerCrashedError after this many chunks (None: never)."""
        self.stall = asyncio.Event()
        self.stall.set()
        """Cleared: the worker waits before its first chunk."""
        self.hold = asyncio.Event()
        self.hold.set()
        """Cleared: the worker waits after its first chunk."""

    def generate(self, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        self.calls += 1
        return self._chunks(req)

    async def _chunks(self, req: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        n = req.sampling.max_tokens or 1
        try:
            await self.stall.wait()
            for i in range(n):
                if self.crash_after is not None and i >= self.crash_after:
                    raise WorkerCrashedError("the worker died")
                last = i == n - 1
                yield GenerateChunk("t", (i,), "length" if last else None, 1, i + 1 if last else 0)
                if i == 0:
                    await self.hold.wait()
        finally:
            self.closed += 1


def scheduler(
    worker: FakeWorker,
    *,
    slots: int = 1,
    max_queue_size: int = 4,
    breaker: CircuitBreaker | None = None,
    brownout_max_tokens: int | None = None,
) -> GenerationScheduler:
    clock = MonotonicClock()
    limits = GenerationLimits(
        slots=slots, max_queue_size=max_queue_size, brownout_max_tokens=brownout_max_tokens
    )
    breaker = breaker or CircuitBreaker(BreakerConfig(), clock)
    return GenerationScheduler("m:1", limits, worker.generate, breaker=breaker, clock=clock)


async def collect(
    s: GenerationScheduler, deadline: float = FAR, **kw: object
) -> list[GenerateChunk]:
    return [c async for c in s.stream(request(**kw), priority=None, deadline=deadline, end=None)]  # type: ignore[arg-type]


async def test_admission_refusals_are_the_tensor_schedulers() -> None:
    worker = FakeWorker()
    s = scheduler(worker)
    with pytest.raises(ModelNotReadyError, match="not accepting"):
        await collect(s)  # not started
    await s.start()
    with pytest.raises(InvalidInputError, match="priority"):
        await anext(s.stream(request(), priority=0, deadline=FAR, end=None))
    with pytest.raises(DeadlineExceededError, match="before the request was queued"):
        await collect(s, deadline=MonotonicClock().monotonic() - 1)
    chunks = await collect(s)
    assert [c.finish_reason for c in chunks] == [None, None, "length"]
    await s.drain()
    assert not s.is_accepting
    with pytest.raises(ModelNotReadyError, match="draining"):
        await collect(s)
    counts = s.counters
    assert counts["rejected_not_ready"] == 2
    assert counts["rejected_expired"] == 1
    assert counts["accepted"] == counts["succeeded"] == 1
    assert worker.calls == 1


async def test_queue_limit_and_a_deadline_passed_while_queued() -> None:
    worker = FakeWorker()
    worker.hold.clear()
    s = scheduler(worker, slots=1, max_queue_size=1)
    await s.start()
    holder = s.stream(request(), priority=None, deadline=FAR, end=None)
    await anext(holder)  # holds the only slot
    clock = MonotonicClock()
    queued = asyncio.create_task(collect(s, deadline=clock.monotonic() + 0.05))
    while s.queued < 1:
        await asyncio.sleep(0)
    assert s.pending == 2
    with pytest.raises(OverloadedError, match="max_queue_size"):
        await collect(s)
    with pytest.raises(DeadlineExceededError, match="generation slots"):
        await queued
    assert worker.calls == 1, "a request that expired queued never reaches the worker"
    busy = s.stats()
    assert (busy["running_streams"], busy["queued_streams"], busy["max_queue_size"]) == (1, 0, 1)
    worker.hold.set()
    assert [c.finish_reason async for c in holder][-1] == "length"
    counts = s.counters
    assert counts["rejected_overloaded"] == 1
    assert counts["expired_queued"] == 1
    stats = s.stats()  # what /v2/stats shows: the counters and the slots' figures
    assert stats["rejected_overloaded"] == 1
    assert (stats["slots"], stats["running_streams"], stats["queued_streams"]) == (1, 0, 0)
    assert (stats["state"], stats["breaker_state"]) == ("running", "closed")
    assert counts["succeeded"] == 1
    assert s.breaker.state is BreakerState.CLOSED  # nothing was the model's fault
    assert s.pending == 0


async def test_crashes_open_the_shared_breaker_and_refuse_before_the_worker() -> None:
    worker = FakeWorker()
    worker.crash_after = 1
    clock = MonotonicClock()
    breaker = CircuitBreaker(
        BreakerConfig(window=2, min_calls=2, failure_ratio=0.5, cooldown_s=600), clock
    )
    s = scheduler(worker, breaker=breaker)
    await s.start()
    for _ in range(2):
        with pytest.raises(WorkerCrashedError):
            await collect(s)
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(CircuitOpenError) as info:
        await collect(s)
    assert info.value.retry_after_s is not None
    assert info.value.retry_after_s > 0
    assert worker.calls == 2
    counts = s.counters
    assert counts["failed"] == 2
    assert counts["rejected_circuit"] == 1


async def test_a_stalled_first_token_is_a_running_deadline_and_counts_against_the_model() -> None:
    worker = FakeWorker()
    worker.stall.clear()
    clock = MonotonicClock()
    breaker = CircuitBreaker(BreakerConfig(window=1, min_calls=1, cooldown_s=600), clock)
    s = scheduler(worker, breaker=breaker)
    await s.start()
    with pytest.raises(DeadlineExceededError, match="first token"):
        await collect(s, deadline=clock.monotonic() + 0.05)
    assert worker.closed == 1, "the worker's stream is closed: the job is cancelled"
    assert s.counters["expired_running"] == 1
    assert breaker.state is BreakerState.OPEN


async def test_a_client_that_leaves_cancels_the_worker_job_and_says_nothing_of_the_model() -> None:
    worker = FakeWorker()
    clock = MonotonicClock()
    breaker = CircuitBreaker(BreakerConfig(window=1, min_calls=1, cooldown_s=600), clock)
    s = scheduler(worker, breaker=breaker)
    await s.start()
    for _ in range(3):
        stream = s.stream(request(10), priority=None, deadline=FAR, end=None)
        await anext(stream)
        await stream.aclose()  # the client went away
    assert worker.closed == 3
    assert breaker.state is BreakerState.CLOSED
    assert s.counters["cancelled"] == 3
    assert s.pending == 0
    assert s.running == 0


async def test_brownout_caps_a_request_that_finds_the_replica_overloaded() -> None:
    worker = FakeWorker()
    worker.hold.clear()
    s = scheduler(worker, slots=1, brownout_max_tokens=2)
    capped: list[int] = []
    s.on_brownout = lambda: capped.append(1)
    await s.start()
    holder = s.stream(request(5), priority=None, deadline=FAR, end=None)
    first = await anext(holder)
    assert first.max_tokens_capped_to is None  # it found the replica idle
    # Every slot busy: the next one waits uncapped; the one after finds a queue too.
    waiting = asyncio.create_task(collect(s, max_tokens=5))
    while s.queued < 1:
        await asyncio.sleep(0)
    late = asyncio.create_task(collect(s, max_tokens=5))
    while s.queued < 2:
        await asyncio.sleep(0)
    worker.hold.set()
    [c async for c in holder]
    assert len(await waiting) == 5
    chunks = await late
    assert len(chunks) == 2
    assert {c.max_tokens_capped_to for c in chunks} == {2}
    assert capped == [1]


async def test_the_load_of_a_version_sums_its_replicas() -> None:
    workers = [FakeWorker(), FakeWorker()]
    for w in workers:
        w.hold.clear()
    schedulers = [scheduler(w, slots=1) for w in workers]
    for s in schedulers:
        await s.start()
    load = GenerationLoad(lambda: schedulers)
    streams = [s.stream(request(), priority=None, deadline=FAR, end=None) for s in schedulers]
    for stream in streams:
        await anext(stream)
    assert (load.running, load.queued, load.slots) == (2, 0, 2)
    for w in workers:
        w.hold.set()
    for stream in streams:
        [c async for c in stream]
    assert load.running == 0
