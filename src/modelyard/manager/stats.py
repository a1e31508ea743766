"""Typed views of the manager's state: one per model version, per device, and the whole.

``/v2/stats`` and ``/v2/health/details`` both read a :class:`VersionView`, so a fact
about a version (its state, reason, pid, restarts, breaker) is worked out once; each
route converts the view to its JSON shape at the edge (:meth:`VersionView.stats_json`,
:meth:`VersionView.health_json`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from modelyard.manager.events import Event
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import LoadTimings, ModelRecord


@dataclass(frozen=True, slots=True)
class VersionView:
    """One model version as the stats and health views show it."""

    name: str
    version: str
    state: str
    ready: bool
    reason: str
    device: str
    priority: int
    pinned: bool
    isolation: str
    reserved_bytes: int
    measured_bytes: int | None
    last_used_s_ago: float | None
    requests: int
    loads: int
    unloads: int
    evictions: int
    restarts: int
    cold_starts: int
    prefetches: int
    cold_start_s_total: float
    pending: int
    last_load: LoadTimings
    pid: int | None
    """The instance's process (None: inline, or never loaded)."""
    worker: dict[str, object] | None
    """The worker's own readings (None until a load reported them)."""
    scheduler: dict[str, Any] | None
    """The scheduler's stats (None while no scheduler runs)."""
    breaker: str | None
    """The circuit breaker's state (None while no scheduler runs)."""

    @classmethod
    def of(cls, record: ModelRecord, now: float) -> VersionView:
        """The view of ``record``; ``now`` is on the manager's clock (``last_used`` is)."""
        s = record.stats
        t = record.timings
        info = record.info
        scheduler = record.scheduler
        return cls(
            name=record.key.name,
            version=record.key.version,
            state=record.state.value,
            ready=record.is_ready,
            reason=record.reason,
            device=record.config.device,
            priority=record.config.priority,
            pinned=record.pinned,
            isolation=record.config.isolation,
            reserved_bytes=record.reserved_bytes,
            measured_bytes=record.measured_bytes,
            last_used_s_ago=None if not s.last_used else round(now - s.last_used, 3),
            requests=s.requests,
            loads=s.loads,
            unloads=s.unloads,
            evictions=s.evictions,
            restarts=s.restarts,
            cold_starts=s.cold_starts,
            prefetches=s.prefetches,
            cold_start_s_total=s.cold_start_s_total,
            pending=record.pending,
            last_load=LoadTimings(
                t.queue_wait_s, t.process_start_s, t.runtime_load_s, t.warmup_s, t.total_s
            ),
            pid=info.pid if info is not None else None,
            worker=dict(info.details) if info is not None else None,
            scheduler=scheduler.stats() if scheduler is not None else None,
            breaker=scheduler.breaker.state.value if scheduler is not None else None,
        )

    def stats_json(self) -> dict[str, Any]:
        """The ``/v2/stats`` shape: state, bytes, counters and last load timings."""
        t = self.last_load
        out: dict[str, Any] = {
            "name": self.name,
            "version": self.version,
            "state": self.state,
            "ready": self.ready,
            "reason": self.reason,
            "device": self.device,
            "priority": self.priority,
            "pinned": self.pinned,
            "isolation": self.isolation,
            "reserved_bytes": self.reserved_bytes,
            "measured_bytes": self.measured_bytes,
            "last_used_s_ago": self.last_used_s_ago,
            "requests": self.requests,
            "loads": self.loads,
            "unloads": self.unloads,
            "evictions": self.evictions,
            "restarts": self.restarts,
            "cold_starts": self.cold_starts,
            "prefetches": self.prefetches,
            "cold_start_s_total": round(self.cold_start_s_total, 6),
            "pending": self.pending,
            "last_load": {
                "queue_wait_s": round(t.queue_wait_s, 6),
                "process_start_s": round(t.process_start_s, 6),
                "runtime_load_s": round(t.runtime_load_s, 6),
                "warmup_s": round(t.warmup_s, 6),
                "total_s": round(t.total_s, 6),
            },
        }
        if self.worker is not None:  # a load reported (the pid with it)
            out["pid"] = self.pid
            out["worker"] = dict(self.worker)
        if self.scheduler is not None:
            out["scheduler"] = self.scheduler
        return out

    def health_json(self) -> dict[str, Any]:
        """The ``/v2/health/details`` shape: why this version is (not) ready."""
        return {
            "name": self.name,
            "version": self.version,
            "state": self.state,
            "ready": self.ready,
            "reason": self.reason,
            "pid": self.pid if self.ready else None,
            "restarts": self.restarts,
            "breaker": self.breaker,
        }


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One device's budget."""

    name: str
    budget_bytes: int
    reserved_bytes: int
    free_bytes: int

    def to_json(self) -> dict[str, Any]:
        """``{"name", "budget_bytes", "reserved_bytes", "free_bytes"}``."""
        return {
            "name": self.name,
            "budget_bytes": self.budget_bytes,
            "reserved_bytes": self.reserved_bytes,
            "free_bytes": self.free_bytes,
        }


@dataclass(frozen=True, slots=True)
class ManagerView:
    """Every model version, every device budget, the policy and the recent events."""

    models: list[VersionView]
    devices: list[DeviceView]
    eviction_policy: str
    events: list[Event]

    @classmethod
    def of(cls, manager: ModelManager, *, events: int = 50) -> ManagerView:
        """The manager now (the last ``events`` events)."""
        now = manager.clock.monotonic()
        return cls(
            models=[VersionView.of(r, now) for r in manager.records()],
            devices=[
                DeviceView(d.name, d.budget_bytes, d.reserved_bytes, d.free_bytes)
                for d in manager.budget.devices.values()
            ],
            eviction_policy=manager.policy.name,
            events=manager.events.recent(events),
        )

    def stats_json(self) -> dict[str, Any]:
        """The ``/v2/stats`` document."""
        return {
            "models": [m.stats_json() for m in self.models],
            "devices": [d.to_json() for d in self.devices],
            "eviction_policy": self.eviction_policy,
            "events": [e.to_dict() for e in self.events],
        }
