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


class LruPolicy:
    """Least recently used first; idle models before busy ones; less important first."""

    name = "lru"

    def order(self, candidates: Sequence[ModelRecord]) -> list[ModelRecord]:
        """Idle before busy, then lower importance (higher number), then oldest use."""
        return sorted(
            candidates,
            key=lambda r: (r.pending > 0, -r.config.priority, r.stats.last_used),
        )


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
