"""ClusterDevices: a cluster's nodes as the manager's budgeted devices, kept current.

In Ray mode each node's devices are devices of the manager, named ``NODE/cpu`` and
``NODE/cuda:N``, so placement, eviction, replicas and prefetch use the same rules as on
one host. A watcher reads the node table every ``poll_interval_s``:

* a node that joins (or comes back) adds its devices and budgets;
* a node that dies turns its devices unusable (placement skips them), and every
  instance on it is told at once, so its calls in flight fail with a typed 503 and the
  loader restarts the model on a device still alive (``relocate.py``); replicas there
  are dropped and their siblings take over.

The event log says which node joined or was lost and, per model, what moved where.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from modelyard.config.devices import DeviceName
from modelyard.manager.budget import MemoryBudget
from modelyard.manager.devices import Device, DeviceTable
from modelyard.manager.events import EventLog
from modelyard.manager.records import ModelKey
from modelyard.workers.cluster_nodes import ClusterNode

__all__ = ["ClusterDevices", "node_event_key"]

log = logging.getLogger("modelyard.cluster")

NodeReader = Callable[[], list[ClusterNode]]
"""Reads the node table (blocking: run in a thread)."""
NodeLost = Callable[[str, str], int]
"""``(node, reason)``: fail the instances on that node; returns how many."""


def node_event_key(node: str) -> ModelKey:
    """The key node events are logged under (the event log is keyed by model)."""
    return ModelKey("(cluster)", node)


def _parsed(name: str, local: str) -> DeviceName:
    kind, _, index = local.partition(":")
    if kind == "cuda":
        return DeviceName(name, "cuda", cuda_index=int(index or 0))
    return DeviceName(name, "cpu")


class ClusterDevices:
    """Applies node tables to the device table and the budget; watches for changes."""

    def __init__(
        self,
        devices: DeviceTable,
        budget: MemoryBudget,
        events: EventLog,
        read_nodes: NodeReader,
        on_lost: NodeLost,
        poll_interval_s: float = 0.5,
    ) -> None:
        self._devices = devices
        self._budget = budget
        self._events = events
        self._read_nodes = read_nodes
        self._on_lost = on_lost
        self._poll_interval_s = poll_interval_s
        self.alive: dict[str, ClusterNode] = {}
        """The nodes alive at the last read, by name."""
        self._task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        """Set after each read that changed the node set (tests wait on it)."""

    def apply(self, nodes: list[ClusterNode]) -> list[str]:
        """Bring devices in line with ``nodes``; returns the names of nodes lost now."""
        now_alive = {n.name: n for n in nodes if n.alive}
        lost = [name for name in self.alive if name not in now_alive]
        for name, node in now_alive.items():
            if name not in self.alive or self.alive[name].node_id != node.node_id:
                self._join(node)
        for name in lost:
            self._lose(self.alive[name])
        self.alive = now_alive
        return lost

    def _join(self, node: ClusterNode) -> None:
        names = []
        for dev in node.devices:
            name = f"{node.name}/{dev.local_name}"
            self._devices.put(
                Device(name, _parsed(name, dev.local_name), dev.budget_bytes, dev.unusable_reason)
            )
            self._budget.set_budget(name, dev.budget_bytes if not dev.unusable_reason else 0)
            names.append(f"{name} ({dev.budget_bytes / (1 << 20):.0f} MiB)")
        what = ", ".join(names) or "no device for models"
        self._events.add("node_joined", node_event_key(node.name), f"node {node.name}: {what}")
        log.info("node %s joined: %s", node.name, what)

    def _lose(self, node: ClusterNode) -> None:
        reason = f"node {node.name} was lost"
        for name in node.device_names():
            dev = self._devices.devices.get(name)
            if dev is not None:
                self._devices.put(Device(name, dev.parsed, dev.budget_bytes, reason))
        self._events.add("node_lost", node_event_key(node.name), reason)
        log.warning("%s; its models move to the nodes left", reason)

    async def refresh(self) -> list[str]:
        """Read the node table once and apply it; instances on lost nodes are failed."""
        nodes = await asyncio.to_thread(self._read_nodes)
        before = set(self.alive)
        lost = self.apply(nodes)
        for name in lost:
            count = self._on_lost(name, f"node {name} was lost")
            log.warning("node %s lost with %d worker(s) on it", name, count)
        if set(self.alive) != before:
            self.changed.set()
        return lost

    def start(self) -> None:
        """Start watching the cluster."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="modelyard-cluster")

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_interval_s)
            try:
                await self.refresh()
            except Exception:  # a GCS hiccup: read again next time
                log.warning("cannot read the Ray node table", exc_info=True)

    async def close(self) -> None:
        """Stop watching."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
