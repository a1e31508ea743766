"""Replicas: extra workers of a READY model version, started and stopped by load.

A version's first replica is the record itself, loaded and restarted by the loader.
Extra replicas (:class:`~modelyard.manager.records.Replica`) are started here, each with
its own worker, its own scheduler and its own reservation on the device placement picks
for it (mapped weight files are charged once per device, as for any model):

* ``replicas.min`` extra workers are kept while the version is READY;
* **scale out**: when the requests queued or running per replica stay above
  ``target_queue_depth`` (or requests wait in a queue longer than
  ``target_queue_wait_s``) for ``scale_up_after_s``, one more replica starts, up to
  ``replicas.max``. A scale-out only takes free budget: spare capacity never evicts a
  model;
* **scale in**: a spare replica that had no request for ``scale_down_idle_s`` is drained
  and stopped (the router sends ties to the oldest replica, so spares go idle as soon as
  the load drops);
* under memory pressure admission stops spare replicas before whole models, and a
  replica whose worker dies is dropped (its queued requests move to its siblings);
  the scaler starts another if the load still needs one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable

from modelyard.clock import Clock
from modelyard.errors import ServerError
from modelyard.manager.admission import Admission
from modelyard.manager.events import EventLog
from modelyard.manager.loader import Loader
from modelyard.manager.records import ModelRecord, Replica, ReplicaKey, ReplicaState
from modelyard.manager.states import ModelState
from modelyard.manager.tasks import TaskOwner
from modelyard.workers.instance import ModelInstance

log = logging.getLogger("modelyard.manager")

SCALE_TICK_S = 0.1
"""How often the scaler looks at the queues."""

_MIB = 1024 * 1024

ReplicaReady = Callable[[ModelRecord, Replica], Awaitable[None]]
"""Gives a started replica its scheduler (the app's)."""
ReplicaStopped = Callable[[Replica], None]
"""Closes a stopped replica's scheduler (the app's)."""


class ReplicaScaler:
    """Starts, stops and scales the extra replicas of every model version."""

    def __init__(
        self,
        *,
        records: Callable[[], Iterable[ModelRecord]],
        loader: Loader,
        admission: Admission,
        tasks: TaskOwner,
        events: EventLog,
        clock: Clock,
        on_ready: ReplicaReady | None = None,
        on_stopped: ReplicaStopped | None = None,
    ) -> None:
        self._records = records
        self._loader = loader
        self._admission = admission
        self._tasks = tasks
        self.events = events
        self._clock = clock
        self.on_ready = on_ready
        self.on_stopped = on_stopped
        self._loop: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the scaling loop (owned by the manager's task owner). Idempotent."""
        if self._loop is None or self._loop.done():
            self._loop = self._tasks.spawn(self._run())

    async def _run(self) -> None:
        while not self._tasks.closing:
            self.tick()
            await asyncio.sleep(SCALE_TICK_S)

    # ------------------------------------------------------------------ decisions

    def tick(self) -> None:
        """One look at every model version's load; starts or stops at most one replica each."""
        now = self._clock.monotonic()
        for record in list(self._records()):
            if record.replicas or record.config.replicas.max > 1:
                self._scale(record, now)

    def _scale(self, record: ModelRecord, now: float) -> None:
        cfg = record.config.replicas
        wait_s, record.queue_wait_s = record.queue_wait_s, 0.0
        for rep in record.replicas:
            if rep.pending > 0 or rep.state is ReplicaState.STARTING:
                rep.last_busy = now
        if record.state is not ModelState.READY:
            record.busy_since = None
            if record.state in (ModelState.FAILED, ModelState.UNLOADED):
                # Its restarts failed: the replicas go with it. (While it restarts
                # (LOADING), they keep serving.)
                for rep in list(record.replicas):
                    self.remove(record, rep, f"its model is {record.state.value}")
            return
        live = [r for r in record.replicas if r.state is not ReplicaState.DRAINING]
        count = 1 + len(live)
        starting = any(r.state is ReplicaState.STARTING for r in live)
        if count < cfg.min and not starting:
            self.add(record, "replicas.min")
            return
        pending = record.pending_on_self + sum(r.pending for r in live)
        depth = pending / count
        busy = depth > cfg.target_queue_depth or (pending > 0 and wait_s > cfg.target_queue_wait_s)
        if not busy:
            record.busy_since = None
        elif record.busy_since is None:
            record.busy_since = now
        elif now - record.busy_since >= cfg.scale_up_after_s and count < cfg.max and not starting:
            record.busy_since = now
            self.add(
                record,
                f"{depth:.1f} requests per replica (target {cfg.target_queue_depth:g}), "
                f"longest queue wait {wait_s * 1000:.0f} ms",
            )
            return
        if count > cfg.min:
            idle = [r for r in live if r.state is ReplicaState.READY and r.pending == 0]
            idle = [r for r in idle if now - r.last_busy >= cfg.scale_down_idle_s]
            if idle:
                self.remove(record, idle[-1], f"idle for {cfg.scale_down_idle_s:g} s")

    # ------------------------------------------------------------------ actions

    def add(self, record: ModelRecord, why: str) -> None:
        """Start one extra replica of ``record`` in the background."""
        index = record.next_replica
        record.next_replica += 1
        replica = Replica(ReplicaKey(record.key.name, record.key.version, index), device="")
        replica.last_busy = self._clock.monotonic()
        record.replicas.append(replica)
        self._tasks.spawn(self._start(record, replica, why))

    async def _start(self, record: ModelRecord, replica: Replica, why: str) -> None:
        admission = self._admission
        need = record.measured_bytes or admission.estimate_bytes(record)
        try:
            placement = self._loader.placer.place(record, need, may_evict=False, replica=True)
            replica.device = placement.device
            await admission.admit(
                record, need, None, may_evict=False, device=replica.device, holder=replica.key
            )
        except ServerError as exc:
            self._forget(record, replica)
            log.info("no replica %s: %s", replica.key, exc)
            self.events.add("replica_refused", record.key, f"{replica.key}: {exc}")
            return
        try:
            instance, info, footprint = await self._loader.spawn(record, replica.device)
        except BaseException as exc:
            admission.budget.release(replica.device, replica.key)
            self._forget(record, replica)
            await self._notify()
            if isinstance(exc, Exception):
                self.events.add("replica_failed", record.key, f"{replica.key}: {exc}")
                log.warning("replica %s failed to start: %s", replica.key, exc)
                return
            raise
        replica.instance = instance
        replica.info = info
        replica.measured_bytes = footprint
        budget = admission.budget
        fits = budget.resize(replica.device, replica.key, max(footprint, 1))
        replica.reserved_bytes = budget.reserved(replica.device, replica.key)
        if not fits:
            # Spare capacity never pushes a device over its budget.
            why = f"measured {footprint / _MIB:.1f} MiB, more than {replica.device} has free"
            self.events.add("replica_refused", record.key, f"{replica.key}: {why}")
            await self._stop(record, replica, why)
            return
        if record.state is not ModelState.READY or replica.state is not ReplicaState.STARTING:
            await self._stop(record, replica, "its model left while it started")
            return
        instance.set_exit_callback(lambda reason: self._on_exit(record, replica, instance, reason))
        if self.on_ready is not None:
            await self.on_ready(record, replica)
        replica.state = ReplicaState.READY
        replica.last_busy = self._clock.monotonic()
        self.events.add(
            "replica_added",
            record.key,
            f"{replica.key} on {replica.device} ({why}); {placement.reason}",
        )
        log.info("replica %s started on %s: %s", replica.key, replica.device, why)

    def remove(self, record: ModelRecord, replica: Replica, why: str) -> None:
        """Drain and stop ``replica`` in the background."""
        if replica.state is ReplicaState.DRAINING:
            return
        replica.state = ReplicaState.DRAINING
        self.events.add("replica_removed", record.key, f"{replica.key} on {replica.device}: {why}")
        log.info("stopping replica %s: %s", replica.key, why)
        self._tasks.spawn(self._stop(record, replica, why))

    async def stop_all(self, record: ModelRecord, why: str) -> None:
        """Drain and stop every extra replica of ``record`` (its model is unloading)."""
        for replica in record.replicas:
            replica.state = ReplicaState.DRAINING
        await asyncio.gather(
            *(self._stop(record, r, why) for r in list(record.replicas)), return_exceptions=True
        )

    async def _stop(self, record: ModelRecord, replica: Replica, why: str) -> None:
        replica.state = ReplicaState.DRAINING
        # Queued requests finish first (on a sibling if this worker is gone).
        await replica.drain()
        instance, replica.instance = replica.instance, None
        try:
            if self.on_stopped is not None:
                self.on_stopped(replica)
            if instance is not None:
                await instance.stop()
        finally:
            if replica.device:
                self._admission.budget.release(replica.device, replica.key)
            replica.reserved_bytes = 0
            self._forget(record, replica)
            await self._notify()

    def _on_exit(
        self, record: ModelRecord, replica: Replica, instance: ModelInstance, reason: str
    ) -> None:
        if replica.instance is not instance or self._tasks.closing:
            return
        if replica.state is ReplicaState.DRAINING:
            return
        self.events.add("replica_crashed", record.key, f"{replica.key}: {reason}")
        log.warning("worker of replica %s died (%s); its siblings take over", replica.key, reason)
        self.remove(record, replica, f"worker died ({reason})")

    def _forget(self, record: ModelRecord, replica: Replica) -> None:
        if replica in record.replicas:
            record.replicas.remove(replica)

    async def _notify(self) -> None:
        async with self._admission.changed:
            self._admission.changed.notify_all()
