"""The router: from a request's model name, version or alias to a ready version to run on.

Front ends validate and count; the router decides where a request goes. It resolves
the name (a version, an alias with its weighted split, or the default) to a record,
takes a lease on it (eviction prefers versions nobody is waiting for, and drains
the ones they are), makes sure it is READY (hot-loading it within the caller's
deadline), and re-routes a request whose version was evicted or restarted between
routing and queueing: it never ran, so a retry is safe.

A version may have several replicas (its first, the record itself, and extra ones
started by scale-out, each with its own worker and scheduler, maybe on another device).
A request goes to the ready replica with the fewer requests outstanding of two picked
at random (power of two choices: near the least-loaded choice without a scan, and
without herding every request to the same one); a tie goes to the older replica, so
spare replicas go idle, and are scaled in, once the load drops. The lease pins that
replica until the request is done.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass

import numpy as np

from modelyard.clock import Clock
from modelyard.errors import ModelNotReadyError
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord, Replica
from modelyard.protocol.types import check_client_timeout
from modelyard.runtimes.base import TensorSpec
from modelyard.scheduling.scheduler import ModelScheduler
from modelyard.workers.instance import InstanceInfo

__all__ = ["ROUTE_ATTEMPTS", "Route", "Router", "check_client_timeout"]

ROUTE_ATTEMPTS = 3
"""How often one request is routed again after its version left between routing and queueing."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where to submit one request: a ready version, its scheduler and the deadline."""

    record: ModelRecord
    replica: Replica | None
    """The extra replica it runs on (None: the version's first replica)."""
    info: InstanceInfo
    """The loaded instance's tensors (what the request is validated against)."""
    scheduler: ModelScheduler
    deadline: float
    """On the router's clock: the model's ``timeout_s`` from the request's start,
    extended by the time spent waiting for a load, never past the client's deadline."""

    @property
    def target(self) -> Replica:
        """The replica the request runs on (the leased one; the version's first when
        ``replica`` is None)."""
        return self.record.first if self.replica is None else self.replica


