"""The execute function of one replica's scheduler: its batch on its worker, or once on a
live sibling when that worker has died.

A batch whose worker died (``WorkerCrashedError``) or is already gone never produced an
answer, so running it once on another live replica of the same version is safe and
costs the clients nothing; with no sibling the error stands, as it always did. A request
that itself kills its worker is thereby tried on one sibling too (never more).
"""

from __future__ import annotations

import numpy as np

from modelyard.clock import Clock
from modelyard.errors import (
    DeadlineExceededError,
    ModelNotReadyError,
    WorkerCrashedError,
    WorkerGoneError,
)
from modelyard.manager.records import ModelRecord, Replica
from modelyard.scheduling.dispatcher import Execute


def live_sibling(record: ModelRecord, failed: Replica) -> Replica | None:
    """Another replica of ``record`` whose worker is alive, the least busy (None: none)."""
    holders = [record.first, *record.replicas]
    live = [
        h for h in holders if h is not failed and h.instance is not None and h.instance.is_alive
    ]
    return min(live, key=lambda h: h.in_flight, default=None)


def _gone(record: ModelRecord) -> WorkerGoneError:
    # The batch did not run: the data plane may route its requests once more.
    return WorkerGoneError(f"model {record.key} is not ready: {record.reason}")


def replica_execute(record: ModelRecord, holder: Replica, clock: Clock) -> Execute:
    """The ``execute`` of ``holder``'s scheduler (``holder`` is one of ``record``'s
    replicas, the first included)."""

    async def run_on(
        target: Replica, batch: dict[str, np.ndarray], deadline: float
    ) -> dict[str, np.ndarray]:
        instance = target.instance
        if instance is None or not instance.is_alive:
            raise _gone(record)
        remaining = deadline - clock.monotonic()
        if remaining <= 0:
            # Dispatching now would only get a healthy worker killed for overrunning.
            raise DeadlineExceededError(f"model {record.key}: deadline passed before it ran")
        target.in_flight += 1
        try:
            return await instance.infer(batch, remaining)
        finally:
            target.in_flight -= 1

    async def execute(batch: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
        try:
            return await run_on(holder, batch, deadline)
        except (WorkerCrashedError, ModelNotReadyError):
            sibling = live_sibling(record, holder)
            if sibling is None:
                raise
            return await run_on(sibling, batch, deadline)

    return execute
