"""GenerationScheduler: the scheduler of one replica of a generative model.

A generation scheduler is a kind of scheduler: it admits a request with the tensor
scheduler's rules (:class:`~modelyard.scheduling.scheduler.ModelScheduler`), then holds
one of the replica's ``parallel`` sequence slots for the whole stream instead of forming
batches (llama.cpp batches the running sequences itself, continuously, in the worker).

Admission, in the tensor scheduler's order and with its typed errors:

* lifecycle: ``ModelNotReadyError`` before :meth:`start`, while draining and once closed;
* priority: 1 is the highest (``InvalidInputError`` below 1; None: the default);
* deadline: one already passed is ``DeadlineExceededError``, never queued;
* circuit breaker: the replica's one :class:`~modelyard.scheduling.breaker.CircuitBreaker`,
  shared with its tensor scheduler, so a model that fails its streams opens the same
  breaker its tensor requests see (``CircuitOpenError``);
* queue limit: ``max_queue_size`` streams wait for a slot (``OverloadedError`` beyond), by
  priority then arrival, each until its deadline (``DeadlineExceededError``, not run);
  see :class:`~modelyard.scheduling.generation_gate.GenerationGate`, which keeps the
  slots, the queue and preemption.

Deadlines: the first chunk must come by the request's deadline, the rest by ``end`` (the
client's own limit, None: none). Brownout (:mod:`~modelyard.scheduling.brownout`) is
decided on arrival from the slots and queue the request finds.

What feeds the breaker, as for tensors: a worker that died, an internal error or a
running deadline is the model's fault; a stream that reached its finish is a success;
a refusal, a client that left, a deadline passed while queued, or a bad prompt the worker
refused says nothing about the model and hands its permit back.

The worker's stream is closed whenever the scheduler's stream is (the client went away,
a deadline passed): that cancels the sequence in the worker.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, replace

from modelyard.clock import Clock
from modelyard.errors import (
    CircuitOpenError,
    DeadlineExceededError,
    InternalError,
    InvalidInputError,
    ModelNotReadyError,
    OverloadedError,
    ServerError,
)
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.scheduling.breaker import CircuitBreaker, Permit
from modelyard.scheduling.brownout import brownout_cap
from modelyard.scheduling.dispatcher import MODEL_FAULTS
from modelyard.scheduling.generation_gate import GenerationGate, Ticket
from modelyard.scheduling.scheduler_core import COUNTERS, Lifecycle

Generate = Callable[[GenerateRequest], AsyncIterator[GenerateChunk]]
"""The replica's worker stream for one request (``GenerativeInstance.generate``)."""


@dataclass(frozen=True, slots=True)
class GenerationLimits:
    """What a generation scheduler needs from the model's config."""

    slots: int
    """Sequences generated together (the model's ``generation.parallel``)."""
    max_queue_size: int
    default_priority: int = 3
    preempt: bool = False
    brownout_max_tokens: int | None = None
    brownout_queue_depth: int = 1


