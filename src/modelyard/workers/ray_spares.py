"""SpareActors: idle model actors started ahead on each node (Ray mode's spare workers).

Creating a Ray actor starts a Python worker process on the node, which then imports
modelyard and its runtime: seconds, most of a cold load in Ray mode. As the fork
server's spare workers do on one host, the pool keeps ``ray.spare_actors`` idle
:class:`~modelyard.workers.ray_actor.ModelActor` actors started and warmed on every live
node; a load of a tensor model claims one (and the pool makes the next), so it pays only
for reading its model.

Spares ask Ray for no CPU: an idle actor should not hold a CPU that a serving one needs.
The CPUs of serving actors are this server's own accounting
(:meth:`~modelyard.workers.ray_cluster.RayCluster.placement_refusal`), spares or not.
Everything here blocks on Ray's RPCs: the cluster calls it from a thread.
"""

from __future__ import annotations

import logging
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from modelyard.workers.ray_actor import ModelActor

__all__ = ["SpareActors"]

log = logging.getLogger("modelyard.ray")

_RemoteSpare: Any = ray.remote(ModelActor)


class SpareActors:
    """Up to ``per_node`` idle, warmed model actors on each live node."""

    def __init__(self, per_node: int) -> None:
        self.per_node = per_node
        self._idle: dict[str, list[Any]] = {}
        """Node name → idle actors, oldest first."""

    def top_up(self, nodes: dict[str, str]) -> None:
        """Start spares on every node of ``nodes`` (name → node id) that has fewer than
        ``per_node``; drop those of nodes that are gone."""
        for name in list(self._idle):
            if name not in nodes:
                self._idle.pop(name)  # the node's actors died with it
        for name, node_id in nodes.items():
            idle = self._idle.setdefault(name, [])
            while len(idle) < self.per_node:
                actor = _RemoteSpare.options(
                    num_cpus=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                    max_restarts=0,
                ).remote()
                actor.warm.remote()  # start it now, and import the runtime there
                idle.append(actor)

    def claim(self, node: str) -> Any | None:
        """An idle actor on ``node`` for a load (None: none left); the next
        :meth:`top_up` replaces it."""
        idle = self._idle.get(node)
        if not idle:
            return None
        return idle.pop(0)

    def close(self) -> None:
        """Kill every idle actor."""
        for idle in self._idle.values():
            for actor in idle:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:
                    log.debug("could not kill a spare actor", exc_info=True)
        self._idle.clear()
