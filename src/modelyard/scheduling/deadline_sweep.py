"""DeadlineSweep: one timer for the deadlines of every request a scheduler holds.

A queued request must be answered with ``DeadlineExceededError`` at its deadline, queued
or running. An ``asyncio.timeout`` per request does that with a loop timer started and
cancelled per request (~6 µs on uvloop, most of it the timer); under load that is paid
on every queued request, while almost all of them are answered long before their
deadline. The sweep keeps the deadlines in a heap and one timer armed at the earliest
one it has seen; when the timer fires it expires every entry whose time has come and
re-arms for the next entry still waiting. Entries of answered requests are cleared by
their submitter (no heap operation) and dropped when they reach the top, or in a
compaction once they outnumber the live ones, so the heap stays within about twice the
requests waiting.

Times are the event loop's (``loop.time()``), as ``asyncio.timeout``'s were: a deadline
on the scheduler's clock becomes ``loop.time() + (deadline - now)`` when the request is
queued.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections.abc import Callable
from typing import Any, Final, TypeAlias

from modelyard.scheduling.request_queue import QueuedRequest

__all__ = ["DeadlineSweep", "Entry"]

_SLACK_S: Final = 0.001
"""A timer that fires this close to an entry's time has reached it (uvloop counts whole
milliseconds, so a timer may fire up to one early)."""
_COMPACT_AT: Final = 64
"""Fewest entries before cleared ones are compacted away."""

Entry: TypeAlias = list[Any]
"""One watched request: ``[when, seq, request]``; the submitter sets ``entry[2] = None``
once the request is answered (lists compare by ``when``, then the unique ``seq``)."""


class DeadlineSweep:
    """The deadlines of one scheduler's requests, watched by one loop timer."""

    __slots__ = ("_compact_at", "_expire", "_heap", "_loop", "_timer", "_timer_at")

    def __init__(self, expire: Callable[[QueuedRequest], None]) -> None:
        self._expire = expire
        """Called with each request whose deadline came (answered or not: it checks)."""
        self._heap: list[Entry] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._compact_at = _COMPACT_AT

    def __len__(self) -> int:
        """Entries held, cleared ones included (bounded: see the module docstring)."""
        return len(self._heap)

    @property
    def is_armed(self) -> bool:
        """True while the timer is armed."""
        return self._timer is not None

    def watch(self, loop: asyncio.AbstractEventLoop, when: float, request: QueuedRequest) -> Entry:
        """Expire ``request`` at loop time ``when`` unless the returned entry is cleared
        first (``entry[2] = None``) by whoever answers it."""
        entry: Entry = [when, request.seq, request]
        heap = self._heap
        if len(heap) >= self._compact_at:
            self._compact()
        heapq.heappush(heap, entry)
        if when < self._timer_at:
            self._loop = loop
            self._arm(when)
        return entry

    def close(self) -> None:
        """Disarm the timer and forget every entry (the scheduler answers its requests)."""
        timer, self._timer, self._timer_at = self._timer, None, math.inf
        if timer is not None:
            timer.cancel()
        self._heap.clear()
        self._compact_at = _COMPACT_AT

    def _arm(self, when: float) -> None:
        loop = self._loop
        assert loop is not None
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self._fire)
        self._timer_at = when

    def _fire(self) -> None:
        self._timer, self._timer_at = None, math.inf
        loop = self._loop
        assert loop is not None
        heap = self._heap
        now = loop.time() + _SLACK_S
        pop = heapq.heappop
        while heap and heap[0][0] <= now:
            request = pop(heap)[2]
            if request is not None:
                self._expire(request)
        while heap and heap[0][2] is None:
            pop(heap)
        if heap:
            self._arm(heap[0][0])

    def _compact(self) -> None:
        heap = self._heap
        heap[:] = [entry for entry in heap if entry[2] is not None]
        heapq.heapify(heap)
        # Twice the live entries before the next compaction: amortised O(1) per request.
        self._compact_at = max(_COMPACT_AT, 2 * len(heap))
