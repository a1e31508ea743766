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
from collections import Counter
from collections.abc import Callable
from enum import Enum

from modelyard.clock import Clock, MonotonicClock
from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    ModelNotReadyError,
    ServerError,
)
from modelyard.scheduling.adaptive import AdaptiveBatchController
from modelyard.scheduling.breaker import BreakerState, CircuitBreaker
from modelyard.scheduling.config import SchedulerConfig
from modelyard.scheduling.dispatcher import CallReport, Execute
from modelyard.scheduling.request_queue import QueuedRequest, RequestQueue

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
COUNTERS = (*ADMISSION_COUNTERS, *OUTCOME_COUNTERS, "model_calls")
_RETRY_AFTER_BOUNDS_S = (0.01, 30.0)
_EWMA_ALPHA = 0.2


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

    @property
    def _running_requests(self) -> int:
        return sum(len(requests) for requests in self._batches.values()) + self._direct

    def _limits(self) -> tuple[int, float]:
        if self._adaptive is not None:
            return self._adaptive.batch_size_cap, self._adaptive.delay_s
        if not self.config.is_batching:
            return 1, 0.0
        return self.config.max_batch_size, self.config.max_queue_delay_s

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


def copy_error(error: ServerError) -> ServerError:
    """A copy per request, so concurrent raises do not share one traceback."""
    try:
        return copy.copy(error)
    except Exception:  # a subclass whose constructor copy cannot call
        return error


def _ewma(old: float | None, value: float) -> float:
    return value if old is None else old + _EWMA_ALPHA * (value - old)
