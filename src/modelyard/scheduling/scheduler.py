"""ModelScheduler: one per loaded model, between the front ends and the model's workers.

``submit`` admits a request (lifecycle, queue bound, circuit breaker), queues it and
waits for its answer until its deadline. One dispatcher task forms batches
(:mod:`~modelyard.scheduling.batcher`) from the priority queue
(:mod:`~modelyard.scheduling.request_queue`) and starts each as a task, at most
``max_concurrency`` at once, that calls ``execute`` and resolves the futures.

Order and batching:

* lower priority numbers go first, FIFO within a priority; a queued request's effective
  priority improves by one level per ``aging_s`` seconds waited (never past 1), so a
  request of priority ``p`` ranks with the most urgent after about ``(p - 1) * aging_s``
  and starvation is bounded;
* a batch is dispatched when it is full (``max_batch_size`` rows), reaches a preferred
  size, or its oldest request has waited ``max_queue_delay_s``; with ``latency_slo_s``
  the cap and the delay come from :class:`~modelyard.scheduling.adaptive.AdaptiveBatchController`.

Guarantees:

* every admitted request gets exactly one answer: a result, a typed
  :class:`~modelyard.errors.ServerError`, or its own cancellation;
* a request whose deadline passes while queued is never executed; one whose deadline
  passes while running is answered with ``DeadlineExceededError`` at its deadline (the
  call itself goes on: ``execute`` was told the batch deadline, the earliest in it, and
  the worker layer stops overrunning workers);
* a submitter that is cancelled while queued takes its request out of the queue;
* ``close()`` fails what is still queued or running with ``ModelNotReadyError`` and
  leaves no task behind; ``drain()`` finishes everything first.

Only failures that are the model's fault feed the circuit breaker: worker crashes, load
errors, running deadlines (a raised ``DeadlineExceededError`` or a call that returned
after the batch deadline) and internal errors. When a batch of several requests fails
with ``InvalidInputError``, each request is run again alone, so one bad request does not
fail its neighbours.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import logging
import math
from collections import Counter
from collections.abc import Callable, Iterator
from enum import Enum

import numpy as np

from modelyard.clock import Clock, MonotonicClock
from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    InternalError,
    InvalidInputError,
    ModelNotReadyError,
    OverloadedError,
    ServerError,
)
from modelyard.scheduling.adaptive import AdaptiveBatchController
from modelyard.scheduling.batcher import batch_key, row_count, select_batch
from modelyard.scheduling.breaker import BreakerState, CircuitBreaker, Permit
from modelyard.scheduling.config import SchedulerConfig
from modelyard.scheduling.dispatcher import CallReport, Execute, call_model
from modelyard.scheduling.request_queue import QueuedRequest, RequestQueue, RequestState
from modelyard.scheduling.stats import SchedulerStats

__all__ = ["ADMISSION_COUNTERS", "OUTCOME_COUNTERS", "BatchHook", "Execute", "ModelScheduler"]

logger = logging.getLogger(__name__)

BatchHook = Callable[[int, list[float], float], None]
"""``on_batch(batch_rows, queue_wait_s_per_request, compute_s)``, called after each model call."""

ADMISSION_COUNTERS = (
    "accepted",
    "rejected_not_ready",
    "rejected_expired",
    "rejected_overloaded",
    "rejected_circuit",
)
"""``stats()`` counters of admission: accepted, or refused at once (and why)."""
OUTCOME_COUNTERS = (
    "succeeded",
    "failed",
    "expired_queued",
    "expired_running",
    "circuit_open",
    "cancelled",
)
"""``stats()`` counters of what became of accepted requests; once settled, they sum to
``accepted``. ``circuit_open`` counts queued requests failed because the breaker opened."""
_COUNTERS = (*ADMISSION_COUNTERS, *OUTCOME_COUNTERS, "model_calls")
_RETRY_AFTER_BOUNDS_S = (0.01, 30.0)
_EWMA_ALPHA = 0.2


class _Lifecycle(Enum):
    NEW = "new"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


def _consume_exception(future: asyncio.Future[dict[str, np.ndarray]]) -> None:
    # NOTE: a submitter cancelled right after its future got an exception never reads
    # it; reading it here keeps asyncio from logging "exception was never retrieved".
    if not future.cancelled():
        future.exception()


class ModelScheduler:
    """Queue, batch and dispatch the requests of one model; see the module docstring."""

    def __init__(
        self,
        name: str,
        config: SchedulerConfig,
        execute: Execute,
        clock: Clock | None = None,
        *,
        on_batch: BatchHook | None = None,
    ) -> None:
        self.name = name
        self.config = config
        self.on_batch = on_batch
        """Metrics hook called after every model call; its failures are logged and ignored."""
        self._execute = execute
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._queue = RequestQueue(max_size=config.max_queue_size, aging_s=config.aging_s)
        self._breaker = CircuitBreaker(config.breaker, self._clock)
        self._adaptive: AdaptiveBatchController | None = None
        if config.latency_slo_s is not None and config.is_batching:
            self._adaptive = AdaptiveBatchController(
                slo_s=config.latency_slo_s,
                max_batch_size=config.max_batch_size,
                initial_delay_s=config.max_queue_delay_s,
            )
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._wakeup = asyncio.Event()
        self._dispatcher_idle = False
        """True while the dispatcher waits for work with nothing queued."""
        self._direct = 0
        """Requests running on the direct path (see ``_run_direct``)."""
        self._direct_idle = asyncio.Event()
        self._direct_idle.set()
        self._direct_tasks: dict[asyncio.Task[object], bool] = {}
        """Submitter tasks on the direct path → whether ``close()`` cancelled them."""
        self._state = _Lifecycle.NEW
        self._dispatcher: asyncio.Task[None] | None = None
        self._batches: dict[asyncio.Task[None], list[QueuedRequest]] = {}
        self._seq = itertools.count()
        self._counts: Counter[str] = Counter()
        self._ewma_call_s: float | None = None
        self._ewma_call_requests: float | None = None

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the dispatcher; ``submit`` is refused before this. Idempotent."""
        if self._state is _Lifecycle.RUNNING:
            return
        if self._state is not _Lifecycle.NEW:
            raise RuntimeError(f"scheduler of model {self.name!r} cannot restart once stopped")
        self._state = _Lifecycle.RUNNING
        self._dispatcher = asyncio.create_task(
            self._dispatch_loop(), name=f"modelyard-scheduler-{self.name}"
        )
        self._dispatcher.add_done_callback(self._dispatcher_done)

    async def drain(self) -> None:
        """Refuse new requests (``ModelNotReadyError``), finish queued and running ones."""
        if self._state is _Lifecycle.RUNNING:
            self._state = _Lifecycle.DRAINING
            self._wakeup.set()
        elif self._state is _Lifecycle.NEW:
            self._state = _Lifecycle.DRAINING
        if self._dispatcher is not None and not self._dispatcher.done():
            # asyncio.wait, not await: a cancelled drain must not cancel the dispatcher.
            await asyncio.wait([self._dispatcher])
        while self._batches:
            await asyncio.wait(list(self._batches))
        while self._direct:
            await self._direct_idle.wait()

    async def close(self) -> None:
        """Fail queued and running requests with ``ModelNotReadyError``; stop every task."""
        self._state = _Lifecycle.CLOSED
        for request in self._queue.clear():
            request.state = RequestState.DONE
            self._breaker.release([request.permit])
            self._fail(request, self._not_ready_error("closed"), "failed")
        tasks: list[asyncio.Task[None]] = list(self._batches)
        if self._dispatcher is not None:
            tasks.append(self._dispatcher)
        for task in tasks:
            task.cancel()
        for submitter in self._direct_tasks:
            # The submitter turns this cancellation into ModelNotReadyError.
            self._direct_tasks[submitter] = True
            submitter.cancel()
        # Batch tasks answer their requests in their done callbacks, which run before
        # gather returns (they were registered first), even for a task that never started.
        await asyncio.gather(*tasks, return_exceptions=True)
        while self._direct:
            await self._direct_idle.wait()

    # ---------------------------------------------------------------- requests

    async def submit(
        self, inputs: dict[str, np.ndarray], *, priority: int | None, deadline: float
    ) -> dict[str, np.ndarray]:
        """Run ``inputs`` on the model, batched with others when possible; return outputs.

        ``priority`` (1 is the highest; None: the configured default) orders the queue;
        ``deadline`` is absolute monotonic seconds on the scheduler's clock (``math.inf``:
        none). Raises
        ``ModelNotReadyError`` (not started, draining, closed), ``InvalidInputError``
        (bad priority), ``OverloadedError`` (queue full), ``CircuitOpenError``,
        ``DeadlineExceededError``, or whatever typed error the model call raised.
        """
        if self._state is not _Lifecycle.RUNNING:
            self._counts["rejected_not_ready"] += 1
            raise self._not_ready_error(self._state.value)
        level = self.config.default_priority if priority is None else priority
        if level < 1:
            raise InvalidInputError(f"priority must be 1 (highest) or more, got {level}")
        now = self._clock.monotonic()
        if deadline <= now:
            self._counts["rejected_expired"] += 1
            raise DeadlineExceededError(
                f"model {self.name!r}: the deadline passed before the request was queued"
            )
        if self._queue.is_full:
            self._counts["rejected_overloaded"] += 1
            retry_after_s = self._estimate_retry_after_s()
            raise OverloadedError(
                f"model {self.name!r}: queue full ({len(self._queue)} requests waiting); "
                f"retry in about {retry_after_s:.2f} s",
                retry_after_s=retry_after_s,
            )
        permit = self._breaker.admit()
        if permit is None:
            self._counts["rejected_circuit"] += 1
            raise self._circuit_open_error()
        if self._can_run_direct():
            return await self._run_direct(inputs, level, deadline, now, permit)
        request = QueuedRequest(
            inputs=inputs,
            priority=level,
            deadline=deadline,
            arrival=now,
            seq=next(self._seq),
            rows=row_count(inputs),
            batch_key=batch_key(inputs),
            future=asyncio.get_running_loop().create_future(),
            permit=permit,
        )
        request.future.add_done_callback(_consume_exception)
        self._queue.push(request)
        self._counts["accepted"] += 1
        self._wakeup.set()
        timeout = asyncio.timeout(None if math.isinf(deadline) else deadline - now)
        # Outcomes are counted here, once per admitted request, whoever answered it.
        try:
            async with timeout:
                outputs = await request.future
        except ServerError:
            self._counts[request.outcome] += 1
            raise
        except TimeoutError:
            if not timeout.expired():
                raise
            is_running = request.state is RequestState.RUNNING
            self._counts["expired_running" if is_running else "expired_queued"] += 1
            raise self._deadline_error(request, was_run=is_running) from None
        except asyncio.CancelledError:
            self._counts["cancelled"] += 1
            raise
        finally:
            if request.state is RequestState.QUEUED:
                # Cancelled or timed out while queued: it must never reach the model.
                request.state = RequestState.DONE
                self._queue.remove(request)
                self._breaker.release([request.permit])
        self._counts["succeeded"] += 1
        return outputs

    # ---------------------------------------------------------------- inspection

    @property
    def is_idle(self) -> bool:
        """True when nothing is queued or running and the dispatcher waits for work."""
        return self._dispatcher_idle and not self._direct and not self._batches

    @property
    def is_accepting(self) -> bool:
        """True while ``submit`` admits requests (started, not draining or closed)."""
        return self._state is _Lifecycle.RUNNING

    @property
    def pending(self) -> int:
        """Requests queued or running; the manager never evicts while this is above 0."""
        return len(self._queue) + self._running_requests

    @property
    def breaker(self) -> CircuitBreaker:
        """The model's circuit breaker (read it; the scheduler feeds it)."""
        return self._breaker

    @property
    def counters(self) -> dict[str, int]:
        """Admission and outcome counters (:data:`ADMISSION_COUNTERS`, :data:`OUTCOME_COUNTERS`)
        and ``model_calls``; a copy."""
        return {key: self._counts[key] for key in _COUNTERS}

    def snapshot(self) -> SchedulerStats:
        """Queue, batching and breaker figures plus the request counters, typed."""
        cap, delay_s = self._limits()
        breaker = self._breaker
        state = breaker.state  # read once: an open breaker half-opens when it is read late
        opened_until = breaker.opened_until if state is BreakerState.OPEN else None
        return SchedulerStats(
            model=self.name,
            state=self._state.value,
            queue_depth=len(self._queue),
            max_queue_size=self.config.max_queue_size,
            running_requests=self._running_requests,
            batches_in_flight=len(self._batches),
            pending=self.pending,
            batch_size_cap=cap,
            queue_delay_s=delay_s,
            breaker_state=str(state),
            breaker_opened_until=opened_until,
            breaker_open_for_s=(
                None if opened_until is None else max(0.0, opened_until - self._clock.monotonic())
            ),
            breaker_times_opened=breaker.times_opened,
            p99_latency_s=self._adaptive.p99_s() if self._adaptive is not None else None,
            counters=self.counters,
        )

    def stats(self) -> dict[str, object]:
        """:meth:`snapshot` as the JSON-able dict the ``/v2/stats`` view shows."""
        return self.snapshot().as_dict()

    # ---------------------------------------------------------------- dispatching

    @property
    def _running_requests(self) -> int:
        return sum(len(requests) for requests in self._batches.values()) + self._direct

    def _limits(self) -> tuple[int, float]:
        if self._adaptive is not None:
            return self._adaptive.batch_size_cap, self._adaptive.delay_s
        if not self.config.is_batching:
            return 1, 0.0
        return self.config.max_batch_size, self.config.max_queue_delay_s

    async def _dispatch_loop(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                batch = await self._next_batch()
            except BaseException:
                self._slots.release()
                raise
            if batch is None:
                self._slots.release()
                return
            # No await between taking the batch and registering its task: whatever
            # happens next, the done callback answers the requests and frees the slot.
            task = asyncio.create_task(self._run_batch(batch), name=f"modelyard-batch-{self.name}")
            self._batches[task] = batch
            task.add_done_callback(self._batch_done)

    async def _next_batch(self) -> list[QueuedRequest] | None:
        """Wait until a batch is due; take it from the queue. None: drained and empty."""
        while True:
            if self._breaker.state is not BreakerState.CLOSED:
                self._reject_unrunnable()
            now = self._clock.monotonic()
            cap, delay_s = self._limits()
            dropped: list[QueuedRequest] = []
            selection = select_batch(
                self._live(now, dropped),
                max_rows=cap,
                preferred_sizes=self.config.preferred_batch_sizes,
                is_batching=self.config.is_batching,
                max_elements=self.config.max_batch_elements,
            )
            for request in dropped:
                self._expire_queued(request)
            if selection is None or self._direct:
                if selection is None and self._state is not _Lifecycle.RUNNING:
                    return None
                # Nothing to do, or a direct call holds the model: wait to be woken.
                self._dispatcher_idle = selection is None
                self._wakeup.clear()
                try:
                    await self._wakeup.wait()
                finally:
                    self._dispatcher_idle = False
                continue
            due = min(r.arrival for r in selection.entries) + delay_s
            if selection.is_ready or now >= due or self._state is not _Lifecycle.RUNNING:
                self._queue.take(selection.entries)
                for request in selection.entries:
                    request.state = RequestState.RUNNING
                return selection.entries
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(due - now):
                    await self._wakeup.wait()

    def _live(self, now: float, dropped: list[QueuedRequest]) -> Iterator[QueuedRequest]:
        """Queued requests in order, leaving answered or expired ones in ``dropped``."""
        for request in self._queue.ordered(now):
            if request.future.done() or request.deadline <= now:
                dropped.append(request)
            else:
                yield request

    def _expire_queued(self, request: QueuedRequest) -> None:
        self._queue.remove(request)
        request.state = RequestState.DONE
        self._breaker.release([request.permit])
        self._fail(request, self._deadline_error(request, was_run=False), "expired_queued")

    def _reject_unrunnable(self) -> None:
        """While the breaker is open or probing, fail queued requests that may not run."""
        for request in list(self._queue):
            if not self._breaker.may_run(request.permit):
                self._queue.remove(request)
                request.state = RequestState.DONE
                self._fail(request, self._circuit_open_error(), "circuit_open")

    def _can_run_direct(self) -> bool:
        """True when a request may skip the queue: the model is idle and nothing waits.

        On an idle model the queue and dispatcher add two event-loop hops and a task per
        request and gain nothing (there is no one to batch with, and no batching delay
        to wait for company). Only with one call
        in flight at a time, no adaptive controller and a closed breaker, so that what
        the dispatcher guarantees (one call at a time, breaker probes) still holds.
        """
        return (
            self._dispatcher_idle
            and not self._direct
            and not self._batches
            and not self._queue
            and self.config.max_concurrency == 1
            and self._adaptive is None
            and (not self.config.is_batching or self.config.max_queue_delay_s == 0)
            and self._breaker.state is BreakerState.CLOSED
        )

    async def _run_direct(
        self,
        inputs: dict[str, np.ndarray],
        priority: int,
        deadline: float,
        now: float,
        permit: Permit,
    ) -> dict[str, np.ndarray]:
        """Call the model in the submitter's own task (see :meth:`_can_run_direct`)."""
        request = QueuedRequest(
            inputs=inputs,
            priority=priority,
            deadline=deadline,
            arrival=now,
            seq=next(self._seq),
            rows=row_count(inputs),
            batch_key=None,
            future=asyncio.get_running_loop().create_future(),
            permit=permit,
            state=RequestState.RUNNING,
        )
        self._counts["accepted"] += 1
        self._direct += 1
        self._direct_idle.clear()
        me = asyncio.current_task()
        assert me is not None
        self._direct_tasks[me] = False
        try:
            report = await call_model(self.name, self._execute, self._clock, [request])
        except asyncio.CancelledError:
            self._breaker.release([permit])
            if self._direct_tasks.get(me):
                me.uncancel()
                self._counts["failed"] += 1
                raise self._not_ready_error("closed") from None
            self._counts["cancelled"] += 1
            raise
        finally:
            del self._direct_tasks[me]
            self._direct -= 1
            if not self._direct:
                self._direct_idle.set()
            request.state = RequestState.DONE
            if self._queue:
                self._wakeup.set()  # what arrived meanwhile waits for the dispatcher
        self._counts["model_calls"] += 1
        self._after_call(report)
        if report.error is not None:
            self._counts["failed"] += 1
            raise _copy_error(report.error)
        if request.deadline <= report.ended:
            self._counts["expired_running"] += 1
            raise self._deadline_error(request, was_run=True)
        self._counts["succeeded"] += 1
        return report.outputs[0]

    async def _run_batch(self, batch: list[QueuedRequest]) -> None:
        """Call the model for ``batch``; answer each request, feed breaker and metrics."""
        now = self._clock.monotonic()
        runnable: list[QueuedRequest] = []
        for request in batch:
            if request.future.done():  # its submitter left between dispatch and now
                self._breaker.release([request.permit])
            elif request.deadline <= now:
                self._breaker.release([request.permit])
                self._fail(request, self._deadline_error(request, was_run=False), "expired_queued")
            else:
                runnable.append(request)
        if not runnable:
            return
        report = await call_model(self.name, self._execute, self._clock, runnable)
        self._counts["model_calls"] += 1
        if isinstance(report.error, InvalidInputError) and len(runnable) > 1:
            # One bad request must not fail its neighbours: run each alone.
            self._after_call(report)
            for request in runnable:
                await self._run_batch([request])
            return
        if report.error is not None:
            for request in runnable:
                self._fail(request, _copy_error(report.error), "failed")
        else:
            for request, outputs in zip(runnable, report.outputs, strict=True):
                if request.deadline <= report.ended:
                    late = self._deadline_error(request, was_run=True)
                    self._fail(request, late, "expired_running")
                elif not request.future.done():
                    request.future.set_result(outputs)
        self._after_call(report)

    def _after_call(self, report: CallReport) -> None:
        permits = [r.permit for r in report.requests]
        if report.is_model_fault:
            self._breaker.record(failed=True, permits=permits)
        elif report.error is None:
            self._breaker.record(failed=False, permits=permits)
        else:
            self._breaker.release(permits)
        self._ewma_call_s = _ewma(self._ewma_call_s, report.compute_s)
        self._ewma_call_requests = _ewma(self._ewma_call_requests, float(len(report.requests)))
        if self._adaptive is not None and (
            report.error is None or isinstance(report.error, DeadlineExceededError)
        ):
            self._adaptive.observe(
                batch_size=report.rows,
                compute_s=report.compute_s,
                latencies_s=[report.ended - r.arrival for r in report.requests],
            )
        if self.on_batch is not None:
            waits_s = [report.started - r.arrival for r in report.requests]
            try:
                self.on_batch(report.rows, waits_s, report.compute_s)
            except Exception:
                logger.exception("model %r: on_batch hook failed; ignoring it", self.name)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        batch = self._batches.pop(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            logger.error(
                "model %r: batch task failed; its requests fail",
                self.name,
                exc_info=task.exception(),
            )
        for request in batch:
            request.state = RequestState.DONE
            if request.future.done():
                continue
            if self._state is _Lifecycle.CLOSED:
                error: ServerError = self._not_ready_error("closed while the request ran")
            else:
                error = InternalError(f"model {self.name!r}: the call ended without an answer")
            self._fail(request, error, "failed")

    def _dispatcher_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        logger.error(
            "model %r: dispatcher failed; failing queued requests",
            self.name,
            exc_info=task.exception(),
        )
        self._state = _Lifecycle.CLOSED
        for request in self._queue.clear():
            request.state = RequestState.DONE
            self._fail(request, InternalError(f"model {self.name!r}: scheduler failed"), "failed")

    # ---------------------------------------------------------------- answers

    def _fail(self, request: QueuedRequest, error: ServerError, outcome: str) -> None:
        """Answer ``request`` with ``error`` unless answered; ``outcome`` names its counter."""
        if not request.future.done():
            request.future.set_exception(error)
            request.outcome = outcome

    def _not_ready_error(self, why: str) -> ModelNotReadyError:
        return ModelNotReadyError(f"model {self.name!r} is not accepting requests ({why})")

    def _deadline_error(self, request: QueuedRequest, *, was_run: bool) -> DeadlineExceededError:
        waited_s = self._clock.monotonic() - request.arrival
        where = "while it was running" if was_run else "while it was queued; it was not run"
        return DeadlineExceededError(
            f"model {self.name!r}: deadline passed {where} ({waited_s:.3f} s after arrival)"
        )

    def _circuit_open_error(self) -> CircuitOpenError:
        retry_after_s = self._breaker.retry_after_s()
        if self._breaker.state is BreakerState.OPEN:
            why = f"circuit breaker is open for another {retry_after_s:.1f} s after failures"
        else:
            why = "circuit breaker is half-open and its probe requests are in flight"
        return CircuitOpenError(
            f"model {self.name!r}: {why}; retry in {retry_after_s:.1f} s",
            retry_after_s=retry_after_s,
        )

    def _estimate_retry_after_s(self) -> float:
        """Time to work off the queue at the recent pace of model calls."""
        if self._ewma_call_s is None or not self._ewma_call_requests:
            return 1.0
        calls = math.ceil(len(self._queue) / self._ewma_call_requests)
        estimate = calls * self._ewma_call_s / self.config.max_concurrency
        low, high = _RETRY_AFTER_BOUNDS_S
        return min(high, max(low, estimate))


def _copy_error(error: ServerError) -> ServerError:
    """A copy per request, so concurrent raises do not share one traceback."""
    try:
        return copy.copy(error)
    except Exception:  # a subclass whose constructor copy cannot call
        return error


def _ewma(old: float | None, value: float) -> float:
    return value if old is None else old + _EWMA_ALPHA * (value - old)