class GenerationScheduler:
    """Admission, slots, deadlines and breaker for the streams of one replica."""

    def __init__(
        self,
        name: str,
        limits: GenerationLimits,
        generate: Generate,
        *,
        breaker: CircuitBreaker,
        clock: Clock,
        on_preempted: Callable[[], None] | None = None,
        on_brownout: Callable[[], None] | None = None,
    ) -> None:
        self.name = name
        self.limits = limits
        self._generate = generate
        self._breaker = breaker
        self._clock = clock
        self.gate = GenerationGate(
            name, limits.slots, limits.max_queue_size, clock, preempt=limits.preempt
        )
        """The slots and the priority queue (read-only for others: running, queued)."""
        self.on_preempted = on_preempted
        """Called each time a stream gives its slot up to a more important one."""
        self.on_brownout = on_brownout
        """Called when a stream capped by brownout is admitted to a slot."""
        self._state = Lifecycle.NEW
        self._streams = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._counts: Counter[str] = Counter(dict.fromkeys(COUNTERS, 0))

    # ---------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Admit streams from now on. Idempotent."""
        if self._state is Lifecycle.NEW:
            self._state = Lifecycle.RUNNING

    async def drain(self) -> None:
        """Refuse new streams (``ModelNotReadyError``). Open streams run on: a stream
        has no bound on its length but the client's, so an unload does not wait for it;
        it ends with the worker (WorkerCrashedError) as it always did."""
        if self._state in (Lifecycle.NEW, Lifecycle.RUNNING):
            self._state = Lifecycle.DRAINING

    async def close(self) -> None:
        """Refuse new streams for good (open ones end with their worker)."""
        self._state = Lifecycle.CLOSED

    async def wait_idle(self) -> None:
        """Return once no stream is queued or running."""
        await self._idle.wait()

    # ---------------------------------------------------------------- inspection

    @property
    def is_accepting(self) -> bool:
        """True while streams are admitted (started, not draining or closed)."""
        return self._state is Lifecycle.RUNNING

    @property
    def pending(self) -> int:
        """Streams queued or running."""
        return self._streams

    @property
    def running(self) -> int:
        """Streams holding a slot."""
        return self.gate.running

    @property
    def queued(self) -> int:
        """Streams waiting for a slot."""
        return self.gate.queued

    @property
    def slots(self) -> int:
        """Sequences generated together."""
        return self.gate.slots

    @property
    def preemptions(self) -> int:
        """Slots given up to more important streams since the scheduler was made."""
        return self.gate.preemptions

    @property
    def breaker(self) -> CircuitBreaker:
        """The replica's circuit breaker (shared with its tensor scheduler)."""
        return self._breaker

    @property
    def counters(self) -> dict[str, int]:
        """Admission and outcome counters, named as the tensor scheduler's; a copy."""
        return {key: self._counts[key] for key in COUNTERS}

    def stats(self) -> dict[str, object]:
        """The ``/v2/stats`` reading of this replica's streams: lifecycle, slots, streams
        running and queued, preemptions, the shared breaker's state, and the counters
        (named as the tensor scheduler's, flattened in)."""
        out: dict[str, object] = {
            "state": self._state.value,
            "slots": self.slots,
            "running_streams": self.running,
            "queued_streams": self.queued,
            "max_queue_size": self.limits.max_queue_size,
            "preemptions": self.preemptions,
            "breaker_state": self._breaker.state.value,
        }
        out.update(self.counters)
        return out

    # ---------------------------------------------------------------- requests

    def stream(
        self,
        request: GenerateRequest,
        *,
        priority: int | None,
        deadline: float,
        end: float | None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The chunks of ``request``, admitted as the module doc says; the last carries
        ``finish_reason``. ``deadline`` (absolute, on the scheduler's clock) bounds the
        wait for a slot and the first chunk; ``end`` (None: none) the whole stream.
        Admission errors are raised before the first chunk, by the first ``anext``."""
        return self._stream(request, priority, deadline, end)

    async def run_task(self, request: GenerateRequest, deadline: float) -> GenerateChunk:
        """A ``tokenize``/``detokenize`` request: answered by the worker at once, in one
        chunk, without a sequence slot or the queue (refused unless accepting)."""
        self._check_accepting()
        stream = self._generate(request)
        try:
            return await self._next_chunk(stream, deadline, first=True)
        finally:
            await _aclose(stream)

    async def _stream(
        self, request: GenerateRequest, priority: int | None, deadline: float, end: float | None
    ) -> AsyncGenerator[GenerateChunk, None]:
        level = self._admit_level(priority, deadline)
        permit = self._admit_permit()
        capped = self._brownout(request)
        if capped is not None:
            request = replace(request, sampling=replace(request.sampling, max_tokens=capped))
        self._opened()
        outcome = _Outcome(permit)
        try:
            async with self.gate.slot(level, deadline) as ticket:
                self._counts["accepted"] += 1
                outcome.admitted = True
                if capped is not None and self.on_brownout is not None:
                    self.on_brownout()
                chunks = self._resumable(request, ticket, deadline, end, outcome)
                try:
                    async for chunk in chunks:
                        yield (
                            chunk if capped is None else replace(chunk, max_tokens_capped_to=capped)
                        )
                finally:
                    await chunks.aclose()
        except BaseException as exc:
            self._settle(outcome, exc)
            raise
        else:
            self._settle(outcome, None)
        finally:
            self._closed()

    async def _resumable(
        self,
        request: GenerateRequest,
        ticket: Ticket,
        deadline: float,
        end: float | None,
        outcome: _Outcome,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """The worker's chunks across preemptions: when a more important stream wants
        the slot (``ticket.preempt_requested``, seen between two chunks), the sequence
        stops in the worker, the slot is given up until it comes back, and the sequence
        resumes from the tokens already sent."""
        sent: list[int] = []
        while True:
            again = replace(request, resume_token_ids=tuple(sent)) if sent else request
            outcome.running = True
            stream = self._generate(again)
            try:
                while not ticket.preempt_requested:
                    limit = deadline if not outcome.first else end
                    chunk = await self._next_chunk(stream, limit, first=not outcome.first)
                    outcome.first = True
                    sent += chunk.token_ids
                    if chunk.finish_reason is not None:
                        outcome.finished = True
                    yield chunk
                    if chunk.finish_reason is not None:
                        return
            finally:
                await _aclose(stream)  # early: cancels generation in the worker
            outcome.running = False  # preempted: waiting for its slot again
            if self.on_preempted is not None:
                self.on_preempted()
            await self.gate.pause(ticket, end if outcome.first else deadline)

    async def _next_chunk(
        self, stream: AsyncIterator[GenerateChunk], deadline: float | None, *, first: bool
    ) -> GenerateChunk:
        timeout = None if deadline is None else max(0.0, deadline - self._clock.monotonic())
        try:
            async with asyncio.timeout(timeout):
                return await anext(stream)
        except TimeoutError:
            what = "its first token" if first else "the end of its stream"
            raise DeadlineExceededError(
                f"model {self.name!r} did not produce {what} by the request's deadline"
            ) from None
        except StopAsyncIteration:
            raise InternalError(f"model {self.name!r} ended a stream without a finish") from None

    # ---------------------------------------------------------------- admission

    def _check_accepting(self) -> None:
        if self._state is not Lifecycle.RUNNING:
            self._counts["rejected_not_ready"] += 1
            raise ModelNotReadyError(
                f"model {self.name!r} is not accepting requests ({self._state.value})"
            )

    def _admit_level(self, priority: int | None, deadline: float) -> int:
        self._check_accepting()
        level = self.limits.default_priority if priority is None else priority
        if level < 1:
            raise InvalidInputError(f"priority must be 1 (highest) or more, got {level}")
        if deadline <= self._clock.monotonic():
            self._counts["rejected_expired"] += 1
            raise DeadlineExceededError(
                f"model {self.name!r}: the deadline passed before the request was queued"
            )
        return level

    def _admit_permit(self) -> Permit:
        permit = self._breaker.admit()
        if permit is None:
            self._counts["rejected_circuit"] += 1
            retry_after_s = self._breaker.retry_after_s()
            raise CircuitOpenError(
                f"model {self.name!r}: circuit breaker is open after failures; "
                f"retry in {retry_after_s:.1f} s",
                retry_after_s=retry_after_s,
            )
        return permit

    def _brownout(self, request: GenerateRequest) -> int | None:
        # Decided on arrival, before the request joins the queue: the state it finds.
        limits = self.limits
        return brownout_cap(
            request.sampling.max_tokens,
            limits.brownout_max_tokens,
            running=self.gate.running,
            slots=self.gate.slots,
            queued=self.gate.queued,
            queue_depth=limits.brownout_queue_depth,
        )

    # ---------------------------------------------------------------- outcomes

    def _settle(self, outcome: _Outcome, exc: BaseException | None) -> None:
        """Feed the breaker and the counters with how one stream ended."""
        if outcome.finished:
            self._breaker.record_one(failed=False, permit=outcome.permit)
            self._counts["succeeded"] += 1
            return
        fault = isinstance(exc, MODEL_FAULTS) and (
            outcome.running or not isinstance(exc, DeadlineExceededError)
        )
        if fault:
            self._breaker.record_one(failed=True, permit=outcome.permit)
        else:
            self._breaker.release((outcome.permit,))
        if not outcome.admitted:
            if isinstance(exc, OverloadedError):  # the queue was full: never queued
                self._counts["rejected_overloaded"] += 1
                return
            self._counts["accepted"] += 1  # it was queued, and left or expired there
        self._counts[_outcome_counter(exc, outcome)] += 1

    def _opened(self) -> None:
        self._streams += 1
        self._idle.clear()

    def _closed(self) -> None:
        self._streams -= 1
        if not self._streams:
            self._idle.set()


@dataclass(slots=True)
class _Outcome:
    """What became of one stream so far (for the breaker and the counters)."""

    permit: Permit
    admitted: bool = False
    """It got a slot."""
    running: bool = False
    """Its sequence is in the worker now."""
    first: bool = False
    """Its first chunk came."""
    finished: bool = False
    """Its last chunk (with ``finish_reason``) came."""


def _outcome_counter(exc: BaseException | None, outcome: _Outcome) -> str:
    if isinstance(exc, DeadlineExceededError):
        return "expired_running" if outcome.running else "expired_queued"
    if isinstance(exc, ServerError):
        return "failed"
    return "cancelled"  # the client went away (the stream was closed) or a task was cancelled


async def _aclose(stream: AsyncIterator[GenerateChunk]) -> None:
    close = getattr(stream, "aclose", None)
    if close is not None:
        await close()


class GenerationLoad:
    """The streams of one generative version over all its replicas, read live."""

    def __init__(self, schedulers: Callable[[], list[GenerationScheduler]]) -> None:
        self._schedulers = schedulers

    @property
    def running(self) -> int:
        """Streams holding a sequence slot now, on every replica."""
        return sum(s.running for s in self._schedulers())

    @property
    def queued(self) -> int:
        """Streams waiting for a slot, on every replica."""
        return sum(s.queued for s in self._schedulers())

    @property
    def slots(self) -> int:
        """Sequence slots of the replicas ready now."""
        return sum(s.slots for s in self._schedulers())

    @property
    def preemptions(self) -> int:
        """Slots given up to more important streams, on the replicas there now."""
        return sum(s.preemptions for s in self._schedulers())
