"""BatchDispatcher: the dispatcher task of one model's scheduler.

One task waits until a batch is due (:mod:`~modelyard.scheduling.batcher` over the
priority queue: full, at a preferred size, or its oldest request has waited its delay),
takes it, and runs it as a task of its own, at most ``max_concurrency`` at once (with
one, the default, in the dispatcher's own task); each batch calls the model and answers
its requests. Queued requests whose deadline passed, or that an open breaker may not
run, are answered here without running.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator

from modelyard.errors import (
    DeadlineExceededError,
    DeadlineUnreachableError,
    InternalError,
    InvalidInputError,
    ServerError,
)
from modelyard.scheduling.batcher import select_batch
from modelyard.scheduling.breaker import BreakerState
from modelyard.scheduling.dispatcher import call_model, total_rows
from modelyard.scheduling.request_queue import QueuedRequest, RequestState
from modelyard.scheduling.scheduler_core import Lifecycle, SchedulerCore, copy_error, logger
from modelyard.scheduling.wait_estimate import RunningCall

__all__ = ["LATE_CALLS", "BatchDispatcher"]

LATE_CALLS = 2.0
"""With early rejection, a queued request is refused unrun once less time is left than
this many of its calls: a call that overruns its deadline gets its worker stopped, which
fails everything else queued, so a call is only started with one call's time to spare."""


