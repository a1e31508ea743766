"""What the cluster says about its nodes, as plain data (no Ray import here).

``workers/ray_cluster.py`` reads Ray's node table into these; the manager's cluster
watcher (``manager/cluster.py``) turns them into budgeted devices named ``NODE/cpu``
and ``NODE/cuda:N``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ClusterNode", "NodeDevice", "device_node", "local_device"]


@dataclass(frozen=True, slots=True)
class NodeDevice:
    """One device of a node: ``cpu`` or ``cuda:N``, its byte budget, or why unusable."""

    local_name: str
    budget_bytes: int
    unusable_reason: str = ""


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One node of the cluster as the server sees it."""

    name: str
    """``modelyard.node.NAME`` resource of the node, else the start of its id."""
    node_id: str
    alive: bool
    devices: tuple[NodeDevice, ...] = field(default_factory=tuple)

    def device_names(self) -> list[str]:
        """The node's devices as the manager names them: ``NODE/cpu``, ``NODE/cuda:0``."""
        return [f"{self.name}/{d.local_name}" for d in self.devices]


def device_node(device: str) -> str:
    """The node part of ``NODE/cpu`` (empty for a local device such as ``cpu``)."""
    node, sep, _ = device.rpartition("/")
    return node if sep else ""


def local_device(device: str) -> str:
    """The device as the node itself names it: ``cpu`` for ``NODE/cpu``."""
    return device.rpartition("/")[2]
