"""Eviction policies: who leaves when a load needs room. Pure functions of records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from modelyard.manager.records import ModelRecord


class EvictionPolicy(Protocol):
    """Orders eviction candidates, most evictable first."""

    name: str

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Candidates sorted so that the first ones leave first."""
        ...

    def on_evict(self, record: ModelRecord) -> None:
        """Told of every eviction (policies with state age themselves here)."""
        ...


class LruPolicy:
    """Least recently used first; idle models before busy ones; less important first."""

    name = "lru"

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Idle before busy, then lower importance (higher number), then oldest use."""
        return sorted(
            candidates,
            key=lambda r: (r.pending > 0, -r.config.priority, r.stats.last_used),
        )

    def on_evict(self, record: ModelRecord) -> None:
        """LRU keeps no state."""


# A model never loaded yet is assumed to cost this much to bring back.
_DEFAULT_RELOAD_S = 0.1


class CostAwarePolicy:
    """Greedy-Dual-Size-Frequency: keep what is expensive to reload, popular and small.

    Each model's value is ``H = L + requests * reload_seconds / size``; the lowest value
    leaves first. ``L`` (the inflation) becomes the value of each evicted model, so
    models that stopped being used age out even if they were popular once. Idle before
    busy and priority classes come first, as in :class:`LruPolicy`.
    """

    name = "cost"

    def __init__(self) -> None:
        self.inflation = 0.0
        self._base: dict[object, float] = {}

    def value(self, record: ModelRecord) -> float:
        """``H`` of a candidate; its ``L`` is the inflation when it was (re)loaded."""
        base = self._base.setdefault(record.key, self.inflation)
        reload_s = record.timings.total_s or _DEFAULT_RELOAD_S
        size_mib = max(record.reserved_bytes, 1) / (1024 * 1024)
        return base + max(record.stats.requests, 1) * reload_s / size_mib

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Idle before busy, lower importance first, then lowest value first."""
        return sorted(candidates, key=lambda r: (r.pending > 0, -r.config.priority, self.value(r)))

    def on_evict(self, record: ModelRecord) -> None:
        """Raise the inflation to the victim's value; it starts afresh when reloaded."""
        self.inflation = max(self.inflation, self.value(record))
        self._base.pop(record.key, None)


def make_policy(name: str) -> EvictionPolicy:
    """The policy called ``name`` (``lru`` or ``cost``)."""
    if name == "lru":
        return LruPolicy()
    if name == "cost":
        return CostAwarePolicy()
    raise ValueError(f"unknown eviction policy {name!r}")


def select_victims(
    policy: EvictionPolicy, candidates: Sequence[ModelRecord], need_bytes: int
) -> list[ModelRecord] | None:
    """The shortest prefix of the policy's order that frees ``need_bytes``; None if none does."""
    if need_bytes <= 0:
        return []
    chosen: list[ModelRecord] = []
    freed = 0
    for record in policy.order(candidates):
        chosen.append(record)
        freed += record.reserved_bytes
        if freed >= need_bytes:
            return chosen
    return None
