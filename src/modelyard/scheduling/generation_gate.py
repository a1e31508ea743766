"""Admission of generation requests to one model: ``parallel`` at a time, the rest queued.

A generative model runs up to ``parallel`` sequences together (llama.cpp's continuous
batching); a request beyond that waits here, by priority (1 first) then arrival, at most
``max_queue_size`` of them (beyond: OverloadedError, HTTP 429), each until its own
deadline (DeadlineExceededError). A slot is held for the whole stream and handed to the
next waiter when the stream ends, however it ends.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from modelyard.clock import Clock
from modelyard.errors import DeadlineExceededError, OverloadedError


class GenerationGate:
    """Slots and a bounded priority queue for one generative model."""

    def __init__(self, name: str, slots: int, max_queue_size: int, clock: Clock) -> None:
        self.name = name
        self.slots = max(1, slots)
        self.max_queue_size = max_queue_size
        self._clock = clock
        self._busy = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    @property
    def running(self) -> int:
        """Streams holding a slot."""
        return self._busy

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return sum(1 for _, _, f in self._waiters if not f.done())

    @asynccontextmanager
    async def slot(self, priority: int, deadline: float | None) -> AsyncIterator[None]:
        """Hold a slot for the body; wait for one by ``priority`` until ``deadline``."""
        if self._busy < self.slots and not self.queued:
            self._busy += 1
        else:
            await self._wait(priority, deadline)
        try:
            yield
        finally:
            self._release()

    async def _wait(self, priority: int, deadline: float | None) -> None:
        if self.queued >= self.max_queue_size:
            raise OverloadedError(
                f"model {self.name!r} has {self.queued} generation requests queued, its "
                f"max_queue_size; {self._busy} are generating"
            )
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (priority, next(self._order), fut))
        timeout = None if deadline is None else max(0.0, deadline - self._clock.monotonic())
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(fut)
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                self._release()  # granted just as the deadline passed: pass it on
            fut.cancel()
            raise DeadlineExceededError(
                f"model {self.name!r}: the deadline passed while waiting for one of its "
                f"{self.slots} generation slots"
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self._release()
            fut.cancel()
            raise

    def _release(self) -> None:
        while self._waiters:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                fut.set_result(None)  # the slot passes to it; _busy is unchanged
                return
        self._busy -= 1
