"""The stats view: per model version and per device, as plain JSON-able dicts."""

from __future__ import annotations

from typing import Any

from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord

_MIB = 1024 * 1024


def record_stats(record: ModelRecord, now: float) -> dict[str, Any]:
    """State, bytes, counters and last load timings of one model version.

    ``now`` is on the manager's clock (``last_used`` is read on it).
    """
    s = record.stats
    t = record.timings
    out: dict[str, Any] = {
        "name": record.key.name,
        "version": record.key.version,
        "state": record.state.value,
        "ready": record.is_ready,
        "reason": record.reason,
        "device": record.config.device,
        "priority": record.config.priority,
        "pinned": record.pinned,
        "isolation": record.config.isolation,
        "reserved_bytes": record.reserved_bytes,
        "measured_bytes": record.measured_bytes,
        "last_used_s_ago": None if not s.last_used else round(now - s.last_used, 3),
        "requests": s.requests,
        "loads": s.loads,
        "unloads": s.unloads,
        "evictions": s.evictions,
        "restarts": s.restarts,
        "cold_starts": s.cold_starts,
        "prefetches": s.prefetches,
        "cold_start_s_total": round(s.cold_start_s_total, 6),
        "pending": record.pending,
        "last_load": {
            "queue_wait_s": round(t.queue_wait_s, 6),
            "process_start_s": round(t.process_start_s, 6),
            "runtime_load_s": round(t.runtime_load_s, 6),
            "warmup_s": round(t.warmup_s, 6),
            "total_s": round(t.total_s, 6),
        },
    }
    if record.info is not None:
        out["pid"] = record.info.pid
        out["worker"] = dict(record.info.details)
    if record.scheduler is not None:
        out["scheduler"] = record.scheduler.stats()
    return out


def manager_stats(manager: ModelManager) -> dict[str, Any]:
    """Every model version and every device budget."""
    now = manager.clock.monotonic()
    return {
        "models": [record_stats(r, now) for r in manager.records()],
        "devices": [
            {
                "name": d.name,
                "budget_bytes": d.budget_bytes,
                "reserved_bytes": d.reserved_bytes,
                "free_bytes": d.free_bytes,
            }
            for d in manager.budget.devices.values()
        ],
        "eviction_policy": manager.policy.name,
        "events": [e.to_dict() for e in manager.events.recent(50)],
    }
