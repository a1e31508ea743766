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

The choice itself is pure functions of what placement read (unit-tested without a
server): :func:`candidates` (the usable devices in order of preference, and why the
others are not), :func:`cost` (the order above), :func:`choose` (the cheapest option
and the reason) and :func:`verdict` (which refusal when no device will do). The
:class:`Placer` reads the budgets and admission's plans into :class:`Option` and
:class:`Refusal` values and hands them to these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from modelyard.errors import MemoryBudgetError, ModelLoadError, ServerError
from modelyard.manager.admission import Admission
from modelyard.manager.budget import SharedFile
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
class Cost:
    """What a load costs on one device; the lowest wins (fields compared in order)."""

    tier: int
    """0: free room; 1: after evictions (or models leaving); 2: after loads in progress end."""
    reload_s: float
    evicted_bytes: int
    same_version: int
    load: int
    preference: int


@dataclass(frozen=True, slots=True)
class Option:
    """A device that can take the load, at ``cost``; ``why`` as the event log says it."""

    cost: Cost
    device: str
    why: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why one allowed device cannot take the load now (``note``: as the error says it)."""

    device: str
    kind: Literal["unusable", "too_big", "full", "no_room"]
    note: str
    need: int = 0
    """Bytes needed there (``full``: the budget's own refusal is asked for them)."""
    budget_bytes: int = 0
    """The device's whole budget (``too_big``)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """Which error a load no device can take gets (see :func:`verdict`)."""

    kind: Literal["unusable", "too_big", "full", "other"]
    detail: str
    first: Refusal | None = None
    """The refusal the error names (``too_big`` and ``full``)."""


def candidates(
    allowed: Sequence[str], devices: DeviceTable
) -> tuple[list[tuple[int, str]], list[Refusal]]:
    """The usable devices of ``allowed`` with their rank of preference, and a refusal
    naming the reason for each device that cannot serve at all."""
    usable: list[tuple[int, str]] = []
    refused: list[Refusal] = []
    for preference, name in enumerate(allowed):
        dev = devices[name]
        if dev.is_usable:
            usable.append((preference, name))
        else:
            refused.append(Refusal(name, "unusable", f"{name}: {dev.unusable_reason}"))
    return usable, refused


def same_version(record: ModelRecord, device: str, *, replica: bool) -> int:
    """Replicas of ``record``'s version on ``device`` (the model itself counts when an
    extra replica is placed): replicas spread out."""
    same = sum(1 for rep in record.replicas if rep.device == device)
    if replica and record.device == device and record.state in RESIDENT:
        same += 1
    return same


def cost(
    tier: int,
    *,
    same: int,
    load: int,
    preference: int,
    reload_s: float = 0.0,
    evicted_bytes: int = 0,
) -> Cost:
    """The cost of a device in the order of the module's docstring."""
    return Cost(tier, reload_s, evicted_bytes, same, load, preference)


def choose(options: Sequence[Option], refused: Sequence[Refusal], allowed: int) -> Placement:
    """The cheapest of ``options`` (at least one), its reason naming the devices passed
    over and why (``allowed``: how many devices the model allows)."""
    ordered = sorted(options, key=lambda o: o.cost)
    best = ordered[0]
    others = [o.why for o in ordered[1:]] + [r.note for r in refused]
    reason = best.why + (f" (over {'; '.join(others)})" if others else "")
    return Placement(best.device, reason, had_choice=allowed > 1)


