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
import math

import numpy as np

from modelyard.errors import (
    DeadlineExceededError,
    InvalidInputError,
    OverloadedError,
    PayloadTooLargeError,
    ServerError,
)
from modelyard.scheduling.batch_dispatch import BatchDispatcher
from modelyard.scheduling.batcher import batch_key, row_count
from modelyard.scheduling.breaker import BreakerState, CircuitBreaker, Permit
from modelyard.scheduling.dispatcher import Execute, untyped_error
from modelyard.scheduling.request_queue import QueuedRequest, RequestState
from modelyard.scheduling.scheduler_core import (
    ADMISSION_COUNTERS,
    COUNTERS,
    OUTCOME_COUNTERS,
    BatchHook,
    Lifecycle,
    copy_error,
)
from modelyard.scheduling.stats import SchedulerStats
from modelyard.scheduling.wait_estimate import RunningCall

__all__ = ["ADMISSION_COUNTERS", "OUTCOME_COUNTERS", "BatchHook", "Execute", "ModelScheduler"]


def _consume_exception(future: asyncio.Future[dict[str, np.ndarray]]) -> None:
    """Read the error of a request answered just as its submitter was cancelled: nobody
    else reads it, and asyncio would log "exception was never retrieved". (Called there,
    not as a done callback: that would be one more loop callback on every request.)"""
    if future.done() and not future.cancelled():
        future.exception()


