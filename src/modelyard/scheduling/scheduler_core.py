"""SchedulerCore: the state one model's scheduler shares between admission and dispatch.

:class:`~modelyard.scheduling.scheduler.ModelScheduler` admits requests and runs the
direct path; :class:`~modelyard.scheduling.batch_dispatch.BatchDispatcher` forms and runs
batches. Both read and write the state built here (queue, breaker, adaptive controller,
counters, the running batches), feed the breaker and the metrics hook after each model
call through :meth:`SchedulerCore._after_call`, and answer requests with the typed errors
built here, so every refusal reads the same whichever path produced it.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import math
from collections import Counter, deque
from collections.abc import Callable
from enum import Enum

from modelyard.clock import Clock, MonotonicClock
from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    DeadlineUnreachableError,
    LoadShedError,
    ModelNotReadyError,
    OverloadedError,
    ServerError,
)
from modelyard.scheduling.adaptive import AdaptiveBatchController
from modelyard.scheduling.breaker import BreakerState, CircuitBreaker, Permit
from modelyard.scheduling.config import SchedulerConfig
from modelyard.scheduling.deadline_sweep import DeadlineSweep
from modelyard.scheduling.degradation import Refusal, decide
from modelyard.scheduling.dispatcher import MODEL_FAULTS, CallReport, Execute
from modelyard.scheduling.probe import Prober
from modelyard.scheduling.request_queue import QueuedRequest, RequestQueue, RequestState
from modelyard.scheduling.wait_estimate import (
    RunningCall,
    ServiceTimes,
    admission_bound_s,
    estimate_latency_s,
    share_left,
)

__all__ = [
    "ADMISSION_COUNTERS",
    "COUNTERS",
    "OUTCOME_COUNTERS",
    "BatchHook",
    "Lifecycle",
    "SchedulerCore",
    "copy_error",
]

# The scheduler's one logger name, whichever part of it logs.
logger = logging.getLogger("modelyard.scheduling.scheduler")

BatchHook = Callable[[int, list[float], float], None]
"""``on_batch(batch_rows, queue_wait_s_per_request, compute_s)``, called after each model call."""

ADMISSION_COUNTERS = (
    "accepted",
    "rejected_not_ready",
    "rejected_expired",
    "rejected_overloaded",
    "rejected_circuit",
    "rejected_unreachable",
    "rejected_shed",
    "rejected_too_large",
)
"""``stats()`` counters of admission: accepted, or refused at once (and why):
``rejected_unreachable`` (deadline cannot be met) and ``rejected_shed`` (shed by priority)
come from :mod:`~modelyard.scheduling.degradation`."""
OUTCOME_COUNTERS = (
    "succeeded",
    "failed",
    "expired_queued",
    "expired_running",
    "unreachable_queued",
    "circuit_open",
    "cancelled",
)
"""``stats()`` counters of what became of accepted requests; once settled, they sum to
``accepted``. ``circuit_open`` counts queued requests failed because the breaker opened;
``unreachable_queued`` those refused at dispatch because less time was left than one
call takes (early rejection)."""
COUNTERS = (*ADMISSION_COUNTERS, *OUTCOME_COUNTERS, "model_calls", "probes")
_RETRY_AFTER_BOUNDS_S = (0.01, 30.0)
ARRIVAL_WINDOW_S = 2.0
"""How far back admitted requests count toward the arrival rate of each priority."""
_EWMA_ALPHA = 0.2
_ROUNDING = 2.0
"""Margin on the bound of a latency estimate below which admission skips estimating."""


class Lifecycle(Enum):
    """Where a scheduler is in its life; ``submit`` admits only while RUNNING."""

    NEW = "new"
    RUNNING = "running"
    DRAINING = "draining"
    CLOSED = "closed"


class SchedulerCore:
    """The state and the answers both halves of a model's scheduler share."""

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
        self._fixed_limits = (
            (config.max_batch_size, config.max_queue_delay_s) if config.is_batching else (1, 0.0)
        )
        """Batch cap and delay without an adaptive controller (the config is frozen)."""
        self._may_run_direct = (
            config.max_concurrency == 1
            and self._adaptive is None
            and (not config.is_batching or config.max_queue_delay_s == 0)
        )
        """What of the direct path's condition the (frozen) config decides, read once."""
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
        self._state = Lifecycle.NEW
        self._dispatcher: asyncio.Task[None] | None = None
        self._batches: dict[asyncio.Task[None], list[QueuedRequest]] = {}
        self._seq = itertools.count()
        self._counts: Counter[str] = Counter()
        self._ewma_call_s: float | None = None
        self._ewma_call_requests: float | None = None
        self._service = ServiceTimes(clock=self._clock)
        """Measured compute seconds per batch size: what the wait estimate runs on."""
        self._arrivals: deque[tuple[float, int, int]] = deque()
        """``(time, priority, rows)`` of requests admitted in the last ARRIVAL_WINDOW_S."""
        self._arrival_rows: dict[int, int] = {}
        """Rows of ``_arrivals`` by priority, kept with it: the estimate reads these sums
        (a few priorities) instead of walking the window (thousands of requests)."""
        self._in_call: dict[int, RunningCall] = {}
        """Model calls in flight (keyed by the id of their request list), for the estimate."""
        self._prober = Prober()
        """Admits a refused request on an idle model now and then (:mod:`.probe`)."""
        self._sweep = DeadlineSweep(self._expire_waiting)
        """Answers queued and running requests at their deadlines (one timer, not one each)."""

    @property
    def _running_requests(self) -> int:
        return sum(len(requests) for requests in self._batches.values()) + self._direct

    def _limits(self) -> tuple[int, float]:
        if self._adaptive is not None:
            return self._adaptive.batch_size_cap, self._adaptive.delay_s
        return self._fixed_limits

    def _after_call(self, report: CallReport) -> None:
        requests = report.requests
        permits = [r.permit for r in requests]
        rows = report.rows
        compute_s = report.compute_s
        if report.is_model_fault:
            self._breaker.record(failed=True, permits=permits)
        elif report.error is None:
            self._breaker.record(failed=False, permits=permits)
        else:
            self._breaker.release(permits)
        if report.error is None:
            self._service.observe(rows, compute_s, replace=self._prober.measured())
        self._ewma_call_s = _ewma(self._ewma_call_s, compute_s)
        self._ewma_call_requests = _ewma(self._ewma_call_requests, float(len(requests)))
        if self._adaptive is not None and (
            report.error is None or isinstance(report.error, DeadlineExceededError)
        ):
            self._adaptive.observe(
                batch_size=rows,
                compute_s=compute_s,
                latencies_s=[report.ended - r.arrival for r in requests],
            )
        if self.on_batch is not None:
            started = report.started
            waits_s = [started - r.arrival for r in requests]
            try:
                self.on_batch(rows, waits_s, compute_s)
            except Exception:
                logger.exception("model %r: on_batch hook failed; ignoring it", self.name)

    def _after_one(
        self,
        permit: Permit,
        rows: int,
        arrival: float,
        deadline: float,
        error: ServerError | None,
        started: float,
        ended: float,
    ) -> None:
        """:meth:`_after_call` for a call of one request (the direct path), unrolled."""
        compute_s = ended - started
        if error is None:
            self._breaker.record_one(failed=ended > deadline, permit=permit)
            self._service.observe(rows, compute_s, replace=self._prober.measured())
        elif isinstance(error, MODEL_FAULTS):
            self._breaker.record_one(failed=True, permit=permit)
        else:
            self._breaker.release((permit,))
        old = self._ewma_call_s
        self._ewma_call_s = compute_s if old is None else old + _EWMA_ALPHA * (compute_s - old)
        old = self._ewma_call_requests
        self._ewma_call_requests = 1.0 if old is None else old + _EWMA_ALPHA * (1.0 - old)
        if self._adaptive is not None and (
            error is None or isinstance(error, DeadlineExceededError)
        ):
            self._adaptive.observe(
                batch_size=rows, compute_s=compute_s, latencies_s=[ended - arrival]
            )
        if self.on_batch is not None:
            try:
                self.on_batch(rows, [started - arrival], compute_s)
            except Exception:
                logger.exception("model %r: on_batch hook failed; ignoring it", self.name)

    # ---------------------------------------------------------------- degradation

    @property
    def service_times(self) -> ServiceTimes:
        """The measured compute seconds per batch size (read it; the scheduler feeds it)."""
        return self._service

    def estimate_latency_s(self, priority: int, rows: int = 1) -> float | None:
        """Estimated seconds until a request of ``priority`` and ``rows`` queued now is
        answered (see :mod:`~modelyard.scheduling.wait_estimate`); None before any call.
        ``rows=0``: until its call would start (its wait, what shedding protects)."""
        if not self._service.is_known:
            return None
        now = self._clock.monotonic()
        queue = self._queue
        # Most requests find the queue empty (one at a time, or the direct path).
        ahead = (
            sum(
                request.rows
                for request in queue
                if queue.effective_priority(request, now) <= priority
            )
            if queue
            else 0
        )
        cap = self._limits()[0]
        estimate = estimate_latency_s(
            self._service,
            now=now,
            rows_ahead=ahead,
            own_rows=rows,
            batch_cap=cap,
            concurrency=self.config.max_concurrency,
            running=self._in_call.values(),
        )
        if estimate is None:
            return None
        self._forget_arrivals(now)
        higher = sum(r for p, r in self._arrival_rows.items() if p < priority) / ARRIVAL_WINDOW_S
        return estimate / share_left(higher, self._service, cap)

    def _note_arrival(self, priority: int, rows: int, now: float) -> None:
        """Count an admitted request toward its priority's arrival rate."""
        arrivals = self._arrivals
        arrivals.append((now, priority, rows))
        self._arrival_rows[priority] = self._arrival_rows.get(priority, 0) + rows
        if arrivals[0][0] < now - ARRIVAL_WINDOW_S:  # the check, without a call per request
            self._forget_arrivals(now)

    def _forget_arrivals(self, now: float) -> None:
        arrivals, by_priority = self._arrivals, self._arrival_rows
        while arrivals and arrivals[0][0] < now - ARRIVAL_WINDOW_S:
            _, priority, rows = arrivals.popleft()
            left = by_priority[priority] - rows
            if left:
                by_priority[priority] = left
            else:
                del by_priority[priority]

    def _probe_instead(self, now: float) -> bool:
        """True when a request admission would refuse is admitted as a probe instead."""
        if not self._prober.admit(now, idle=not (self._in_call or self._queue.size)):
            return False
        self._counts["probes"] += 1
        return True

    def _refusal(self, priority: int, rows: int, now: float, deadline: float) -> Refusal | None:
        config = self.config
        if not config.latency_slo_by_priority_s:
            if not config.early_rejection:
                return None
            # Only the deadline can refuse. The estimate plus the slack is at most
            # admission_bound_s (from the queued and running rows alone): a deadline well
            # beyond it (most requests) is admitted without estimating, with the same
            # outcome, and without the estimate's walk over the queue.
            in_call = self._in_call
            bound_s = admission_bound_s(
                self._service,
                queued_rows=self._queue.rows,
                own_rows=rows,
                running_rows=[call.rows for call in in_call.values()] if in_call else (),
                batch_cap=self._limits()[0],
            )
            if bound_s is None:
                return None  # nothing measured: no estimate, never refused on a guess
            if deadline - now > _ROUNDING * bound_s:
                return None
        return decide(
            priority=priority,
            now=now,
            deadline=deadline,
            # A more important class is protected from the wait ahead of it, not from the
            # length of its own call (shedding others cannot shorten that).
            estimate_s=lambda q: self.estimate_latency_s(q, max(1, rows) if q == priority else 0),
            early_rejection=config.early_rejection,
            by_priority_s=config.latency_slo_by_priority_s,
            default_slo_s=config.latency_slo_s,
            slack_s=self._service.predict_s(rows) or 0.0,
        )

    def _refusal_error(self, refusal: Refusal, priority: int) -> OverloadedError:
        """The typed answer to a refused request; Retry-After is the excess over its limit."""
        low, high = _RETRY_AFTER_BOUNDS_S
        retry_after_s = min(high, max(low, refusal.estimate_s - refusal.limit_s))
        if refusal.reason == "deadline":
            self._counts["rejected_unreachable"] += 1
            return DeadlineUnreachableError(
                f"model {self.name!r}: the request would be answered in about "
                f"{refusal.estimate_s:.3f} s, after its deadline ({refusal.limit_s:.3f} s "
                f"left); refused at once; retry in about {retry_after_s:.2f} s",
                retry_after_s=retry_after_s,
            )
        self._counts["rejected_shed"] += 1
        if refusal.protected is not None:
            why = f"to keep priority {refusal.protected} within its latency objective"
        else:
            why = (
                f"its estimated latency {refusal.estimate_s:.3f} s is over the objective "
                f"of priority {priority} ({refusal.limit_s:.3f} s)"
            )
        return LoadShedError(
            f"model {self.name!r} is overloaded: priority {priority} request shed {why}; "
            f"retry in about {retry_after_s:.2f} s",
            retry_after_s=retry_after_s,
        )

    # ---------------------------------------------------------------- answers

    def _fail(self, request: QueuedRequest, error: ServerError, outcome: str) -> None:
        """Answer ``request`` with ``error`` unless answered; ``outcome`` names its counter."""
        if not request.future.done():
            request.future.set_exception(error)
            request.outcome = outcome

    def _expire_waiting(self, request: QueuedRequest) -> None:
        """The sweep's answer to a request whose deadline came: one still queued leaves
        the queue unrun; one running is answered now (its call goes on)."""
        if request.future.done():
            return
        if request.state is RequestState.QUEUED:
            request.state = RequestState.DONE
            self._queue.remove(request)
            self._breaker.release([request.permit])
            self._fail(request, self._deadline_error(request, was_run=False), "expired_queued")
        elif request.state is RequestState.RUNNING:
            self._fail(request, self._deadline_error(request, was_run=True), "expired_running")

    def _not_ready_error(self, why: str) -> ModelNotReadyError:
        return ModelNotReadyError(f"model {self.name!r} is not accepting requests ({why})")

    def _deadline_error(self, request: QueuedRequest, *, was_run: bool) -> DeadlineExceededError:
        waited_s = self._clock.monotonic() - request.arrival
        where = "while it was running" if was_run else "while it was queued; it was not run"
        return DeadlineExceededError(
            f"model {self.name!r}: deadline passed {where} ({waited_s:.3f} s after arrival)"
        )

    def _late_error(self, arrival: float) -> DeadlineExceededError:
        """:meth:`_deadline_error` of a request that arrived at ``arrival`` and ran late."""
        waited_s = self._clock.monotonic() - arrival
        return DeadlineExceededError(
            f"model {self.name!r}: deadline passed while it was running "
            f"({waited_s:.3f} s after arrival)"
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


def copy_error(error: ServerError) -> ServerError:
    """A copy per request, so concurrent raises do not share one traceback."""
    try:
        return copy.copy(error)
    except Exception:  # a subclass whose constructor copy cannot call
        return error


def _ewma(old: float | None, value: float) -> float:
    return value if old is None else old + _EWMA_ALPHA * (value - old)