def verdict(refused: Sequence[Refusal], allowed: int) -> Verdict:
    """Which refusal a load gets when no allowed device can take it: every device
    unusable; too big for every usable one (the first named); some full now (the
    budget's own refusal on the first); or the reasons, each device's."""
    detail = "; ".join(r.note for r in refused) or "it lists no configured device"
    kinds = [r.kind for r in refused]
    unusable = kinds.count("unusable")
    too_big = [r for r in refused if r.kind == "too_big"]
    if allowed and unusable == allowed:
        return Verdict("unusable", detail)
    if too_big and len(too_big) + unusable == allowed:
        return Verdict("too_big", detail, too_big[0])
    full = [r for r in refused if r.kind == "full"]
    if full:
        return Verdict("full", detail, full[0])
    return Verdict("other", detail)


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
        usable, refused = candidates(allowed, self.devices)
        options: list[Option] = []
        for preference, name in usable:
            found = self._option(record, name, preference, need, may_evict, replica)
            if isinstance(found, Option):
                options.append(found)
            else:
                refused.append(found)
        rank = {name: i for i, name in enumerate(allowed)}
        refused.sort(key=lambda r: rank[r.device])  # the reasons in the model's order
        if not options:
            raise self._refuse(record, verdict(refused, len(allowed)), len(allowed), replica)
        return choose(options, refused, len(allowed))

    def _option(
        self,
        record: ModelRecord,
        name: str,
        preference: int,
        asked: int,
        may_evict: bool,
        replica: bool,
    ) -> Option | Refusal:
        """What a load of ``record`` costs on device ``name``, or why it cannot go there."""
        account = self._admission.budget.device(name)
        # A GGUF model on a GPU needs one layer there at least (more as they fit),
        # and maps no file there: its host part is charged to the CPU apart.
        need = self.offload.demand(record, name, asked, replica=replica)
        files = self._admission.mapped_files(record, name)
        current = 0 if replica else account.reservations.get(record.key, 0)
        extra = need - current + account.uncharged_bytes(files)
        whole = need + sum(f.size for f in set(files))
        if whole > account.budget_bytes:
            note = f"{name}: needs {whole / _MIB:.1f} MiB, budget {account.budget_bytes / _MIB:.1f}"
            return Refusal(name, "too_big", note, whole, account.budget_bytes)
        at = {
            "same": same_version(record, name, replica=replica),
            "load": self.device_load(name),
            "preference": preference,
        }
        if extra <= account.free_bytes:
            why = f"{name}: fits in free budget ({account.free_bytes / _MIB:.1f} MiB free)"
            return Option(cost(0, **at), name, why)
        if not may_evict:
            return self._once_gone(name, extra, files, at)
        return self._after_evictions(record, name, need, extra, files, at)

    def _once_gone(
        self, name: str, extra: int, files: list[SharedFile], at: dict[str, int]
    ) -> Option | Refusal:
        # A prefetch's victims were evicted just before its load: their bytes are on the
        # way out, and admission waits for them. Refusing until they are gone dropped
        # nearly every displacing prefetch of a live server (worker processes take a
        # while to exit).
        account = self._admission.budget.device(name)
        leaving = self._admission.leaving(name)
        if extra <= account.free_bytes + self._admission.budget.freed_by(name, leaving, files):
            return Option(cost(1, **at), name, f"{name}: fits once the models leaving it are gone")
        note = f"{name}: {account.free_bytes / _MIB:.1f} MiB free, needs {extra / _MIB:.1f}"
        return Refusal(name, "no_room", note)

    def _after_evictions(
        self,
        record: ModelRecord,
        name: str,
        need: int,
        extra: int,
        files: list[SharedFile],
        at: dict[str, int],
    ) -> Option | Refusal:
        admission = self._admission
        budget = admission.budget
        missing = extra - budget.device(name).free_bytes
        leaving = admission.leaving(name)
        plan = admission.plan(record, name, missing, files, leaving)
        if plan is not None:
            spares, victims = plan
            reload_s = sum(v.timings.total_s or _DEFAULT_RELOAD_S for v in victims)
            freed = budget.freed_by(
                name,
                [rep.key for _, rep in spares]
                + [k for v in victims for k in admission.holders(v, name)],
                files,
            )
            gone = [str(rep.key) for _, rep in spares] + [str(v.key) for v in victims]
            why = f"{name}: fits after evicting {', '.join(gone) or 'what is leaving'}"
            return Option(cost(1, reload_s=reload_s, evicted_bytes=freed, **at), name, why)
        # Models still loading become evictable once READY: with the READY ones they
        # may make room, and admission then waits for them rather than refuse.
        loading = admission.candidates(record, loading=True, device=name)
        ready = admission.candidates(record, device=name)
        keys = leaving + [k for r in ready + loading for k in admission.holders(r, name)]
        if loading and budget.freed_by(name, keys, files) >= missing:
            why = f"{name}: fits once {', '.join(str(r.key) for r in loading)} finish loading"
            return Option(cost(2, **at), name, why)
        return Refusal(name, "full", f"{name}: no room even after evictions", need)

    def _refuse(
        self, record: ModelRecord, why: Verdict, allowed: int, replica: bool
    ) -> ServerError:
        """The error of a load no allowed device can take (see :func:`verdict`)."""
        what = "a replica of " if replica else ""
        if why.kind == "unusable":
            return ModelLoadError(
                f"cannot place {what}{record.key}: no device it allows can run it ({why.detail})"
            )
        first = why.first
        if why.kind == "too_big" and first is not None:
            name, whole, budget_bytes = first.device, first.need, first.budget_bytes
            where = (
                f"budget of {name}"
                if allowed == 1
                else f"budget of {name} (and of every device it allows: {why.detail})"
            )
            if self.offload.applies(record, name) and not replica:
                return MemoryBudgetError(
                    f"model {record.key} needs {whole / _MIB:.1f} MiB on {name} for its "
                    f"first layer alone (with the worker's CUDA context and buffers), more "
                    f"than the whole {budget_bytes / _MIB:.1f} MiB {where}"
                )
            return self._admission.too_big(record, whole, budget_bytes, where)
        if why.kind == "full" and first is not None:
            # Devices exist but are full: the budget's own refusal names what is in the
            # way (pinned, higher priority) on the first of them.
            refusal = self._admission.refusal(record, first.need, first.device)
            if allowed > 1:
                return MemoryBudgetError(
                    f"{refusal.message}; on every device it allows: {why.detail}",
                    retry_after_s=refusal.retry_after_s,
                )
            return refusal
        return MemoryBudgetError(
            f"cannot place {what}{record.key}: {why.detail}", retry_after_s=5.0
        )