class ModelScheduler(BatchDispatcher):
    """Queue, batch and dispatch the requests of one model; see the module docstring.

    The constructor, the shared state and the typed answers are
    :class:`~modelyard.scheduling.scheduler_core.SchedulerCore`'s; the dispatcher task is
    :class:`~modelyard.scheduling.batch_dispatch.BatchDispatcher`'s. This class admits
    requests, runs the direct path and reports.
    """

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Start the dispatcher; ``submit`` is refused before this. Idempotent."""
        if self._state is Lifecycle.RUNNING:
            return
        if self._state is not Lifecycle.NEW:
            raise RuntimeError(f"scheduler of model {self.name!r} cannot restart once stopped")
        self._state = Lifecycle.RUNNING
        self._dispatcher = asyncio.create_task(
            self._dispatch_loop(), name=f"modelyard-scheduler-{self.name}"
        )
        self._dispatcher.add_done_callback(self._dispatcher_done)

    async def drain(self) -> None:
        """Refuse new requests (``ModelNotReadyError``), finish queued and running ones."""
        if self._state is Lifecycle.RUNNING:
            self._state = Lifecycle.DRAINING
            self._wakeup.set()
        elif self._state is Lifecycle.NEW:
            self._state = Lifecycle.DRAINING
        if self._dispatcher is not None and not self._dispatcher.done():
            # asyncio.wait, not await: a cancelled drain must not cancel the dispatcher.
            await asyncio.wait([self._dispatcher])
        while self._batches:
            await asyncio.wait(list(self._batches))
        while self._direct:
            await self._direct_idle.wait()
        self._sweep.close()

    async def close(self) -> None:
        """Fail queued and running requests with ``ModelNotReadyError``; stop every task."""
        self._state = Lifecycle.CLOSED
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
        self._sweep.close()

    # ---------------------------------------------------------------- requests

    async def submit(
        self, inputs: dict[str, np.ndarray], *, priority: int | None, deadline: float
    ) -> dict[str, np.ndarray]:
        """Run ``inputs`` on the model, batched with others when possible; return outputs.

        ``priority`` (1 is the highest; None: the configured default) orders the queue;
        ``deadline`` is absolute monotonic seconds on the scheduler's clock (``math.inf``:
        none). Raises
        ``ModelNotReadyError`` (not started, draining, closed), ``InvalidInputError``
        (bad priority), ``PayloadTooLargeError`` (more rows than ``max_request_rows``),
        ``OverloadedError`` (queue full; its subclasses ``DeadlineUnreachableError`` and
        ``LoadShedError`` when refused early, see :mod:`~modelyard.scheduling.degradation`),
        ``CircuitOpenError``, ``DeadlineExceededError``,
        or whatever typed error the model call raised.
        """
        if self._state is not Lifecycle.RUNNING:
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
        queue = self._queue
        if queue.size >= queue.max_size:  # is_full, read without a call
            self._counts["rejected_overloaded"] += 1
            retry_after_s = self._estimate_retry_after_s()
            raise OverloadedError(
                f"model {self.name!r}: queue full ({len(self._queue)} requests waiting); "
                f"retry in about {retry_after_s:.2f} s",
                retry_after_s=retry_after_s,
            )
        rows = row_count(inputs)
        limit = self.config.max_request_rows
        if limit is not None and rows > limit:
            self._counts["rejected_too_large"] += 1
            raise PayloadTooLargeError(
                f"model {self.name!r} takes at most {limit} rows per request "
                f"(max_request_rows), this one has {rows}: it cannot run within the "
                "model's deadline; split it"
            )
        refusal = self._refusal(level, rows, now, deadline)
        probe = False
        if refusal is not None:
            # An idle model lets one refused request through now and then: the estimate
            # may be what is wrong, and only a call can tell (see probe.py).
            if not self._probe_instead(now):
                raise self._refusal_error(refusal, level)
            probe = True
        self._note_arrival(level, rows, now)
        permit = self._breaker.admit()
        if permit is None:
            self._counts["rejected_circuit"] += 1
            raise self._circuit_open_error()
        # _can_run_direct's first condition read here: no call per request under load.
        if self._dispatcher_idle and self._can_run_direct():
            return await self._run_direct(inputs, rows, level, deadline, now, permit)
        loop = asyncio.get_running_loop()
        # Positional (the fields' order): half the cost of keywords, on every request.
        request = QueuedRequest(
            inputs,  # inputs
            level,  # priority
            deadline,
            now,  # arrival
            next(self._seq),  # seq
            rows,
            batch_key(inputs),
            loop.create_future(),  # future
            permit,
        )
        if probe:
            request.probe = True
        self._queue.push(request)
        self._counts["accepted"] += 1
        self._wakeup.set()
        # The deadline is watched by the scheduler's one sweep timer (``_expire_waiting``
        # answers the request there), on the loop's time as asyncio.timeout would.
        entry = (
            None
            if math.isinf(deadline)
            else self._sweep.watch(loop, loop.time() + (deadline - now), request)
        )
        # Outcomes are counted here, once per admitted request, whoever answered it.
        try:
            outputs = await request.future
        except ServerError:
            self._counts[request.outcome] += 1
            raise
        except asyncio.CancelledError:
            _consume_exception(request.future)
            self._counts["cancelled"] += 1
            raise
        finally:
            if entry is not None:
                entry[2] = None  # answered: the sweep skips it
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
        return self._state is Lifecycle.RUNNING

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
        return {key: self._counts[key] for key in COUNTERS}

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

    # ---------------------------------------------------------------- direct path

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
            and not self._queue.size
            and self._may_run_direct
            and self._breaker.is_closed
        )

    async def _run_direct(
        self,
        inputs: dict[str, np.ndarray],
        rows: int,
        priority: int,
        deadline: float,
        now: float,
        permit: Permit,
    ) -> dict[str, np.ndarray]:
        """Call the model in the submitter's own task (see :meth:`_can_run_direct`).

        What a batch of one through the dispatcher would do, without its objects: no
        queue entry, future or report; the breaker, estimates and hook are fed alike."""
        counts = self._counts
        counts["accepted"] += 1
        self._direct += 1
        self._direct_idle.clear()
        me = asyncio.current_task()
        assert me is not None
        self._direct_tasks[me] = False
        in_call = self._in_call
        key = id(me)  # a task makes one direct call at a time
        in_call[key] = RunningCall(now, rows)
        # dispatcher.call_model for a batch of one, unrolled: a batch of one is not split,
        # so its outputs are not checked against the batch either.
        clock = self._clock
        outputs: dict[str, np.ndarray] | None = None
        error: ServerError | None = None
        started = clock.monotonic()
        try:
            try:
                outputs = dict(await self._execute(dict(inputs), deadline))
            except ServerError as exc:
                error = exc
            except Exception as exc:
                error = untyped_error(self.name, exc)
            ended = clock.monotonic()
        except asyncio.CancelledError:
            self._breaker.release([permit])
            if self._direct_tasks.get(me):
                me.uncancel()
                counts["failed"] += 1
                raise self._not_ready_error("closed") from None
            counts["cancelled"] += 1
            raise
        finally:
            del in_call[key]
            del self._direct_tasks[me]
            self._direct -= 1
            if not self._direct:
                self._direct_idle.set()
            if self._queue.size:
                self._wakeup.set()  # what arrived meanwhile waits for the dispatcher
        counts["model_calls"] += 1
        self._after_one(permit, rows, now, deadline, error, started, ended)
        if error is not None:
            # A call stopped at its deadline (the instance's timeout) expired running; it
            # did not fail.
            expired = isinstance(error, DeadlineExceededError)
            counts["expired_running" if expired else "failed"] += 1
            raise copy_error(error)
        if deadline <= ended:
            counts["expired_running"] += 1
            raise self._late_error(now)
        counts["succeeded"] += 1
        assert outputs is not None
        return outputs
