"""SparePool: idle worker processes started ahead, so that a load skips process start.

A spare is a worker like any other (forked by the fork server, or spawned), started
before any model needs it: its process exists, its channel and shared region are open,
its ``Hello`` waits unread in the channel, and with a cgroup backend it already sits in
its own group (:meth:`MemoryLimiter.place`; moving a pid into a group costs 5-13 ms),
and the runtimes the repository uses have started their process-wide state in it
(:class:`~modelyard.workers.messages.Warm`: ONNX Runtime's first session costs 6-10 ms
in a process, each later one 0.5-3 ms).
It has not loaded anything, so it belongs to no device yet: a worker enters its device
(core set, CUDA device) when its ``Load`` arrives, and any spare serves any device.

:class:`~modelyard.workers.process.ProcessInstance` claims one with :meth:`take`
(``None`` when the pool is empty: it starts a worker the usual way), writes the model's
limit into the spare's group, and calls :meth:`refill` once its start is over, so that
the next spare is made after the load, not while it competes for the CPU. A spare that
dies is replaced (after a back-off when spares keep dying young); :meth:`close` kills
and reaps them all. An idle spare's memory is its own pages only (a few MiB: everything
else is the fork server's, shared); it is not charged to any budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Final

from modelyard.workers.answers import AnswerGate
from modelyard.workers.channel import SharedRegion, socket_pair
from modelyard.workers.handle import WorkerHandle, WorkerStartError
from modelyard.workers.limits import MemoryLimit, MemoryLimiter, MemoryLimitError
from modelyard.workers.messages import Warm, encode

__all__ = ["Launch", "Spare", "SparePool"]

_log = logging.getLogger(__name__)

Launch = Callable[[socket.socket, SharedRegion], Awaitable[WorkerHandle]]
"""Starts a worker on (its end of the channel, the region): ``WorkerFactory.launch``."""

_YOUNG_S: Final = 1.0
"""A spare that dies younger than this makes the next one wait (a back-off)."""
_MAX_BACKOFF_S: Final = 30.0
_EXIT_WAIT_S: Final = 2.0
_RELEASE_ATTEMPTS: Final = 50
_REFILL_DELAY_S: Final = 0.1
"""A refill starts at least this long after the claiming load ends. Making a spare costs
10-25 ms of CPU at once (the fork, the new process's start, its move into its memory
group in a thread); at once it ran beside the load's answer and that model's first
request, and on a 2-core VM it held the identity model's switch ~6 ms past the server's
own total."""
_QUIET_WAIT_S: Final = 2.0
"""A refill (after its delay) and a new spare's :class:`Warm` wait until no call to a
worker waits for its first answer (``answers.py``), but no longer than this. A llama.cpp
warm-up (~30 ms of CPU) beside a model's first request doubled its time to first token
on a busy 2-core VM (32 -> 66 ms, BENCHMARKS.md §18), and that request's first token can
come 100+ ms after its load. The Warm goes as soon as that allows: sent 0.25 s after the
spare was ready, it often ran as the next request arrived and claimed that spare, whose
Load then waited for the warm-up. A spare claimed before its Warm loads cold."""


@dataclass(slots=True, eq=False)  # one spare is itself only (pool membership by identity)
class Spare:
    """One idle worker: its process, the server's end of its channel, its region, and
    its memory group (None where the backend places nothing ahead)."""

    handle: WorkerHandle
    channel: socket.socket
    region: SharedRegion
    limit: MemoryLimit | None
    born: float
    warm_sent: bool = False
    """Its :class:`Warm` has been sent (it warms, or has warmed, while it idles)."""

    def discard(self) -> None:
        """Close what the server holds of it (after its process has gone or been killed)."""
        self.channel.close()
        self.region.close()


class SparePool:
    """Keeps ``size`` spare workers ready; see the module docstring."""

    def __init__(
        self,
        size: int,
        launch: Launch,
        limiter: MemoryLimiter,
        warm: tuple[str, ...] = (),
        answers: AnswerGate | None = None,
    ) -> None:
        self.size = size
        self.warm = warm
        """Runtime kinds each new spare starts ahead while it idles (:class:`Warm`)."""
        self._launch = launch
        self._limiter = limiter
        self._answers = answers or AnswerGate()
        """The factory's calls waiting for a first answer: refills and Warms wait for none."""
        self._spares: list[Spare] = []
        self._wanted = asyncio.Event()
        self._filler: asyncio.Task[None] | None = None
        self._backoff_s = 0.0
        self._closed = False
        self._chores: set[asyncio.Task[None]] = set()
        self._warms: set[asyncio.Task[None]] = set()
        """Warms not sent yet (cancelled by close; the chores are awaited)."""
        self._refill: asyncio.Task[None] | None = None
        self.made = 0
        """Spares started since the pool started (claimed, died or idle)."""

    @property
    def pids(self) -> list[int]:
        """Process ids of the idle spares, oldest first."""
        return [s.handle.pid for s in self._spares]

    @property
    def warm_pids(self) -> list[int]:
        """Process ids of the idle spares that have been sent their :class:`Warm`."""
        return [s.handle.pid for s in self._spares if s.warm_sent]

    def start(self) -> None:
        """Start making spares in the background."""
        self._wanted.set()
        self._filler = asyncio.get_running_loop().create_task(self._fill(), name="spare-workers")

    def take(self) -> Spare | None:
        """An idle spare, no longer the pool's; None when there is none ready."""
        while self._spares:
            spare = self._spares.pop(0)
            if not spare.handle.exited.done():
                self._backoff_s = 0.0
                return spare
            self._forget(spare)
        return None

    def refill(self) -> None:
        """Make spares until the pool is full again, starting :data:`_REFILL_DELAY_S`
        from now and once no call waits for its first answer (call once a claimed
        spare's load is over, so that making the next one does not slow that load, or
        the answer and first request that follow it)."""
        if len(self._spares) >= self.size or self._closed:
            return
        if self._refill is None:  # else one is already due
            self._refill = asyncio.get_running_loop().create_task(self._refill_later())

    async def _refill_later(self) -> None:
        try:
            await asyncio.sleep(_REFILL_DELAY_S)
            await self._answers.quiet(_QUIET_WAIT_S)
        finally:
            self._refill = None
        self._wanted.set()

    async def close(self) -> None:
        """Stop making spares; kill, reap and forget the idle ones."""
        self._closed = True
        waits = [t for t in (self._refill, *self._warms) if t is not None]
        for task in waits:
            task.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
        filler, self._filler = self._filler, None
        if filler is not None:
            filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await filler
        spares, self._spares = self._spares, []
        for spare in spares:
            spare.handle.kill()
        if spares:
            await asyncio.wait([s.handle.exited for s in spares], timeout=_EXIT_WAIT_S)
        for spare in spares:
            self._forget(spare)
        if self._chores:
            await asyncio.gather(*self._chores, return_exceptions=True)

    # --------------------------------------------------------------------- internals

    async def _fill(self) -> None:
        while not self._closed:
            if len(self._spares) >= self.size:
                self._wanted.clear()
                await self._wanted.wait()
                continue
            if self._backoff_s:
                await asyncio.sleep(self._backoff_s)
            try:
                spare = await self._make()
            except (WorkerStartError, MemoryLimitError, OSError, TimeoutError) as exc:
                self._backoff_s = min(max(self._backoff_s * 2, 0.5), _MAX_BACKOFF_S)
                _log.warning("could not start a spare worker (%s); retrying", exc)
                continue
            if self._closed:  # close() ran while this one started
                spare.handle.kill()
                self._forget(spare)
                return
            self._spares.append(spare)
            if self.warm:
                self._own(self._warms, self._warm_later(spare))

    async def _warm_later(self, spare: Spare) -> None:
        await self._answers.quiet(_QUIET_WAIT_S)
        self._send_warm(spare)

    def _send_warm(self, spare: Spare) -> None:
        # Only to an idle spare: a claimed one is its instance's, its Load maybe sent.
        if self._closed or spare not in self._spares:
            return
        try:
            spare.channel.send(encode(Warm(self.warm)))
        except OSError:
            return  # it has died: _on_exit replaces it
        spare.warm_sent = True

    async def _make(self) -> Spare:
        region = SharedRegion.create()
        ours, theirs = socket_pair()
        try:
            handle = await self._launch(theirs, region)
        except BaseException:
            ours.close()
            region.close()
            raise
        finally:
            theirs.close()
        self.made += 1
        spare = Spare(handle, ours, region, None, time.monotonic())
        handle.exited.add_done_callback(lambda _: self._on_exit(spare))
        try:
            spare.limit = await asyncio.to_thread(self._limiter.place, handle.pid)
        except BaseException:
            handle.kill()
            self._forget(spare)
            raise
        return spare

    def _on_exit(self, spare: Spare) -> None:
        if spare not in self._spares:
            return  # claimed (its instance watches it now), or already forgotten
        self._spares.remove(spare)
        self._forget(spare)
        if self._closed:
            return
        young = time.monotonic() - spare.born < _YOUNG_S
        self._backoff_s = min(max(self._backoff_s * 2, 0.25), _MAX_BACKOFF_S) if young else 0.0
        _log.warning(
            "spare worker %d exited (code %s); starting another",
            spare.handle.pid,
            spare.handle.exited.result(),
        )
        self._wanted.set()

    def _forget(self, spare: Spare) -> None:
        """Close its channel and region; once its process has gone, its pidfd and group."""
        spare.discard()
        limit, spare.limit = spare.limit, None
        self._own(self._chores, self._reap(spare.handle, limit))

    @staticmethod
    def _own(tasks: set[asyncio.Task[None]], coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task held in ``tasks`` until it ends (close ends them)."""
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    @staticmethod
    async def _reap(handle: WorkerHandle, limit: MemoryLimit | None) -> None:
        try:
            async with asyncio.timeout(_EXIT_WAIT_S):
                await asyncio.shield(handle.exited)
        except TimeoutError:
            _log.error("spare worker %d did not exit after SIGKILL", handle.pid)
            return
        handle.close()
        if limit is not None and not await asyncio.to_thread(limit.release, _RELEASE_ATTEMPTS):
            _log.warning("the memory group of a spare worker could not be removed")
