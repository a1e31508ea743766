"""Turns: one call at a time in a worker, in arrival order, without a lock's calls.

A worker has one shared region and one request/reply exchange in flight, so
``ProcessInstance.infer`` must run its calls one at a time. An ``asyncio.Lock`` does that
for four Python calls per request even when nobody waits (``locked``, ``acquire``,
``release``, ``_wake_up_first``). Here the caller tests and sets :attr:`Turns.busy`
itself when nothing waits (no call at all), and only a call that finds the worker busy
queues (:meth:`Turns.wait`). The turn is *handed over*: ``busy`` stays True from one
call to the next waiting one, so a call arriving in between queues behind it, as with the
lock (first come, first served).
"""

from __future__ import annotations

import asyncio
import collections

__all__ = ["Turns"]


class Turns:
    """Who runs next in one worker (``ProcessInstance.infer`` uses it).

    A call takes the turn by setting ``busy`` if it is False and nothing waits, else by
    awaiting :meth:`wait`; it gives the turn back with :meth:`pass_on` if a call waits,
    else by clearing ``busy``. Invariant: nothing waits while ``busy`` is False.
    """

    __slots__ = ("busy", "waiting")

    def __init__(self) -> None:
        self.busy = False
        """True while a call holds the worker (or has just been handed it)."""
        self.waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        """The calls waiting for their turn, in arrival order."""

    async def wait(self, deadline: float) -> None:
        """Return holding the turn; TimeoutError at ``deadline`` (a loop time), and
        CancelledError if cancelled, either way without holding it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        try:
            async with asyncio.timeout_at(deadline):
                await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                # Handed the turn just as the wait ended: the next call has it instead.
                self.pass_on()
            else:
                fut.cancel()
                if fut in self.waiting:
                    self.waiting.remove(fut)
            raise

    def pass_on(self) -> None:
        """Hand the turn to the first call still waiting, or free the worker."""
        waiting = self.waiting
        while waiting:
            fut = waiting.popleft()
            if not fut.done():  # a cancelled waiter's future is done: skipped
                fut.set_result(None)
                return  # busy stays True: the turn is that call's now
        self.busy = False
