"""WorkerLink: the server's end of one worker process, for ``ProcessInstance``.

It holds the worker's channel, shared region, handle and memory limit, sends a message
and waits for its reply within a deadline (killing a worker that overruns), and reacts
to what the worker does on its own: replies, protocol errors, a closed channel, its exit.
On an exit it fails the waiting request with ``WorkerCrashedError`` saying why, releases
the channel, region and limit, and fires the exit callback once.
:class:`~modelyard.workers.process.ProcessInstance` builds on it to start, serve and stop
the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from typing import Final

from modelyard.errors import (
    DeadlineExceededError,
    InternalError,
    ModelNotReadyError,
    ServerError,
    WorkerCrashedError,
)
from modelyard.workers.answers import AnswerGate
from modelyard.workers.channel import ChannelClosedError, LoopChannel, SharedRegion
from modelyard.workers.exits import describe_exit
from modelyard.workers.factory import WorkerFactory
from modelyard.workers.handle import WorkerHandle
from modelyard.workers.instance import ExitCallback, ReleaseCallback
from modelyard.workers.limits import MemoryLimit
from modelyard.workers.messages import InferDone, Message, MessageError, Released, Stop
from modelyard.workers.streams import GenerationStreams
from modelyard.workers.turns import Turns

__all__ = ["WorkerLink"]

# One logger name for the instance, whichever part of it logs.
_log = logging.getLogger("modelyard.workers.process")

_EXIT_WAIT_S: Final = 5.0
"""How long to wait for the exit report of a worker we SIGKILLed."""
_TIMER_SLACK_S: Final = 0.001
"""A deadline timer that fires this close to the deadline has reached it."""
_EOF_GRACE_S: Final = 1.0
"""A worker that closed its channel but is still running after this is killed."""
_RELEASE_RETRIES: Final = 50
_FIRST_CALL_S: Final = 0.05
"""A model's first request is sent this soon after READY (the one that waited for the
load: 7-13 ms on a busy 2-core VM); a later one is not waited for."""
_FIRST_ANSWER_S: Final = 1.0
"""The longest a footprint read waits for the first answer (``answers.py``)."""


class _Expired:
    """Result put on a reply future when its deadline passes."""


_EXPIRED: Final = _Expired()
_Reply = Message | _Expired


class WorkerLink:
    """The channel, process and limit of one worker, and its events; see the module docstring."""

    def __init__(
        self,
        factory: WorkerFactory,
        *,
        load_timeout_s: float = 300.0,
        overrun_grace_s: float = 0.0,
    ) -> None:
        self._factory = factory
        self._load_timeout_s = load_timeout_s
        self._overrun_grace_s = overrun_grace_s
        """How long a call may run on past its deadline (its caller already answered)
        before the worker is killed; 0: killed at the deadline."""
        self._grace_timer: asyncio.TimerHandle | None = None
        self._grace_seq = 0
        """The call ``_grace_timer`` watches."""
        self._grace_kill: asyncio.Task[None] | None = None
        self._turns = Turns()
        """Infer calls run one at a time, in order: one region, one exchange in flight."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channel: LoopChannel | None = None
        self._region: SharedRegion | None = None
        self._handle: WorkerHandle | None = None
        self._limit: MemoryLimit | None = None
        self._limit_bytes: int | None = None
        self._from_spare = False
        """True when the worker was a spare, claimed instead of started (``spares.py``)."""
        self._callback: ExitCallback | None = None
        self._seqs = itertools.count(1)
        self._in_flight: int | None = None
        self._waiter: asyncio.Future[_Reply] | None = None
        self._deadline = math.inf
        """The loop time by which the call in flight (``_waiter``) must be answered."""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        """When ``_timer`` fires: at or before ``_deadline`` while a call waits."""
        self._watchdog: asyncio.Task[None] | None = None
        self._name = ""
        self._started = False
        self.is_alive = False
        """True from a successful start until the worker dies or is stopped (an attribute,
        not a property: the manager reads it about three times per request)."""
        self._stopping = False
        self._kill_reason: str | None = None
        self._exit_reason: str | None = None
        self._callback_fired = False
        self._on_released: ReleaseCallback | None = None
        self._released: asyncio.Future[Released] | None = None
        """Set when the stopping worker says what closing its runtime freed."""
        self._answers = AnswerGate(factory.answers)
        """This worker's calls waiting for their first answer (counted in the factory's too)."""
        self._streams = GenerationStreams(self._send_now, lambda: next(self._seqs), self._answers)
        """Open generation streams (generative models), many at once beside the one
        request/reply exchange in flight."""

    # ------------------------------------------------------------------ properties

    @property
    def pid(self) -> int | None:
        """The worker's process id, once started."""
        return self._handle.pid if self._handle is not None else None

    @property
    def exit_reason(self) -> str | None:
        """Why the worker died, once it has."""
        return self._exit_reason

    def set_exit_callback(self, callback: ExitCallback) -> None:
        """Called once, with the reason, if the worker dies after a successful start."""
        self._callback = callback

    async def _after_first_answers(self) -> None:
        """Return once the calls sent within :data:`_FIRST_CALL_S` of now (a model's
        first request, right after READY) have had their first answer, or at most
        :data:`_FIRST_ANSWER_S` later: work that can wait (the footprint read) then does
        not run beside that request's prompt (``answers.py``)."""
        await asyncio.sleep(_FIRST_CALL_S)
        await self._answers.quiet(_FIRST_ANSWER_S)

    # ------------------------------------------------------------------ channel I/O

    def _send_now(self, msg: Message) -> None:
        """Send a stream's message (no reply awaited: its replies go to its stream)."""
        channel = self._channel
        if channel is None:
            raise self._not_serving()
        # If the worker is going, its exit report ends the stream with the reason.
        with contextlib.suppress(ChannelClosedError):
            channel.send(msg)

    async def _wait_reply(
        self, deadline: float, timeout_s: float, msg: Message | None = None, seq: int = 0
    ) -> Message:
        """The reply to the message in flight, or to ``msg`` (numbered ``seq``) sent here;
        kills the worker if it overruns.

        The deadline is watched by one timer per link, not one per call (a uvloop timer
        costs ~5 µs to start and cancel): it stays armed at the earliest deadline asked
        for, and when it fires it ends the call in flight if that call's deadline has
        come, else re-arms for it. Calls answered in time leave it alone.

        The waiter, its deadline and the answer count are set up *before* ``msg``
        is sent, so that the send is the last thing this loop does before it goes back
        to polling: a Unix socket wakes its reader as a "sync" wake-up, which the
        scheduler may place on the sender's core, where the worker then waits for the
        sender to sleep (BENCHMARKS.md §5, session 9).
        """
        loop = self._loop
        assert loop is not None
        if self._exit_reason is not None:
            raise self._crashed()
        channel = self._channel
        if msg is not None and channel is None:
            raise self._not_serving()
        fut: asyncio.Future[_Reply] = loop.create_future()
        self._waiter = fut
        self._deadline = deadline
        if deadline < self._timer_at:
            self._arm_timer(loop, deadline)
        # A call to a serving model (not its start): background work waits for its answer
        # (counted here and undone in the ``finally``: no object per call).
        answers = self._answers if self.is_alive else None
        if answers is not None:
            answers.add(1)
        try:
            if msg is not None:
                self._in_flight = seq
                # If the worker is going, its exit report fails the waiter with the reason.
                try:  # noqa: SIM105  (no context object on every request)
                    channel.send(msg)  # type: ignore[union-attr]  # checked above
                except ChannelClosedError:
                    pass
            reply = await fut
        finally:
            if answers is not None:
                answers.add(-1)
            if self._waiter is fut:
                self._waiter = None
        if reply is _EXPIRED:
            raise await self._overran(loop, timeout_s)
        return reply  # type: ignore[return-value]  # not _EXPIRED, checked above

    async def _overran(
        self, loop: asyncio.AbstractEventLoop, timeout_s: float
    ) -> DeadlineExceededError:
        """The error for a call whose deadline passed unanswered. Answered, not punished:
        with an overrun grace the call goes on and the worker is stopped only if it still
        runs after the grace; without one the worker is killed now."""
        running = self._in_flight
        if self._overrun_grace_s > 0 and running is not None and self.is_alive:
            self._watch_overrun(loop, running)
            return DeadlineExceededError(
                f"model {self._name!r} did not answer within {timeout_s:.3f}s, the "
                f"request's deadline; the call runs on for up to {self._overrun_grace_s:.1f}s "
                "before its worker is stopped"
            )
        await self._kill_and_wait(f"killed after overrunning its deadline ({timeout_s:.3f}s)")
        return DeadlineExceededError(
            f"model {self._name!r} did not answer within {timeout_s:.3f}s, the request's "
            "deadline; its worker was killed and is being restarted"
        )

    def _watch_overrun(self, loop: asyncio.AbstractEventLoop, seq: int) -> None:
        """Kill the worker if call ``seq`` is still running after the overrun grace."""
        if self._grace_timer is not None:
            if self._grace_seq == seq:
                return  # already watched (a later caller waited for it and expired too)
            self._grace_timer.cancel()  # that earlier call has ended: watch this one
        self._grace_seq = seq
        self._grace_timer = loop.call_later(self._overrun_grace_s, self._overrun_over, seq)

    def _overrun_over(self, seq: int) -> None:
        self._grace_timer = None
        loop, handle = self._loop, self._handle
        if self._in_flight != seq or loop is None or handle is None or handle.exited.done():
            return  # it ended within its grace
        reason = (
            "killed after overrunning its deadline by more than its "
            f"{self._overrun_grace_s:.1f}s grace"
        )
        self._grace_kill = loop.create_task(self._kill_and_wait(reason))

    def _arm_timer(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, math.inf
        if not math.isinf(when):
            self._timer = loop.call_at(when, self._on_timer)
            self._timer_at = when

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, math.inf
        waiter, loop = self._waiter, self._loop
        if waiter is None or waiter.done() or loop is None:
            return
        # A timer may fire up to a millisecond early (uvloop counts whole milliseconds).
        if loop.time() + _TIMER_SLACK_S < self._deadline:
            self._arm_timer(loop, self._deadline)  # armed for an earlier call's deadline
        else:
            waiter.set_result(_EXPIRED)

    # ---------------------------------------------------------------- worker events

    def set_release_callback(self, callback: ReleaseCallback) -> None:
        """Awaited by the next stop once the worker has closed its runtime (a generative
        worker sends :class:`Released` then), before the wait for its exit."""
        self._on_released = callback

    def _on_message(self, msg: Message) -> None:
        if type(msg) is InferDone:  # the common reply: never a stream's
            if msg.seq == self._in_flight:
                self._in_flight = None
                waiter = self._waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(msg)
            return
        if self._streams.owns(msg):
            return
        if isinstance(msg, Released):
            released = self._released
            if released is not None and not released.done():
                released.set_result(msg)
            return
        seq = getattr(msg, "seq", None)
        if seq is None or seq != self._in_flight:
            return  # stale reply of an abandoned request, or not for us
        self._in_flight = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(msg)

    def _on_channel_closed(self, why: str) -> None:
        # Normally the worker is exiting and its exit report follows at once. If it is
        # still running after a grace period, it is of no use any more.
        if self._loop is not None:
            self._loop.call_later(_EOF_GRACE_S, self._kill_lingering, why)

    def _on_protocol_error(self, exc: MessageError) -> None:
        # A worker that sends something other than a message cannot be trusted with the
        # next one: the request waiting on it fails now with a protocol error (a server
        # fault, not the model's), and the worker is killed and restarted.
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(
                InternalError(
                    f"the worker (pid {self.pid}) of model {self._name!r} broke the message "
                    f"protocol ({exc}); it is being restarted"
                )
            )
        handle = self._handle
        if handle is not None and not handle.exited.done() and not self._stopping:
            self._kill_reason = self._kill_reason or f"killed because it sent {exc}"
            handle.kill()

    def _kill_lingering(self, why: str) -> None:
        handle = self._handle
        if handle is not None and not handle.exited.done() and not self._stopping:
            self._kill_reason = self._kill_reason or f"killed because it {why}"
            handle.kill()

    def _on_exit(self, fut: asyncio.Future[int | None]) -> None:
        returncode = None if fut.cancelled() else fut.result()
        oom = self._limit.oom_killed() if self._limit is not None else False
        reason = self._kill_reason or describe_exit(
            returncode, oom_killed=oom, limit_bytes=self._limit_bytes
        )
        if self._stopping and self._kill_reason is None:
            reason = "stopped"
        self._exit_reason = reason
        was_ready, self.is_alive = self.is_alive, False
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(self._crashed())
        self._streams.fail_all(self._not_serving() if self._stopping else self._crashed())
        self._in_flight = None
        self._cleanup()
        if was_ready and not self._stopping:
            _log.warning(
                "worker %s of model %r %s; its requests failed",
                self.pid,
                self._name,
                reason,
            )
            self._fire_callback(reason)

    def _fire_callback(self, reason: str) -> None:
        if self._callback_fired or self._callback is None:
            return
        self._callback_fired = True
        try:
            self._callback(reason)
        except Exception:
            _log.exception("exit callback of model %r failed", self._name)

    # ---------------------------------------------------------------- kill, release

    async def _stop_and_wait(self, handle: WorkerHandle) -> None:
        """Send Stop and wait for the exit; a worker that reports :class:`Released` first
        has the release callback awaited then, while the kernel tears it down."""
        callback, self._on_released = self._on_released, None
        released = self._released = asyncio.get_running_loop().create_future()
        if self._channel is not None:
            with contextlib.suppress(ChannelClosedError):
                self._channel.send(Stop())
        # Gone, not yet reported: the fork server's report (and the cleanup of the limit)
        # follows through the exit callback.
        gone = asyncio.ensure_future(handle.wait_gone())
        try:
            if callback is not None:
                await asyncio.wait([released, gone], return_when=asyncio.FIRST_COMPLETED)
                if released.done() and not gone.done():
                    msg = released.result()
                    await callback(msg.anon_bytes, msg.unmapped)
            await gone
        finally:
            gone.cancel()

    async def _kill_and_wait(self, reason: str | None) -> None:
        handle = self._handle
        if handle is None or handle.exited.done():
            return
        if reason is not None and self._kill_reason is None:
            self._kill_reason = reason
        handle.kill()
        try:
            async with asyncio.timeout(_EXIT_WAIT_S):
                await asyncio.shield(handle.exited)
        except TimeoutError:
            _log.error("worker %d of model %r did not exit after SIGKILL", handle.pid, self._name)

    def _cleanup(self) -> None:
        """Release the channel, region and limit; idempotent, no awaits."""
        timer, self._grace_timer = self._grace_timer, None
        if timer is not None:
            timer.cancel()
        channel, self._channel = self._channel, None
        if channel is not None:
            channel.close()
        region, self._region = self._region, None
        if region is not None:
            region.close()
        if self._handle is not None and self._handle.exited.done():
            self._handle.close()
            limit, self._limit = self._limit, None
            if limit is not None:
                self._release_limit(limit, _RELEASE_RETRIES)
        timer, self._timer, self._timer_at = self._timer, None, math.inf
        if timer is not None:
            timer.cancel()
        watchdog = self._watchdog
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()

    def _release_limit(self, limit: MemoryLimit, retries: int) -> None:
        # One non-blocking attempt now; the kernel may need a moment after the exit, so
        # retry from the loop rather than sleeping on it.
        if limit.release(attempts=1):
            return
        if retries > 0 and self._loop is not None and not self._loop.is_closed():
            self._loop.call_later(0.02, self._release_limit, limit, retries - 1)
        else:
            _log.warning("memory limit of model %r could not be removed", self._name)

    # ---------------------------------------------------------------------- errors

    def _crashed(self) -> WorkerCrashedError:
        return WorkerCrashedError(
            f"the worker (pid {self.pid}) of model {self._name!r} died: {self._exit_reason}"
        )

    def _not_serving(self) -> ServerError:
        if self._exit_reason is not None and not self._stopping:
            return self._crashed()
        if self._stopping:
            return ModelNotReadyError(f"model {self._name!r}: this replica was stopped")
        return ModelNotReadyError("this replica has not been started")
