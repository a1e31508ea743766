"""Cache learning off the request path: requests are recorded, then learnt in batches.

Every request teaches the cache something: the hot rule's decayed demand, the eviction
policy's episodes and gaps (``arrival-cost``), the prefetcher's Markov chain, arrival
histograms and pre-warm windows, and the opt-in request log. Done on the request path,
that learning cost about a quarter of the event loop's CPU per request
(``bench/bench_feature_cost.py``; docs/decisions/0034-learning-off-the-request-path.md).

So a request only records a compact event, ``(record, time, cold)``, into
:class:`RequestEvents`' buffer; the first event of a batch schedules one
:meth:`RequestEvents.flush` :data:`LEARN_EVERY_S` later (``loop.call_later``).
The flush hands each *run* of consecutive events of one model version to the learners'
batch methods (``observe_run``, ``on_requests``, ``after_run``), which leave exactly
the state one call per request would, in the same order, and takes the prefetch
decision once per run, after its last request.

What must see a request at once is not deferred: ``stats.last_used`` (LRU's recency)
and ``stats.requests`` (LFU's counts) are written by the request itself. Whatever reads
the learnt state to decide (admission's hot set and victims, an eviction's bookkeeping,
the pre-warm timer, a model's removal) calls :meth:`RequestEvents.flush` first, so a
decision taken after a request, even in its own loop turn, sees it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence

from modelyard.manager.demand import DemandTracker
from modelyard.manager.eviction import EvictionPolicy
from modelyard.manager.records import ModelRecord

__all__ = ["LEARN_EVERY_S", "MAX_PENDING", "RequestEvents", "RunLearner"]

LEARN_EVERY_S = 0.005
"""How long the first event of a batch waits to be learnt: the batch then spans several
loop turns (at c=50 about 90 requests instead of 8), so each learner's fixed cost per
call is shared by more requests. Decisions that read what was learnt flush first, so
only the prefetch decision and the pre-warm timer can lag, by at most this."""

MAX_PENDING = 4096
"""Events buffered at most: past this the request that adds one flushes at once (a
turn of the event loop with this many requests is long already; memory stays bounded)."""

Event = tuple[ModelRecord, float, bool]
"""One request: the model version asked for, when (the manager's clock), and whether it
was cold (not ready, no reservation: its own load will need room)."""

RunLearner = Callable[[ModelRecord, Sequence[float], bool], None]
"""What learns a run of requests for one version: ``(record, times, cold)``."""


class RequestEvents:
    """The buffer of request events and its consumer (see the module's docstring)."""

    def __init__(
        self,
        *,
        demand: DemandTracker,
        policy: EvictionPolicy,
        after: RunLearner,
        hot_weight: Callable[[Hashable, Sequence[float]], list[float]] | None = None,
    ) -> None:
        self._demand = demand
        self._policy = policy
        self._after = after
        """The anticipation's: request log, prefetch hits, the prefetch decision."""
        self._hot_weight = hot_weight
        """The hot rule's weight of each request (None: 1 each)."""
        self._events: list[Event] = []
        self._timer: asyncio.TimerHandle | None = None
        """The flush the first pending event scheduled (None: nothing pending)."""
        self._closed = False
        """Closed: each request is learnt at once (none should come)."""
        self.batches = 0
        """Batches consumed (a reading for tests and benchmarks)."""
        self.learnt = 0
        """Events consumed."""

    @property
    def pending(self) -> int:
        """Events recorded and not learnt yet."""
        return len(self._events)

    def record(self, record: ModelRecord, now: float) -> None:
        """Record a request for ``record`` at ``now``; learnt at the end of this turn."""
        events = self._events
        # A ready model holds a reservation: the property is read only for cold ones.
        events.append((record, now, record.reserved_bytes == 0 and not record.is_ready))
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # no event loop (a synchronous caller): learn now
                loop = None
            if loop is None or self._closed:
                self.flush()
                return
            self._timer = loop.call_later(LEARN_EVERY_S, self.flush)
        elif len(events) >= MAX_PENDING:
            self.flush()

    def close(self) -> None:
        """Learn what is pending now and schedule nothing more (the manager's close, while
        its tasks are still open: a decision taken here is cancelled with them)."""
        self._closed = True
        self.flush()

    def flush(self) -> None:
        """Learn every recorded event now, in order (idempotent; re-entrant: a decision
        taken while a batch is learnt sees the events before its own, as it would have
        one request at a time)."""
        if self._timer is not None:
            self._timer.cancel()  # a decision flushed first: the timer has nothing left
            self._timer = None
        events = self._events
        if not events:
            return
        self._events = []
        self.batches += 1
        self.learnt += len(events)
        demand, policy, after, weigh = self._demand, self._policy, self._after, self._hot_weight
        n = len(events)
        start = 0
        while start < n:
            record = events[start][0]
            end = start + 1
            while end < n and events[end][0] is record:
                end += 1
            times = [e[1] for e in events[start:end]] if end - start > 1 else [events[start][1]]
            key = record.key
            demand.observe_run(key, times, weigh(key, times) if weigh else [1.0] * len(times))
            policy.on_requests(record, times)
            after(record, times, events[end - 1][2])
            start = end
