"""Relocation: a model whose device has gone (a cluster node lost) moves to another.

Called by the loader's restart, under the record's lock, before the new worker starts:
the reservation on the lost device is given back, placement chooses among the devices
still usable by the same rules as any load (budget, evictions, spread), the new device
is reserved, and the event log says what moved where and why.
"""

from __future__ import annotations

import logging

from modelyard.manager.admission import Admission
from modelyard.manager.events import EventLog
from modelyard.manager.placement import Placer
from modelyard.manager.records import ModelRecord

__all__ = ["leave_lost_device", "relocate"]

log = logging.getLogger("modelyard.manager")


def leave_lost_device(record: ModelRecord, placer: Placer, admission: Admission) -> str:
    """If ``record`` holds a reservation on a device that is gone, give it back and
    return ``"DEVICE (why)"`` for the event log; else ``""`` (nothing to leave)."""
    dev = placer.devices.devices.get(record.device)
    account = admission.budget.devices.get(record.device)
    if dev is None or dev.is_usable or account is None or record.key not in account.reservations:
        return ""  # usable, or nothing held there (a device that never worked, say)
    admission.release(record)
    return f"{dev.name} ({dev.unusable_reason})"


async def relocate(
    record: ModelRecord, placer: Placer, admission: Admission, events: EventLog
) -> None:
    """Move ``record`` off its unusable device; ServerError if no device takes it now."""
    old = record.device
    why = placer.devices[old].unusable_reason
    admission.release(record)
    need = record.measured_bytes or admission.estimate_bytes(record)
    placement = placer.place(record, need)
    record.device = placement.device
    try:
        await admission.admit(record, need, None)
    except BaseException:
        admission.release(record)
        raise
    events.add("moved", record.key, f"from {old} ({why}) to {placement.device}: {placement.reason}")
    log.warning("moved %s from %s (%s) to %s", record.key, old, why, placement.device)