class Router:
    """Resolves requests to versions, leases them and waits until they are ready."""

    def __init__(
        self,
        manager: ModelManager,
        clock: Clock | None = None,
        on_load_wait: Callable[[ModelRecord, float], None] | None = None,
    ) -> None:
        self.manager = manager
        self._registry = manager.registry
        self._clock = clock or manager.clock
        self.on_load_wait = on_load_wait
        """Called with the seconds a request waited for its model to load (metrics)."""
        self._rng = random.Random()

    def pick(self, record: ModelRecord) -> Replica | None:
        """The replica of ``record`` a request goes to: of two ready ones picked at random,
        the one with fewer requests outstanding (a tie: the older). None: the first
        replica (the record itself), also when no extra replica is ready."""
        ready: list[Replica | None] = [r for r in record.replicas if r.is_ready]
        if not ready:
            return None
        if record.is_ready and record.scheduler is not None and record.scheduler.is_accepting:
            ready.insert(0, None)
        if len(ready) == 1:
            return ready[0]
        i, j = sorted(self._rng.sample(range(len(ready)), 2))
        a, b = ready[i], ready[j]
        load_a = record.pending_on_self if a is None else a.pending
        load_b = record.pending_on_self if b is None else b.pending
        return b if load_b < load_a else a

    def resolve(self, name: str, version: str | None) -> ModelRecord:
        """The record serving ``name`` at ``version`` (a version, an alias, or the default):
        every request's first step, whatever its kind. ModelNotFoundError otherwise."""
        return self._registry.resolve(name, version)

    def route_request(
        self, record: ModelRecord, started: float, client_timeout_s: float | None
    ) -> AbstractAsyncContextManager[Route]:
        """:meth:`route` for a request: the model's ``timeout_s``, capped by the client's."""
        return self.route(
            record,
            started=started,
            timeout_s=record.config.timeout_s,
            client_timeout_s=client_timeout_s,
        )

    async def submit(
        self,
        record: ModelRecord,
        prepare: Callable[[list[TensorSpec]], dict[str, np.ndarray]],
        priority: int | None,
        started: float,
        client_timeout_s: float | None,
    ) -> tuple[InstanceInfo, dict[str, np.ndarray]]:
        """Run one request on ``record``: route it (:meth:`route_request`), turn it into
        the inputs of the instance it reached (``prepare``: checked against that
        instance's input tensors) and submit them to that replica's scheduler within the
        request's deadline; the instance's metadata and the outputs.

        The one way an inference request reaches a scheduler. A version ready and
        accepting now is leased without the context manager (most requests: no
        generator, no :class:`Route`), with the same touch and lease as :meth:`route`.
        """
        timeout_s = record.config.timeout_s
        if client_timeout_s is not None and client_timeout_s < timeout_s:
            timeout_s = client_timeout_s
        replica = self.pick(record) if record.replicas else None
        # The replica itself, not the record's forwarding properties (a call each).
        holder = record.first if replica is None else replica
        info = holder.info
        scheduler = holder.scheduler
        if (
            info is not None
            and scheduler is not None
            and scheduler.is_accepting
            and (replica is not None or record.is_ready)
        ):
            self.manager.touch(record)
            record.leases += 1
            self._lease(record, replica)
            try:  # holder.submit, inlined: the scheduler is in hand already
                outputs = await scheduler.submit(
                    prepare(info.inputs), priority=priority, deadline=started + timeout_s
                )
            finally:
                self._release(record, replica)
                record.leases -= 1
            return info, outputs
        async with self.route_request(record, started, client_timeout_s) as route:
            info = route.info
            outputs = await route.target.submit(
                prepare(info.inputs), priority=priority, deadline=route.deadline
            )
        return info, outputs

    def _lease(self, record: ModelRecord, replica: Replica | None) -> None:
        """Pin the replica a request runs on until :meth:`_release` (None: the first)."""
        if replica is None:
            record.first.leases += 1
        else:
            replica.leases += 1
            replica.last_busy = self._clock.monotonic()

    @staticmethod
    def _release(record: ModelRecord, replica: Replica | None) -> None:
        (record.first if replica is None else replica).leases -= 1

    @asynccontextmanager
    async def route(
        self,
        record: ModelRecord,
        *,
        started: float,
        timeout_s: float,
        client_timeout_s: float | None = None,
    ) -> AsyncIterator[Route]:
        """Lease ``record`` and yield a :class:`Route` once it is ready; release on exit.

        ``timeout_s`` (the model's ``timeout_s``) covers queue and execution only: a
        request that waits for a load gets its deadline extended by the wait. The
        client's own ``client_timeout_s`` caps the whole request, the load included
        (see docs/decisions/0006-loads-and-request-deadlines.md).
        Submit inside the ``async with``: the lease holds until the request is done.
        """
        manager = self.manager
        clock = self._clock
        client_deadline: float | None = None
        if client_timeout_s is not None:
            timeout_s = min(timeout_s, client_timeout_s)
            client_deadline = started + client_timeout_s
        deadline = started + timeout_s
        manager.touch(record)
        # A lease marks the request as wanting this version, so eviction prefers others
        # and waits for it.
        record.leases += 1
        try:
            for attempt in range(ROUTE_ATTEMPTS):
                replica = self.pick(record)
                if replica is None and not record.is_ready:
                    waited = clock.monotonic()
                    try:
                        await manager.ensure_ready(record, deadline=client_deadline)
                    finally:
                        if self.on_load_wait is not None:
                            self.on_load_wait(record, clock.monotonic() - waited)
                    deadline += clock.monotonic() - waited
                    if client_deadline is not None:
                        deadline = min(deadline, client_deadline)
                    replica = self.pick(record)
                holder = record.first if replica is None else replica
                info = holder.info
                scheduler = holder.scheduler
                if info is None or scheduler is None or not scheduler.is_accepting:
                    if attempt + 1 < ROUTE_ATTEMPTS:
                        continue
                    raise ModelNotReadyError(f"model {record.key} is not ready: {record.reason}")
                self._lease(record, replica)
                try:
                    yield Route(record, replica, info, scheduler, deadline)
                finally:
                    self._release(record, replica)
                return
        finally:
            record.leases -= 1
