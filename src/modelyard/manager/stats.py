"""Typed views of the manager's state: one per model version, per device, and the whole.

``/v2/stats`` and ``/v2/health/details`` both read a :class:`VersionView`, so a fact
about a version (its state, reason, pid, restarts, breaker) is worked out once; each
route converts the view to its JSON shape at the edge (:meth:`VersionView.stats_json`,
:meth:`VersionView.health_json`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelyard.manager.events import Event
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import LoadTimings, ModelRecord, Replica


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
    footprint_pending: bool
    """Serving on its reservation; the measured footprint is committed next."""
    last_used_s_ago: float | None
    requests: int
    loads: int
    unloads: int
    evictions: int
    restarts: int
    cold_starts: int
    prefetches: int
    prefetch_hits: int
    prefetch_wasted: int
    prefetch_hidden_s: float
    page_cache_warms: int
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
    generation: dict[str, object] | None = None
    """Its first replica's generation scheduler's stats (generative models only)."""
    replicas: list[ReplicaView] = field(default_factory=list)
    """Its extra replicas (scale-out), each on its own device."""
    offload: dict[str, Any] | None = None
    """A GGUF model on a GPU: its layers on the device and on the host, and why."""

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
            device=record.device,
            priority=record.config.priority,
            pinned=record.pinned,
            isolation=record.config.isolation,
            reserved_bytes=record.reserved_bytes,
            measured_bytes=record.measured_bytes,
            footprint_pending=record.footprint_pending is not None,
            last_used_s_ago=None if not s.last_used else round(now - s.last_used, 3),
            requests=s.requests,
            loads=s.loads,
            unloads=s.unloads,
            evictions=s.evictions,
            restarts=s.restarts,
            cold_starts=s.cold_starts,
            prefetches=s.prefetches,
            prefetch_hits=s.prefetch_hits,
            prefetch_wasted=s.prefetch_wasted,
            prefetch_hidden_s=s.prefetch_hidden_s,
            page_cache_warms=s.page_cache_warms,
            cold_start_s_total=s.cold_start_s_total,
            pending=record.pending,
            last_load=LoadTimings(
                t.queue_wait_s, t.process_start_s, t.runtime_load_s, t.warmup_s, t.total_s
            ),
            pid=info.pid if info is not None else None,
            worker=dict(info.details) if info is not None else None,
            scheduler=scheduler.stats() if scheduler is not None else None,
            breaker=scheduler.breaker.state.value if scheduler is not None else None,
            generation=_generation_stats(record.first),
            replicas=[ReplicaView.of(r) for r in record.replicas],
            offload=record.offload.to_json() if record.offload is not None else None,
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
            "footprint_pending": self.footprint_pending,
            "last_used_s_ago": self.last_used_s_ago,
            "requests": self.requests,
            "loads": self.loads,
            "unloads": self.unloads,
            "evictions": self.evictions,
            "restarts": self.restarts,
            "cold_starts": self.cold_starts,
            "prefetches": self.prefetches,
            "prefetch_hits": self.prefetch_hits,
            "prefetch_wasted": self.prefetch_wasted,
            "prefetch_hidden_s": round(self.prefetch_hidden_s, 6),
            "page_cache_warms": self.page_cache_warms,
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
        if self.generation is not None:
            out["generation"] = self.generation
        out["replicas"] = [r.to_json() for r in self.replicas]
        if self.offload is not None:
            out["offload"] = self.offload
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
class ReplicaView:
    """One extra replica of a version."""

    replica: str
    device: str
    state: str
    reserved_bytes: int
    measured_bytes: int | None
    pending: int
    pid: int | None
    succeeded: int = 0
    """Requests it answered (its scheduler's count; 0 once stopped)."""
    model_calls: int = 0
    """Calls to its worker (its scheduler's count; 0 once stopped): ``succeeded`` over
    this is the rows its batches carried, how full routing keeps each replica's batches."""
    generation: dict[str, object] | None = None
    """Its generation scheduler's stats (generative models only)."""

    @classmethod
    def of(cls, replica: Replica) -> ReplicaView:
        """The view of ``replica``."""
        info = replica.info
        counts = replica.scheduler.counters if replica.scheduler is not None else None
        return cls(
            str(replica.key),
            replica.device,
            replica.state.value,
            replica.reserved_bytes,
            replica.measured_bytes,
            replica.pending,
            info.pid if info is not None else None,
            counts["succeeded"] if counts is not None else 0,
            counts["model_calls"] if counts is not None else 0,
            _generation_stats(replica),
        )

    def to_json(self) -> dict[str, Any]:
        """Every field by name (``generation`` only for a generative model's)."""
        out: dict[str, Any] = {
            "replica": self.replica,
            "device": self.device,
            "state": self.state,
            "reserved_bytes": self.reserved_bytes,
            "measured_bytes": self.measured_bytes,
            "pending": self.pending,
            "pid": self.pid,
            "succeeded": self.succeeded,
            "model_calls": self.model_calls,
        }
        if self.generation is not None:
            out["generation"] = self.generation
        return out


def _generation_stats(replica: Replica) -> dict[str, object] | None:
    """``replica``'s generation scheduler's stats (None: not generative, or stopped)."""
    return replica.generation.stats() if replica.generation is not None else None


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One device's budget, its kind and whether models can run there."""

    name: str
    budget_bytes: int
    reserved_bytes: int
    free_bytes: int
    kind: str = "cpu"
    """``cpu``, ``cores`` (a CPU core set) or ``cuda``."""
    cores: tuple[int, ...] = ()
    unusable_reason: str = ""
    """Why no model can be placed here (empty: usable)."""

    def to_json(self) -> dict[str, Any]:
        """Budget figures, kind, cores (of a core set) and the reason it is unusable, if so."""
        out: dict[str, Any] = {
            "name": self.name,
            "budget_bytes": self.budget_bytes,
            "reserved_bytes": self.reserved_bytes,
            "free_bytes": self.free_bytes,
            "kind": self.kind,
        }
        if self.cores:
            out["cores"] = list(self.cores)
        if self.unusable_reason:
            out["unusable_reason"] = self.unusable_reason
        return out


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
                DeviceView(
                    d.name,
                    d.budget_bytes,
                    d.reserved_bytes,
                    d.free_bytes,
                    manager.devices[d.name].parsed.kind,
                    manager.devices[d.name].parsed.cores,
                    manager.devices[d.name].unusable_reason,
                )
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
