"""AnswerGate: how many calls to workers wait for their first answer, and a wait for none.

Some work the server does in the background costs 10-45 ms of CPU at once: starting a
spare worker (a fork, the new process's start, its move into a memory group), that
spare's runtime warm-up, reading a new worker's memory footprint (one ``smaps`` read of a
worker with ~1,100 mappings). On a machine with few cores, run beside a request that
waits for its first answer (a prompt evaluated before its first token, a batch), it
lengthens that wait: after a model switch on a 2-core VM the first token came 40-60 ms
later than a warm request's, with the footprint read and the refill beside it
(BENCHMARKS.md §18, session 7). So that work waits until no call does (:meth:`quiet`),
for a bounded time, so that steady traffic never puts it off for long.

Each worker instance has a gate for its own calls (its footprint is read once its first
request has had its first answer); their counts add up in one gate per worker factory
(a spare is made, and warmed, when no worker is being waited for).
"""

from __future__ import annotations

import asyncio

__all__ = ["AnswerGate", "Pending"]


class AnswerGate:
    """Counts the calls that wait for their first answer; see the module docstring."""

    def __init__(self, parent: AnswerGate | None = None) -> None:
        self._parent = parent
        """The factory's gate, which counts every instance's calls too."""
        self._waiting = 0
        self._quiet: asyncio.Event | None = None  # made by the first wait, on its loop

    @property
    def waiting(self) -> int:
        """Calls sent and not yet answered (their first chunk, for a stream)."""
        return self._waiting

    def begin(self) -> Pending:
        """A call has been sent; end the returned :class:`Pending` at its first answer
        (or when it fails, or is abandoned) in a ``finally``."""
        return Pending(self)

    async def quiet(self, timeout_s: float) -> bool:
        """Return once no call waits for its first answer (at once when none does), or
        after ``timeout_s``; True when it returned because none waits."""
        if self._waiting == 0:
            return True
        if self._quiet is None:
            self._quiet = asyncio.Event()
        try:
            async with asyncio.timeout(timeout_s):
                await self._quiet.wait()
        except TimeoutError:
            return False
        return True

    def add(self, n: int) -> None:
        """Count ``n`` more calls waiting (negative: fewer); for a caller that undoes its
        count in a ``finally`` and so needs no :class:`Pending`."""
        gate: AnswerGate | None = self
        while gate is not None:  # this gate, then its parent: no call per level
            gate._waiting += n
            quiet = gate._quiet
            if quiet is not None:
                if gate._waiting:
                    quiet.clear()
                else:
                    quiet.set()
            gate = gate._parent


class Pending:
    """One call waiting for its first answer; :meth:`end` is idempotent."""

    __slots__ = ("_gate",)

    def __init__(self, gate: AnswerGate) -> None:
        self._gate: AnswerGate | None = gate
        gate.add(1)

    def end(self) -> None:
        """The call has had its first answer (or never will)."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.add(-1)
