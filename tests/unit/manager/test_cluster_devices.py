"""Cluster nodes as the manager's devices: joins add budgets, a lost node's models move.

Fake instances and a node table written by the test (the Ray tests in tests/ray run the
same path against a real local cluster).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from modelyard.config.model_config import ModelConfig
from modelyard.config.settings import ServerSettings
from modelyard.manager.cluster import ClusterDevices
from modelyard.manager.devices import DeviceTable
from modelyard.manager.manager import ModelManager
from modelyard.manager.states import ModelState
from modelyard.workers.cluster_nodes import ClusterNode, NodeDevice
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance

MIB = 1024 * 1024


def node(name: str, budget_mb: int, *, alive: bool = True, node_id: str = "") -> ClusterNode:
    return ClusterNode(name, node_id or f"id-{name}", alive, (NodeDevice("cpu", budget_mb * MIB),))


def make(
    tmp_path: Path, models: dict[str, int]
) -> tuple[ModelManager, ClusterDevices, list[ClusterNode], dict[str, list[FakeInstance]]]:
    for name in models:
        (tmp_path / name / "1").mkdir(parents=True)
    settings = ServerSettings(
        model_repository=str(tmp_path),
        models=[ModelConfig(name=n, path=n, memory_mb=mb) for n, mb in models.items()],
    )
    table = DeviceTable([])
    started: dict[str, list[FakeInstance]] = {}

    class Placed(FakeInstance):
        async def start(self, request):  # type: ignore[no-untyped-def]
            started.setdefault(request.spec.device, []).append(self)
            return await super().start(request)

    def factory(config: ModelConfig) -> FakeInstance:
        return Placed(int((config.memory_mb or 1) * MIB))

    manager = ModelManager(settings, factory, clock=FakeClock(), devices=table)
    nodes: list[ClusterNode] = []

    def lost(name: str, reason: str) -> int:
        dead = started.pop(f"{name}/cpu", [])
        for instance in dead:
            instance.crash(reason)
        return len(dead)

    watcher = ClusterDevices(table, manager.budget, manager.events, lambda: list(nodes), lost)
    return manager, watcher, nodes, started


async def test_nodes_become_budgeted_devices_and_a_model_cpu_means_every_node(
    tmp_path: Path,
) -> None:
    manager, watcher, nodes, _ = make(tmp_path, {"m": 10})
    nodes += [node("a", 100), node("b", 200)]
    await watcher.refresh()
    assert manager.budget.device("b/cpu").budget_bytes == 200 * MIB
    # The model's default device ``cpu`` means the cpu of every node.
    assert manager.devices.allowed(manager.entries["m"].config) == ["a/cpu", "b/cpu"]
    joined = [e.message for e in manager.events.recent() if e.kind == "node_joined"]
    assert sorted(joined) == ["node a: a/cpu (100 MiB)", "node b: b/cpu (200 MiB)"]
    await manager.close()


async def test_a_lost_node_moves_its_models_and_a_new_node_adds_its_budget(
    tmp_path: Path,
) -> None:
    manager, watcher, nodes, started = make(tmp_path, {"x": 60, "y": 60})
    nodes += [node("a", 100), node("b", 100)]
    await watcher.refresh()
    x = await manager.load("x")
    y = await manager.load("y")
    assert (x.device, y.device) == ("a/cpu", "b/cpu")  # 120 MiB do not fit one node
    nodes[:] = [node("a", 100), node("b", 100, alive=False)]
    assert await watcher.refresh() == ["b"]
    assert not manager.devices["b/cpu"].is_usable
    # y died with its node and moves to a by the same rules as any load: a is full, so
    # the colder model there makes room (equal priority).
    for _ in range(200):
        if y.state is ModelState.READY and x.state is ModelState.UNLOADED:
            break
        await asyncio.sleep(0.01)
    assert (y.state, y.device) == (ModelState.READY, "a/cpu")
    assert x.state is ModelState.UNLOADED
    assert manager.budget.device("b/cpu").reserved_bytes == 0  # nothing left held on b
    # A node joins: its budget takes x back without evicting y.
    nodes.append(node("c", 100))
    await watcher.refresh()
    await manager.ensure_ready(x, deadline=None)
    assert x.device == "c/cpu"
    assert started["c/cpu"]
    assert y.state is ModelState.READY
    kinds = [e.kind for e in manager.events.recent()]
    assert "node_lost" in kinds
    assert "moved" in kinds
    await manager.close()


async def test_a_lost_node_with_room_elsewhere_moves_at_once(tmp_path: Path) -> None:
    manager, watcher, nodes, _ = make(tmp_path, {"x": 60, "y": 60})
    nodes += [node("a", 100), node("b", 200)]
    await watcher.refresh()
    x = await manager.load("x")
    y = await manager.load("y")
    assert (x.device, y.device) == ("a/cpu", "b/cpu")
    nodes[:] = [node("a", 100, alive=False), node("b", 200)]
    await watcher.refresh()
    for _ in range(200):
        if x.state is ModelState.READY and x.device == "b/cpu":
            break
        await asyncio.sleep(0.01)
    assert (x.state, x.device) == (ModelState.READY, "b/cpu")
    [moved] = [e.message for e in manager.events.recent() if e.kind == "moved"]
    assert moved.startswith("from a/cpu (node a was lost) to b/cpu")
    await manager.close()
