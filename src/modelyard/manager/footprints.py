"""Committing a model's measured footprint to its device budget.

A load reserves an estimate before its worker starts (``admission.py``). The measured
footprint then replaces it: the reservation shrinks to it, or grows, evicting colder
models as admission does; a model that does not fit even then is refused.

A worker process measures after the model is READY (``StartRequest.defer_footprint``):
reading its memory walks every page it maps (5-30 ms, the bulk of a tiny model's switch),
so the model serves on its reservation meanwhile and :meth:`FootprintCommitter.later`
commits the measurement a moment after. Until then the model counts as still loading
for admission (never a victim: a load waits for it instead, see
``Admission.candidates``). A model whose measurement does not fit goes (drained, its
worker stopped, its bytes given back): FAILED with the typed refusal if it is bigger
than the whole budget, as an over-budget load was; else evicted, to be loaded again on
its measured bytes. docs/decisions/0002-footprint-measured-after-ready.md says why this is safe.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from modelyard.errors import ServerError
from modelyard.manager.admission import Admission
from modelyard.manager.devices import DeviceTable
from modelyard.manager.records import ModelRecord
from modelyard.manager.states import ModelState
from modelyard.manager.tasks import TaskOwner
from modelyard.workers.instance import DeferredFootprint, InstanceInfo, ModelInstance

__all__ = ["FootprintCommitter", "footprint_note"]

log = logging.getLogger("modelyard.manager")

_MIB = 1024 * 1024


def footprint_note(record: ModelRecord) -> str:
    """What a load's log line says of its footprint."""
    if record.footprint_pending is not None:
        return f"{record.reserved_bytes / _MIB:.1f} MiB reserved (footprint measured next)"
    return f"{(record.measured_bytes or 0) / _MIB:.1f} MiB measured"


class FootprintCommitter:
    """Replaces a model's reservation by its measured footprint, now or right after."""

    def __init__(
        self,
        admission: Admission,
        devices: DeviceTable,
        tasks: TaskOwner,
        *,
        fail: Callable[[ModelRecord, str, str], None],
    ) -> None:
        self._admission = admission
        self._devices = devices
        self._tasks = tasks
        self._fail = fail
        """Marks a model FAILED with a reason and an event (the loader's ``fail``)."""
        self.unload: Callable[[ModelRecord, str], Awaitable[None]] | None = None
        """Drains and unloads a READY model (the manager's); set by the manager."""
        self.evict: Callable[[ModelRecord, str], Awaitable[None]] | None = None
        """Drains and unloads a READY model as an eviction (the manager's); set by it."""

    def device_bytes(self, device: str, info: InstanceInfo) -> int:
        """The footprint on ``device``: for ``cuda:N`` the device memory NVML reports for
        the worker's process, else (or when NVML cannot tell) the measured one."""
        if info.pid is not None:
            on_device = self._devices.process_device_bytes(device, info.pid)
            if on_device is not None:
                return on_device
        return info.footprint_bytes

    async def commit(self, record: ModelRecord, footprint: int) -> None:
        """Set ``record``'s reservation on its device to ``footprint``, making room if
        it grew; the refusal (a ServerError) if it does not fit even then."""
        budget = self._admission.budget
        record.measured_bytes = footprint
        if not budget.resize(record.device, record.key, max(footprint, 1)):
            # Measured more than reserved and the rest does not fit: make room or give up.
            await self._admission.admit(record, footprint, None)
        record.reserved_bytes = budget.reserved(record.device, record.key)

    def later(
        self, record: ModelRecord, instance: ModelInstance, after_first_answer: bool = False
    ) -> None:
        """Measure ``instance`` (READY now, serving on its reservation) and commit that,
        in the background, once the first request has had its first answer when
        ``after_first_answer`` (a request waited for the load; ``workers/answers.py``);
        the model counts as loading for admission until then."""
        record.footprint_pending = instance
        self._tasks.spawn(self._measure_and_commit(record, instance, after_first_answer))

    async def _measure_and_commit(
        self, record: ModelRecord, instance: ModelInstance, after_first_answer: bool
    ) -> None:
        try:
            # The record's lock: no reload of it can start (and reserve) meanwhile.
            async with record.lock:
                await self._commit_later(record, instance, after_first_answer)
        finally:
            if record.footprint_pending is instance:
                record.footprint_pending = None
            async with self._admission.changed:
                self._admission.changed.notify_all()

    async def _commit_later(
        self, record: ModelRecord, instance: ModelInstance, after_first_answer: bool
    ) -> None:
        if record.instance is not instance or not isinstance(instance, DeferredFootprint):
            return
        try:
            info = await instance.measure_footprint(after_first_answer=after_first_answer)
        except ServerError:
            return  # its worker is gone: the exit (or the unload that stopped it) follows
        if record.instance is not instance or record.state is not ModelState.READY:
            return  # unloaded meanwhile: its reservation went with it
        record.info = info
        footprint = self.device_bytes(record.device, info)
        try:
            await self.commit(record, footprint)
        except ServerError as exc:
            if record.instance is instance and record.state is ModelState.READY:
                await self._refuse(record, footprint, exc)
            return
        finally:
            self._drop_stale(record, instance)
        log.debug("committed %s's footprint: %.1f MiB", record.key, footprint / _MIB)

    def _drop_stale(self, record: ModelRecord, instance: ModelInstance) -> None:
        """A commit that grew by waiting for room may have reserved again for a model
        unloaded meanwhile (its unload gave the reservation back first): give it back.
        A model still on its way out gives back its own when its worker has gone."""
        if record.instance is not instance and record.state in (
            ModelState.UNLOADED,
            ModelState.FAILED,
        ):
            self._admission.release(record)

    async def _refuse(self, record: ModelRecord, footprint: int, exc: ServerError) -> None:
        """The measurement does not fit: the model goes (over budget only while its
        requests drain). Bigger than the whole budget, it fails with the refusal, as an
        over-budget load fails; otherwise what holds the rest is busy or growing too, so
        it is evicted: the next request loads it again, reserving the measured bytes
        (``estimate_bytes``) and making room before its worker starts."""
        budget = self._admission.budget.device(record.device)
        files = set(self._admission.mapped_files(record))
        if footprint + sum(f.size for f in files) > budget.budget_bytes:
            reason = f"{exc} (measured {footprint / _MIB:.1f} MiB once loaded)"
            log.error("%s: unloading it", reason)
            if self.unload is not None:
                await self.unload(record, reason)
            self._fail(record, reason, "load_failed")
            return
        why = f"its measured footprint ({footprint / _MIB:.1f} MiB) does not fit now: {exc}"
        if self.evict is not None:
            await self.evict(record, why)
