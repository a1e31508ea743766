"""The health view: why the server and each model version are (not) ready.

Built by the app from the same :class:`~modelyard.manager.stats.VersionView` the stats
view uses, and converted to JSON by the route that serves it (``/v2/health/details``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modelyard.manager.stats import VersionView


@dataclass(frozen=True, slots=True)
class HealthView:
    """The server's readiness, its worker machinery and every model version."""

    live: bool
    ready: bool
    reason: str
    """Why the server is not ready ("starting", "shutting down", "stopped"; "" when ready)."""
    worker_memory_limits: str | None
    """The memory-limit backend of worker processes (None before the factory starts)."""
    fork_server_alive: bool
    models: list[VersionView]
    spare_workers: list[int] = field(default_factory=list)
    """Process ids of the idle spare workers (``spare_workers`` setting)."""

    def to_json(self) -> dict[str, Any]:
        """The ``/v2/health/details`` document."""
        return {
            "live": self.live,
            "ready": self.ready,
            "reason": self.reason,
            "worker_memory_limits": self.worker_memory_limits,
            "fork_server_alive": self.fork_server_alive,
            "spare_workers": self.spare_workers,
            "models": [m.health_json() for m in self.models],
        }
