"""Admission of generation requests to one model: ``parallel`` at a time, the rest queued.

A generative model runs up to ``parallel`` sequences together (llama.cpp's continuous
batching); a request beyond that waits here, by priority (1 first) then arrival, at most
``max_queue_size`` of them (beyond: OverloadedError, HTTP 429), each until its own
deadline (DeadlineExceededError). A slot is held for the whole stream and handed to the
next waiter when the stream ends, however it ends.

Preemption (``preempt=True``), as vLLM's scheduler does it: a request that finds every
slot held asks the least important holder (the largest priority number, the latest
arrival among equals) to give its slot up when that holder's priority number is larger
than its own. The holder sees :attr:`Ticket.preempt_requested` between two chunks,
stops its sequence in the worker and calls :meth:`GenerationGate.pause`: its slot goes
to the best waiter and it waits again with its original place in line (priority, then
arrival), so it resumes before anything that arrived after it at its priority. The
caller resumes the sequence from the tokens it already has (recompute, vLLM's default
preemption mode). One arrival asks for at most one preemption, and a stream preempted
:data:`MAX_PREEMPTIONS` times is not chosen again: each resume recomputes its tokens, and
a flood of important requests must not make a long stream pay that without bound.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from modelyard.clock import Clock
from modelyard.errors import DeadlineExceededError, OverloadedError

MAX_PREEMPTIONS = 3
"""How many times one stream may give its slot up (see the module doc)."""


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's place at the gate: its priority, arrival, and preemption flag."""

    priority: int
    order: int
    preempt_requested: bool = False
    """Set when a more important arrival wants this holder's slot (see the module doc)."""
    preemptions: int = 0
    """Times this request gave its slot up."""
    holding: bool = field(default=False, repr=False)
    """Whether the ticket holds a slot now (not while paused)."""


class GenerationGate:
    """Slots and a bounded priority queue for one generative model."""

    def __init__(
        self, name: str, slots: int, max_queue_size: int, clock: Clock, *, preempt: bool = False
    ) -> None:
        self.name = name
        self.slots = max(1, slots)
        self.max_queue_size = max_queue_size
        self.preempt = preempt
        """Whether a more important arrival may take a running request's slot."""
        self._clock = clock
        self._busy = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._holders: set[Ticket] = set()
        self.preemptions = 0
        """Slots given up to more important requests since the gate was made."""

    @property
    def running(self) -> int:
        """Streams holding a slot."""
        return self._busy

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return sum(1 for _, _, f in self._waiters if not f.done())

    @asynccontextmanager
    async def slot(self, priority: int, deadline: float | None) -> AsyncIterator[Ticket]:
        """Hold a slot for the body; wait for one by ``priority`` until ``deadline``."""
        ticket = Ticket(priority, next(self._order))
        if self._busy < self.slots and not self.queued:
            self._busy += 1
        else:
            if self.queued >= self.max_queue_size:
                raise OverloadedError(
                    f"model {self.name!r} has {self.queued} generation requests queued, its "
                    f"max_queue_size; {self._busy} are generating"
                )
            self._ask_preemption(priority)
            await self._wait(ticket, deadline)
        ticket.holding = True
        self._holders.add(ticket)
        try:
            yield ticket
        finally:
            self._holders.discard(ticket)
            if ticket.holding:
                ticket.holding = False
                self._release()

    async def pause(self, ticket: Ticket, deadline: float | None) -> None:
        """Give the slot ``ticket`` holds to the best waiter; wait for it back in the
        ticket's original place in line (DeadlineExceededError at ``deadline``)."""
        self._holders.discard(ticket)
        ticket.preempt_requested = False
        ticket.preemptions += 1
        self.preemptions += 1
        fut = self._enqueue(ticket)
        ticket.holding = False
        self._release()  # to the best waiter: this ticket itself if none is better
        await self._await_grant(fut, deadline)
        ticket.holding = True
        self._holders.add(ticket)

    def _ask_preemption(self, priority: int) -> None:
        if not self.preempt:
            return
        candidates = [
            t
            for t in self._holders
            if t.priority > priority and not t.preempt_requested and t.preemptions < MAX_PREEMPTIONS
        ]
        if candidates:
            victim = max(candidates, key=lambda t: (t.priority, t.order))
            victim.preempt_requested = True

    def _enqueue(self, ticket: Ticket) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (ticket.priority, ticket.order, fut))
        return fut

    async def _wait(self, ticket: Ticket, deadline: float | None) -> None:
        await self._await_grant(self._enqueue(ticket), deadline)

    async def _await_grant(self, fut: asyncio.Future[None], deadline: float | None) -> None:
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
