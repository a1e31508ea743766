"""What the cluster says about its nodes, as plain data (no Ray import here).

``workers/ray_cluster.py`` reads Ray's node table into these; the manager's cluster
watcher (``manager/cluster.py``) turns them into budgeted devices named ``NODE/cpu``
and ``NODE/cuda:N``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ClusterNode", "NodeDevice", "cpu_refusal", "device_node", "local_device"]


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
    cpus: float = 0.0
    """The CPUs Ray gives the node (its ``CPU`` resource)."""

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


def cpu_refusal(node: ClusterNode, holders: list[str], per_actor: float, model: str) -> str:
    """Why Ray cannot start one more actor of ``per_actor`` CPUs on ``node``, whose CPUs
    this server's actors ``holders`` already hold (``per_actor`` each); empty when it can.

    Ray would leave such an actor pending, without an error, until a CPU frees up: the
    load would wait for its whole load timeout and then fail without saying why.
    """
    held = per_actor * len(holders)
    if per_actor <= 0 or held + per_actor <= node.cpus + 1e-9:
        return ""
    shown = ", ".join(sorted(holders)[:4]) + (", …" if len(holders) > 4 else "")
    return (
        f"Ray cannot start model {model!r}'s actor on node {node.name}: it asks "
        f"{per_actor:g} CPU (ray.actor_num_cpus) and the node's {node.cpus:g} CPUs are held "
        f"by this server's {len(holders)} actor(s) there ({shown}); unload one, lower "
        "ray.actor_num_cpus, or add a node"
    )
