"""Replica: one worker of a model version, with its scheduler(s) and its leases.

A version runs on one or more replicas. Its first is created with its
:class:`~modelyard.manager.records.ModelRecord` (``record.first``) and loaded, restarted
and unloaded by the loader; extra ones are started and stopped by the scaler
(``manager/replicas.py``). Each owns:

* its worker instance (``instance``, ``info``), set only by the lifecycle (loader, scaler);
* its schedulers: the tensor :class:`~modelyard.scheduling.scheduler.ModelScheduler`
  and, for a generative model, a
  :class:`~modelyard.scheduling.generation_scheduler.GenerationScheduler` sharing the
  tensor scheduler's circuit breaker (attached by the app once the worker is ready:
  ``attach``; detached when it stops: ``detach``);
* its leases: requests the router sent here that have not finished.

The small interface requests use: :meth:`lease` (the router pins the replica for one
request), :meth:`submit` (tensors), :meth:`stream` (a generation), and for the
lifecycle :meth:`drain` and :meth:`detach`. Nothing but the lifecycle writes ``state``,
``instance`` or the schedulers; others read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from modelyard.errors import InvalidInputError, ModelNotReadyError
from modelyard.manager.keys import ReplicaKey
from modelyard.manager.states import ModelState
from modelyard.protocol.generate import GenerateChunk, GenerateRequest
from modelyard.workers.instance import GenerativeInstance

if TYPE_CHECKING:
    import numpy as np

    from modelyard.scheduling.generation_scheduler import GenerationScheduler
    from modelyard.scheduling.scheduler import ModelScheduler
    from modelyard.workers.instance import InstanceInfo, ModelInstance

__all__ = ["Replica", "ReplicaKey", "ReplicaState", "first_replica_state"]


class ReplicaState(Enum):
    """Where a replica is in its life (the first replica's mirrors its record's state)."""

    STARTING = "starting"
    READY = "ready"
    DRAINING = "draining"
    """Stopping: scaled in, evicted, its worker died, or its model is unloading."""


def first_replica_state(state: ModelState) -> ReplicaState:
    """The first replica's state for its version's lifecycle ``state`` (the loader's)."""
    if state is ModelState.READY:
        return ReplicaState.READY
    if state in (ModelState.DRAINING, ModelState.UNLOADING):
        return ReplicaState.DRAINING
    return ReplicaState.STARTING


@dataclass(eq=False)
class Replica:
    """A worker of a version on one device, with its own scheduler(s) and leases."""

    key: ReplicaKey
    device: str
    state: ReplicaState = ReplicaState.STARTING
    instance: ModelInstance | None = None
    info: InstanceInfo | None = None
    scheduler: ModelScheduler | None = None
    """Its tensor scheduler (every replica has one once ready)."""
    generation: GenerationScheduler | None = None
    """Its generation scheduler (generative models only), sharing the tensor one's breaker."""
    reserved_bytes: int = 0
    measured_bytes: int | None = None
    in_flight: int = 0
    """Batches running on its instance now."""
    leases: int = 0
    """Requests routed to it that have not finished."""
    last_busy: float = 0.0
    """When it last had a request routed to it or outstanding (manager's clock)."""
    streams: int = 0
    """Generation streams routed to it since it started (the router's spread, observable)."""

    @property
    def is_ready(self) -> bool:
        """True when it can take requests now."""
        return (
            self.state is ReplicaState.READY
            and self.instance is not None
            and self.instance.is_alive
            and self.scheduler is not None
            and self.scheduler.is_accepting
        )

    @property
    def pending(self) -> int:
        """Requests queued, running or routed to it."""
        queued = self.scheduler.pending if self.scheduler is not None else 0
        if self.generation is not None:
            queued += self.generation.pending
        return max(queued, self.in_flight, self.leases)

    # ---------------------------------------------------------------- requests

    @contextmanager
    def lease(self, now: float) -> Iterator[Replica]:
        """Pin this replica for one request (the router's lease): eviction and scale-in
        wait for it; released on exit."""
        self.leases += 1
        self.last_busy = now
        try:
            yield self
        finally:
            self.leases -= 1

    async def submit(
        self, inputs: dict[str, np.ndarray], *, priority: int | None, deadline: float
    ) -> dict[str, np.ndarray]:
        """Run tensors through this replica's scheduler (see ``ModelScheduler.submit``)."""
        scheduler = self.scheduler
        if scheduler is None:
            raise ModelNotReadyError(f"replica {self.key} is not ready")
        return await scheduler.submit(inputs, priority=priority, deadline=deadline)

    def stream(
        self,
        request: GenerateRequest,
        *,
        priority: int | None,
        deadline: float,
        end: float | None,
    ) -> AsyncGenerator[GenerateChunk, None]:
        """Generate on this replica through its generation scheduler (admission, breaker,
        slots, deadlines: see ``GenerationScheduler.stream``). Closing the iterator early
        cancels the sequence in the worker."""
        generation = self.generation
        if generation is None:
            raise ModelNotReadyError(f"replica {self.key} does not generate text now")
        self.streams += 1
        return generation.stream(request, priority=priority, deadline=deadline, end=end)

    async def run_task(self, request: GenerateRequest, deadline: float) -> GenerateChunk:
        """``tokenize``/``detokenize`` on this replica's worker (no slot, no queue)."""
        generation = self.generation
        if generation is None:
            raise ModelNotReadyError(f"replica {self.key} does not generate text now")
        return await generation.run_task(request, deadline)

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """The worker's own stream for ``request`` (what the generation scheduler runs):
        always this replica's current instance, so a restarted worker is used."""
        instance = self.instance
        if instance is None or not instance.is_alive:
            raise ModelNotReadyError(f"replica {self.key} is not ready")
        if not isinstance(instance, GenerativeInstance):
            raise InvalidInputError(f"model {self.key.name!r} does not generate text")
        return instance.generate(request)

    # ---------------------------------------------------------------- lifecycle

    async def drain(self) -> None:
        """Refuse new requests; finish queued and running tensor requests, then wait for
        the batches on its instance (streams run on until the worker stops)."""
        if self.generation is not None:
            await self.generation.drain()
        if self.scheduler is not None:
            await self.scheduler.drain()
        while self.in_flight > 0:
            await asyncio.sleep(0.005)

    def detach(self) -> list[ModelScheduler | GenerationScheduler]:
        """Take its schedulers off (the worker stopped); the caller closes them."""
        parts: list[ModelScheduler | GenerationScheduler] = [
            s for s in (self.scheduler, self.generation) if s is not None
        ]
        self.scheduler = None
        self.generation = None
        return parts
