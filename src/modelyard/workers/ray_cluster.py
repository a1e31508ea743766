"""RayCluster: the server's connection to a Ray cluster, and the node table read from it.

Imported only in Ray mode (``modelyard serve --ray``): Ray is the ``ray`` extra. Each
node's devices come from its Ray resources: ``NODE/cpu`` when the node has the CPUs an
actor asks for, ``NODE/cuda:N`` for each of its GPUs. Budgets come from the node's own
``modelyard.memory_mb`` / ``modelyard.gpu_memory_mb`` resources when it declares them
(``ray start --resources``), else from ``ray:`` settings (docs/ray.md).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Protocol

import ray

from modelyard.config.ray import (
    GPU_MEMORY_RESOURCE,
    MEMORY_RESOURCE,
    NODE_RESOURCE_PREFIX,
    RayConfig,
)
from modelyard.workers.cluster_nodes import ClusterNode, NodeDevice, cpu_refusal, device_node
from modelyard.workers.ray_spares import SpareActors

__all__ = ["NodeWatcher", "RayCluster", "read_node"]

log = logging.getLogger("modelyard.ray")

_MIB = 1024 * 1024


class NodeWatcher(Protocol):
    """An instance placed on a node, told when that node is lost."""

    @property
    def model_name(self) -> str:
        """The model the instance serves (named in placement refusals)."""
        ...

    def node_lost(self, reason: str) -> None:
        """Fail calls in flight at once and report the instance dead."""
        ...


def read_node(raw: dict[str, Any], config: RayConfig) -> ClusterNode:
    """A node of ``ray.nodes()`` as the server sees it."""
    resources: dict[str, float] = raw.get("Resources") or {}
    node_id = str(raw["NodeID"])
    name = next(
        (k[len(NODE_RESOURCE_PREFIX) :] for k in resources if k.startswith(NODE_RESOURCE_PREFIX)),
        node_id[:8],
    )
    share = config.budget_share
    devices: list[NodeDevice] = []
    cpus = resources.get("CPU", 0.0)
    if cpus > 0 and cpus >= config.actor_num_cpus:
        if MEMORY_RESOURCE in resources:
            budget = resources[MEMORY_RESOURCE] * _MIB
        elif config.node_memory_budget_mb:
            budget = config.node_memory_budget_mb * _MIB
        else:
            budget = resources.get("memory", 0.0) / 2
        devices.append(NodeDevice("cpu", int(budget * share)))
    for index in range(int(resources.get("GPU", 0.0))):
        mib = resources.get(GPU_MEMORY_RESOURCE) or config.gpu_memory_budget_mb
        if mib:
            devices.append(NodeDevice(f"cuda:{index}", int(mib * _MIB * share)))
        else:
            why = f"no GPU budget: give the node a {GPU_MEMORY_RESOURCE} resource"
            devices.append(NodeDevice(f"cuda:{index}", 0, why))
    return ClusterNode(name, node_id, bool(raw.get("Alive")), tuple(devices), cpus)


class RayCluster:
    """Connects to Ray once per process; lists nodes; tracks which instance is where."""

    def __init__(self, config: RayConfig) -> None:
        self.config = config
        self._owns_connection = False
        self._nodes: dict[str, ClusterNode] = {}
        self._watchers: dict[str, set[NodeWatcher]] = {}
        self._lost: set[str] = set()
        """Nodes lost and not back (a node that returns under its name is removed)."""
        self.ingress_id = f"ingress-{os.getpid()}-{id(self):x}"
        """This server's name in the leases of shared actors."""
        self._spares: SpareActors | None = None
        if config.spare_actors and not config.shared_workers:
            self._spares = SpareActors(config.spare_actors)

    def connect(self) -> None:
        """Join the cluster (blocking: run it in a thread). A process already connected
        (another server in the same process, a test's driver) keeps its connection."""
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not ray.is_initialized():
            ray.init(
                address=self.config.address,
                namespace=self.config.namespace,
                log_to_driver=False,
                logging_level=logging.WARNING,
            )
            self._owns_connection = True
        log.info("joined the Ray cluster at %s", self.config.address)

    def close(self) -> None:
        """Kill the idle spare actors; leave the cluster if this object joined it."""
        if self._spares is not None:
            self._spares.close()
        if self._owns_connection and ray.is_initialized():
            ray.shutdown()
        self._owns_connection = False

    def read_nodes(self) -> list[ClusterNode]:
        """Every node Ray knows, alive or dead (blocking: run it in a thread)."""
        nodes = [read_node(raw, self.config) for raw in ray.nodes()]  # type: ignore[no-untyped-call,unused-ignore]
        # A node id replaced by a new node of the same name: the living one counts.
        by_name: dict[str, ClusterNode] = {}
        for node in nodes:
            seen = by_name.get(node.name)
            if seen is None or (node.alive and not seen.alive):
                by_name[node.name] = node
        self._nodes = by_name
        self._lost -= {name for name, node in by_name.items() if node.alive}
        if self._spares is not None:
            cpu_nodes = {
                n.name: n.node_id
                for n in by_name.values()
                if n.alive and any(d.local_name == "cpu" for d in n.devices)
            }
            self._spares.top_up(cpu_nodes)
        return list(by_name.values())

    def claim_spare(self, device: str) -> Any | None:
        """An idle, started actor on the node of CPU device ``NODE/cpu`` (None: none)."""
        if self._spares is None or "/cuda:" in device:
            return None
        return self._spares.claim(device_node(device))

    def node_id_for(self, device: str) -> str | None:
        """The live node id of device ``NODE/…`` (None: unknown or dead)."""
        name = device_node(device)
        node = self._nodes.get(name)
        alive = node is not None and node.alive and name not in self._lost
        return node.node_id if node is not None and alive else None

    def placement_refusal(self, device: str, model: str) -> str:
        """Why an actor for ``model`` on CPU device ``NODE/cpu`` cannot start now (this
        server's actors hold the node's CPUs), or empty."""
        node = self._nodes.get(device_node(device))
        if node is None or "/cuda:" in device:
            return ""
        holders = [w.model_name for w in self._watchers.get(node.name, set())]
        return cpu_refusal(node, holders, self.config.actor_num_cpus, model)

    def watch(self, device: str, instance: NodeWatcher) -> None:
        """Tell ``instance`` when the node of ``device`` is lost (at once if it is)."""
        node = device_node(device)
        if node in self._lost:
            instance.node_lost(f"node {node} was lost")
            return
        self._watchers.setdefault(node, set()).add(instance)

    def unwatch(self, device: str, instance: NodeWatcher) -> None:
        """Stop telling ``instance`` (it stopped)."""
        self._watchers.get(device_node(device), set()).discard(instance)

    def fail_node(self, node: str, reason: str) -> int:
        """Every instance on ``node`` fails its calls and reports itself dead; returns
        how many there were."""
        self._lost.add(node)
        watchers = self._watchers.pop(node, set())
        for instance in list(watchers):
            instance.node_lost(reason)
        return len(watchers)
