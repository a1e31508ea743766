"""The bounded per-model queue: priorities with aging, FIFO within a priority.

A request's *effective priority* is its priority improved by one level for every
``aging_s`` seconds it has waited, never better than 1 (the highest)::

    effective = max(1, priority - floor(waited_s / aging_s))

Requests leave in order of (effective priority, arrival), so a request of priority ``p``
waits at most about ``(p - 1) * aging_s`` before it ranks with the most urgent ones, and
then only behind those that arrived before it: starvation is bounded.

Requests of one priority sit in one FIFO; within it the oldest ages the most, so each
FIFO is already in effective order and the queue only merges the FIFO heads. The queue
does no I/O and never awaits; the scheduler owns the futures.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from itertools import chain

import numpy as np

from modelyard.scheduling.batcher import BatchKey
from modelyard.scheduling.breaker import Permit


class RequestState(Enum):
    """Where a request is on its way through the scheduler."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"


@dataclass(eq=False, slots=True)
class QueuedRequest:
    """One submitted request; compared by identity."""

    inputs: dict[str, np.ndarray]
    priority: int
    deadline: float
    """Absolute monotonic seconds."""
    arrival: float
    """Monotonic seconds when it was queued."""
    seq: int
    """Arrival order, the tie-break within an effective priority."""
    rows: int
    batch_key: BatchKey | None
    future: asyncio.Future[dict[str, np.ndarray]]
    permit: Permit
    state: RequestState = field(default=RequestState.QUEUED)
    outcome: str = "failed"
    """The ``stats()`` counter its error falls under when the scheduler fails it."""
    probe: bool = False
    """Admitted as a probe although its estimate said it was too late (see
    ``scheduler_core.PROBE_INTERVAL_S``): never refused at dispatch on that estimate."""


class RequestQueue:
    """Bounded priority queue of :class:`QueuedRequest` with aging."""

    def __init__(self, *, max_size: int, aging_s: float) -> None:
        self.max_size = max_size
        self.aging_s = aging_s
        self._levels: dict[int, deque[QueuedRequest]] = {}
        self.size = 0
        """Requests queued (``len()``, as an attribute: read on every request)."""
        self.rows = 0
        """Rows of every queued request together (an upper bound of any rows ahead)."""
        self.earliest_deadline = math.inf
        """At most the earliest deadline of any queued request (a lower bound: lowered by
        :meth:`push`, left as is when requests leave, reset when the queue empties; a walk
        over the queue may raise it to the true earliest with :meth:`note_earliest`)."""

    def __len__(self) -> int:
        return self.size

    @property
    def is_full(self) -> bool:
        """True when one more request would exceed ``max_size``."""
        return self.size >= self.max_size

    def effective_priority(self, request: QueuedRequest, now: float) -> int:
        """Its priority after aging by the time waited until ``now``."""
        aged = math.floor(max(0.0, now - request.arrival) / self.aging_s)
        return max(1, request.priority - aged)

    def push(self, request: QueuedRequest) -> None:
        """Append ``request`` to its priority's FIFO; the caller checked :attr:`is_full`."""
        self._levels.setdefault(request.priority, deque()).append(request)
        self.size += 1
        self.rows += request.rows
        if request.deadline < self.earliest_deadline:
            self.earliest_deadline = request.deadline

    def remove(self, request: QueuedRequest) -> bool:
        """Take ``request`` out wherever it is; False when it was not queued."""
        level = self._levels.get(request.priority)
        if level is None:
            return False
        try:
            level.remove(request)
        except ValueError:
            return False
        self.size -= 1
        self.rows -= request.rows
        if not level:
            del self._levels[request.priority]
            if not self.size:
                self.earliest_deadline = math.inf
        return True

    def take(self, requests: Iterable[QueuedRequest]) -> None:
        """Remove ``requests`` (chosen for a batch) from the queue."""
        levels = self._levels
        for request in requests:
            level = levels.get(request.priority)
            # A batch is usually the head of its FIFO: take it from there, without a
            # search or a call per request.
            if level and level[0] is request:
                level.popleft()
                self.size -= 1
                self.rows -= request.rows
                if not level:
                    del levels[request.priority]
                    if not self.size:
                        self.earliest_deadline = math.inf
            else:
                self.remove(request)

    def note_earliest(self, deadline: float) -> None:
        """Record ``deadline`` as the earliest of the queued requests' (the caller walked
        all of them); see :attr:`earliest_deadline`."""
        self.earliest_deadline = deadline

    def ordered(self, now: float) -> Iterator[QueuedRequest]:
        """Every queued request in dispatch order at ``now``; do not mutate while iterating."""
        levels = self._levels
        if len(levels) == 1:
            # One priority: aging moves every request alike, so the order is the FIFO's.
            (level,) = levels.values()
            return iter(level)

        def rank(request: QueuedRequest) -> tuple[int, int]:
            return (self.effective_priority(request, now), request.seq)

        return heapq.merge(*levels.values(), key=rank)

    def __iter__(self) -> Iterator[QueuedRequest]:
        # A C iterator: walks over the queue (after every batch, for estimates) resume
        # no Python generator per request.
        return chain.from_iterable(self._levels.values())

    def clear(self) -> list[QueuedRequest]:
        """Empty the queue; return what it held."""
        requests = list(self)
        self._levels.clear()
        self.size = 0
        self.rows = 0
        self.earliest_deadline = math.inf
        return requests
