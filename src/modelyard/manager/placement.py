"""Placement: which allowed device a load (or an extra replica) goes to, and why.

A model lists the devices it may use in order of preference (``devices: [cuda:0, cpu]``)
or says ``auto`` (every configured device). For each allowed device that is usable and
big enough, placement asks admission what the load would cost there, and takes the
cheapest, in this order:

1. fits in the free budget (nothing to evict);
2. fits once others leave: fewest reload seconds evicted (each victim's last load time),
   spare replicas counting nothing (they serve no one alone), then fewest bytes;
3. fits only once models still loading are READY and evictable (the load will wait);

then, among equals, the device holding fewer replicas of the same version (replicas
spread out), the one with fewer requests outstanding, and the model's own order of
preference. A device that cannot serve (a ``cuda:N`` without driver or GPU, cores the
process may not use) is skipped with its reason; when no allowed device is left the load
fails naming every reason, so asking for CUDA never silently runs on the CPU unless the
model's own list goes on to a CPU device.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelyard.errors import MemoryBudgetError, ModelLoadError
from modelyard.manager.admission import Admission
from modelyard.manager.devices import DeviceTable
from modelyard.manager.events import EventLog
from modelyard.manager.offload import Offloader
from modelyard.manager.records import ModelRecord
from modelyard.manager.states import RESIDENT

_MIB = 1024 * 1024
# A model never loaded yet is assumed to cost this much to bring back.
_DEFAULT_RELOAD_S = 0.1


@dataclass(frozen=True, slots=True)
class Placement:
    """The chosen device and the reason, as the event log says it."""

    device: str
    reason: str
    had_choice: bool = True
    """False when the model allows one device only (no event is worth logging)."""


@dataclass(frozen=True, slots=True, order=True)
class _Cost:
    tier: int
    """0: free room; 1: after evictions; 2: after loads in progress end."""
    reload_s: float
    evicted_bytes: int
    same_version: int
    load: int
    preference: int


class Placer:
    """Chooses a device for each load and replica; pure reads of the manager's state."""

    def __init__(
        self, devices: DeviceTable, admission: Admission, events: EventLog | None = None
    ) -> None:
        self.devices = devices
        self._admission = admission
        self.offload = Offloader(devices, admission, events)
        """How many layers of a GGUF model go to the GPU it is placed on."""

    def device_load(self, device: str) -> int:
        """Requests queued, running or routed on ``device`` (every replica there)."""
        total = 0
        for r in self._admission.records():
            if r.device == device and r.state in RESIDENT:
                total += r.pending_on_self
            total += sum(rep.pending for rep in r.replicas if rep.device == device)
        return total

    def place(
        self, record: ModelRecord, need: int, *, may_evict: bool = True, replica: bool = False
    ) -> Placement:
        """The device ``record`` (or, with ``replica``, an extra replica of it) goes to.

        Raises ModelLoadError when no allowed device can serve it at all (naming each
        device's reason) and MemoryBudgetError when devices exist but none has room.
        """
        allowed = self.devices.allowed(record.config)
        asked = need
        budget = self._admission.budget
        notes: list[str] = []
        options: list[tuple[_Cost, str, str]] = []
        unusable = 0
        full: list[tuple[str, int]] = []  # usable devices big enough, without room now
        too_big: list[tuple[str, int, int]] = []  # (device, bytes needed, its whole budget)
        for preference, name in enumerate(allowed):
            dev = self.devices[name]
            if not dev.is_usable:
                notes.append(f"{name}: {dev.unusable_reason}")
                unusable += 1
                continue
            account = budget.device(name)
            # A GGUF model on a GPU needs one layer there at least (more as they fit),
            # and maps no file there: its host part is charged to the CPU apart.
            need = self.offload.demand(record, name, asked, replica=replica)
            files = self._admission.mapped_files(record, name)
            holder = record.key
            current = 0 if replica else account.reservations.get(holder, 0)
            extra = need - current + account.uncharged_bytes(files)
            whole = need + sum(f.size for f in set(files))
            if whole > account.budget_bytes:
                too_big.append((name, whole, account.budget_bytes))
                notes.append(
                    f"{name}: needs {whole / _MIB:.1f} MiB, "
                    f"budget {account.budget_bytes / _MIB:.1f}"
                )
                continue
            same = sum(1 for rep in record.replicas if rep.device == name)
            if replica and record.device == name and record.state in RESIDENT:
                same += 1
            load = self.device_load(name)
            if extra <= account.free_bytes:
                cost = _Cost(0, 0.0, 0, same, load, preference)
                why = f"{name}: fits in free budget ({account.free_bytes / _MIB:.1f} MiB free)"
                options.append((cost, name, why))
                continue
            if not may_evict:
                # A prefetch's victims were evicted just before its load: their bytes are
                # on the way out, and admission waits for them. Refusing until they are
                # gone dropped nearly every displacing prefetch of a live server (worker
                # processes take a while to exit).
                leaving = self._admission.leaving(name)
                if extra <= account.free_bytes + budget.freed_by(name, leaving, files):
                    cost = _Cost(1, 0.0, 0, same, load, preference)
                    why = f"{name}: fits once the models leaving it are gone"
                    options.append((cost, name, why))
                    continue
                notes.append(
                    f"{name}: {account.free_bytes / _MIB:.1f} MiB free, needs {extra / _MIB:.1f}"
                )
                continue
            missing = extra - account.free_bytes
            leaving = self._admission.leaving(name)
            plan = self._admission.plan(record, name, missing, files, leaving)
            if plan is not None:
                spares, victims = plan
                reload_s = sum(v.timings.total_s or _DEFAULT_RELOAD_S for v in victims)
                freed = budget.freed_by(
                    name,
                    [rep.key for _, rep in spares]
                    + [k for v in victims for k in self._admission.holders(v, name)],
                    files,
                )
                gone = [str(rep.key) for _, rep in spares] + [str(v.key) for v in victims]
                why = f"{name}: fits after evicting {', '.join(gone) or 'what is leaving'}"
                options.append((_Cost(1, reload_s, freed, same, load, preference), name, why))
                continue
            # Models still loading become evictable once READY: with the READY ones they
            # may make room, and admission then waits for them rather than refuse.
            loading = self._admission.candidates(record, loading=True, device=name)
            ready = self._admission.candidates(record, device=name)
            keys = leaving + [k for r in ready + loading for k in self._admission.holders(r, name)]
            if loading and budget.freed_by(name, keys, files) >= missing:
                why = f"{name}: fits once {', '.join(str(r.key) for r in loading)} finish loading"
                options.append((_Cost(2, 0.0, 0, same, load, preference), name, why))
                continue
            notes.append(f"{name}: no room even after evictions")
            full.append((name, need))
        if not options:
            what = "a replica of " if replica else ""
            detail = "; ".join(notes) or "it lists no configured device"
            if allowed and unusable == len(allowed):
                raise ModelLoadError(
                    f"cannot place {what}{record.key}: no device it allows can run it ({detail})"
                )
            if too_big and len(too_big) + unusable == len(allowed):
                name, whole, budget_bytes = too_big[0]
                where = (
                    f"budget of {name}"
                    if len(allowed) == 1
                    else f"budget of {name} (and of every device it allows: {detail})"
                )
                if self.offload.applies(record, name) and not replica:
                    raise MemoryBudgetError(
                        f"model {record.key} needs {whole / _MIB:.1f} MiB on {name} for its "
                        f"first layer alone (with the worker's CUDA context and buffers), more "
                        f"than the whole {budget_bytes / _MIB:.1f} MiB {where}"
                    )
                raise self._admission.too_big(record, whole, budget_bytes, where)
            if full:
                # Devices exist but are full: the budget's own refusal names what is in
                # the way (pinned, higher priority) on the first of them.
                refusal = self._admission.refusal(record, full[0][1], full[0][0])
                if len(allowed) > 1:
                    refusal = MemoryBudgetError(
                        f"{refusal.message}; on every device it allows: {detail}",
                        retry_after_s=refusal.retry_after_s,
                    )
                raise refusal
            raise MemoryBudgetError(f"cannot place {what}{record.key}: {detail}", retry_after_s=5.0)
        options.sort()
        _, name, why = options[0]
        others = [w for _, n, w in options[1:]] + notes
        reason = why + (f" (over {'; '.join(others)})" if others else "")
        return Placement(name, reason, had_choice=len(allowed) > 1)