class BatchDispatcher(SchedulerCore):
    """Form batches from the queue and run them; see the module docstring."""

    async def _dispatch_loop(self) -> None:
        if self.config.max_concurrency == 1:
            await self._dispatch_inline()
            return
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

    async def _dispatch_inline(self) -> None:
        """One call at a time (``max_concurrency: 1``, the default): each batch runs in
        the dispatcher's own task, which would only wait for a batch task to end before
        taking the next batch (a task per batch costs its creation, a loop turn and a
        done callback). Registered in ``_batches`` as a batch task is, so drain, close
        and the counts see it; answered as :meth:`_batch_done` answers one."""
        task = asyncio.current_task()
        assert task is not None
        while True:
            batch = await self._next_batch()
            if batch is None:
                return
            self._batches[task] = batch
            error: BaseException | None = None
            try:
                await self._run_batch(batch)
            except Exception as exc:  # answered below; the dispatcher goes on
                error = exc
            finally:
                del self._batches[task]
                self._answer_left(batch, error)
            if self._queue.rows < self._limits()[0]:
                # The next batch would not be full: one loop turn first, so the clients
                # this batch answered run, and those that send again join it (taking
                # the queue at once made the digits mix's batches 5 rows, not 8). A
                # full batch goes at once: the worker computes while the loop answers.
                await asyncio.sleep(0)

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
                if request.deadline <= now or request.future.done():
                    self._expire_queued(request)
                else:
                    self._refuse_late(request, now)
            if selection is None or self._direct:
                if selection is None and self._state is not Lifecycle.RUNNING:
                    return None
                # Nothing to do, or a direct call holds the model: wait to be woken.
                self._dispatcher_idle = selection is None
                self._wakeup.clear()
                try:
                    await self._wakeup.wait()
                finally:
                    self._dispatcher_idle = False
                continue
            due = now if selection.is_ready else _oldest(selection.entries) + delay_s
            if now >= due or self._state is not Lifecycle.RUNNING:
                self._queue.take(selection.entries)
                for request in selection.entries:
                    request.state = RequestState.RUNNING
                self._refuse_behind(selection.entries, now)
                return selection.entries
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(due - now):
                    await self._wakeup.wait()

    def _live(self, now: float, dropped: list[QueuedRequest]) -> Iterator[QueuedRequest]:
        """Queued requests in order, leaving in ``dropped`` the answered or expired ones
        and, with early rejection, those too late to finish even if they ran now."""
        early = self.config.early_rejection
        predict_s = self._service.predict_s
        calls_s: dict[int, float | None] = {}  # by rows: most requests share a few sizes
        for request in self._queue.ordered(now):
            if early and not request.probe:
                rows = request.rows
                if rows in calls_s:
                    call_s = calls_s[rows]
                else:
                    call_s = calls_s[rows] = predict_s(rows)
            else:
                call_s = None
            if (
                request.future.done()
                or request.deadline <= now
                or (call_s is not None and request.deadline - now < LATE_CALLS * call_s)
            ):
                dropped.append(request)
            else:
                yield request

    def _refuse_behind(self, batch: list[QueuedRequest], now: float) -> None:
        """With early rejection and one slot: refuse now the queued requests that could
        not finish by their deadline even if they ran right after ``batch``, instead of
        letting them time out in the queue while it runs."""
        if not self.config.early_rejection or self.config.max_concurrency != 1:
            return
        service = self._service
        predict_s = service.predict_s
        batch_s = predict_s(total_rows(batch))
        if batch_s is None:
            return
        queue = self._queue
        upper_s = service.upper_s
        # Any request's limit is at most batch_s + LATE_CALLS * upper_s (no call is
        # predicted above upper_s): when even the earliest deadline is further away,
        # nothing is late and the queue is not walked (most batches under load).
        if upper_s is not None and queue.earliest_deadline - now >= batch_s + LATE_CALLS * upper_s:
            return
        # No generator or estimate per request (rows repeat, so their call times are
        # looked up once per size).
        limits_s: dict[int, float] = {}
        late = []
        earliest = math.inf
        for request in queue:
            if request.deadline < earliest:
                earliest = request.deadline
            if request.probe:
                continue
            rows = request.rows
            limit_s = limits_s.get(rows)
            if limit_s is None:
                limit_s = limits_s[rows] = batch_s + LATE_CALLS * (predict_s(rows) or 0)
            if request.deadline - now < limit_s:
                late.append(request)
        queue.note_earliest(earliest)
        for request in late:
            self._refuse_late(request, now)

    def _refuse_late(self, request: QueuedRequest, now: float) -> None:
        """Answer a queued request that can no longer finish by its deadline: it never
        ran, so its fallback (if any) may still answer, and running it would only
        overrun (and the worker layer stops workers that overrun)."""
        self._queue.remove(request)
        request.state = RequestState.DONE
        self._breaker.release([request.permit])
        left_s = request.deadline - now
        error = DeadlineUnreachableError(
            f"model {self.name!r}: the request waited {now - request.arrival:.3f} s; the "
            f"{left_s:.3f} s left before its deadline are too few for the calls before it "
            "and its own; not run",
            retry_after_s=1.0,
        )
        self._fail(request, error, "unreachable_queued")

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

    async def _run_batch(self, batch: list[QueuedRequest]) -> None:
        """Call the model for ``batch``; answer each request, feed breaker and metrics."""
        now = self._clock.monotonic()
        runnable: list[QueuedRequest] = []
        rows = 0
        for request in batch:
            if request.future.done():  # its submitter left between dispatch and now
                self._breaker.release([request.permit])
            elif request.deadline <= now:
                self._breaker.release([request.permit])
                self._fail(request, self._deadline_error(request, was_run=False), "expired_queued")
            else:
                runnable.append(request)
                rows += request.rows
        if not runnable:
            return
        self._in_call[id(runnable)] = RunningCall(now, rows)
        try:
            report = await call_model(self.name, self._execute, self._clock, runnable)
        finally:
            del self._in_call[id(runnable)]
        self._counts["model_calls"] += 1
        if isinstance(report.error, InvalidInputError) and len(runnable) > 1:
            # One bad request must not fail its neighbours: run each alone.
            self._after_call(report)
            for request in runnable:
                await self._run_batch([request])
            return
        if report.error is not None:
            # A call stopped at its deadline expired running; anything else failed.
            expired = isinstance(report.error, DeadlineExceededError)
            for request in runnable:
                self._fail(
                    request, copy_error(report.error), "expired_running" if expired else "failed"
                )
        else:
            for request, outputs in zip(runnable, report.outputs, strict=True):
                if request.deadline <= report.ended:
                    late = self._deadline_error(request, was_run=True)
                    self._fail(request, late, "expired_running")
                elif not request.future.done():
                    request.future.set_result(outputs)
        self._after_call(report)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        batch = self._batches.pop(task)
        self._slots.release()
        self._answer_left(batch, None if task.cancelled() else task.exception())

    def _answer_left(self, batch: list[QueuedRequest], error: BaseException | None) -> None:
        """After a batch's call: fail whatever it left unanswered (``error``: what the
        batch's run raised, logged; None when it ended or was cancelled)."""
        if error is not None:
            logger.error(
                "model %r: batch task failed; its requests fail", self.name, exc_info=error
            )
        for request in batch:
            request.state = RequestState.DONE
            if request.future.done():
                continue
            if self._state is Lifecycle.CLOSED:
                failure: ServerError = self._not_ready_error("closed while the request ran")
            else:
                failure = InternalError(f"model {self.name!r}: the call ended without an answer")
            self._fail(request, failure, "failed")

    def _dispatcher_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        logger.error(
            "model %r: dispatcher failed; failing queued requests",
            self.name,
            exc_info=task.exception(),
        )
        self._state = Lifecycle.CLOSED
        for request in self._queue.clear():
            request.state = RequestState.DONE
            self._fail(request, InternalError(f"model {self.name!r}: scheduler failed"), "failed")


def _oldest(requests: list[QueuedRequest]) -> float:
    """The earliest arrival among ``requests`` (a loop: no generator per request)."""
    oldest = requests[0].arrival
    for request in requests:
        if request.arrival < oldest:
            oldest = request.arrival
    return oldest
