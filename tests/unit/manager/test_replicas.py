"""Replicas on fake instances and the fake clock: min replicas, scale-out under a
sustained queue, scale-in when idle, spread over devices, spare replicas evicted before
whole models, routing by power of two choices, a dead replica dropped."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from modelyard.config.devices import DeviceConfig
from modelyard.config.model_config import ModelConfig
from modelyard.manager.devices import DeviceTable
from modelyard.manager.manager import ModelManager
from modelyard.manager.records import ModelRecord, Replica, ReplicaState
from modelyard.manager.router import Router
from modelyard.manager.states import ModelState
from modelyard.scheduling import ModelScheduler, SchedulerConfig
from modelyard.workers.instance import ModelInstance
from tests.fakes.clock import FakeClock
from tests.fakes.instance import FakeInstance
from tests.unit.manager.settings import folder_settings

MIB = 1024 * 1024


def make(
    tmp_path: Path, devices: list[DeviceConfig], models: dict[str, dict[str, Any]]
) -> tuple[ModelManager, FakeClock, list[FakeInstance]]:
    settings = folder_settings(tmp_path, devices, models)
    clock = FakeClock()
    made: list[FakeInstance] = []

    def factory(config: ModelConfig) -> FakeInstance:
        made.append(FakeInstance(int((config.memory_mb or 1) * MIB)))
        return made[-1]

    async def scheduler_for(instance: ModelInstance | None, name: str) -> ModelScheduler:
        assert instance is not None

        async def execute(batch: dict[str, np.ndarray], deadline: float) -> dict[str, np.ndarray]:
            return await instance.infer(batch, 1.0)

        scheduler = ModelScheduler(name, SchedulerConfig(), execute, clock)
        await scheduler.start()
        return scheduler

    async def on_ready(record: ModelRecord) -> None:
        record.scheduler = await scheduler_for(record.instance, str(record.key))

    async def on_replica_ready(record: ModelRecord, replica: Replica) -> None:
        replica.scheduler = await scheduler_for(replica.instance, str(replica.key))

    def on_unloaded(record: ModelRecord) -> None:
        record.scheduler = None

    def on_replica_stopped(replica: Replica) -> None:
        replica.scheduler = None

    table = DeviceTable(
        settings.devices, host_budget_bytes=lambda: 1024 * MIB, usable_cores=lambda: {0, 1}
    )
    manager = ModelManager(
        settings,
        factory,
        clock=clock,
        devices=table,
        on_ready=on_ready,
        on_unloaded=on_unloaded,
        on_replica_ready=on_replica_ready,
        on_replica_stopped=on_replica_stopped,
    )
    return manager, clock, made


async def until(condition: Callable[[], bool]) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.001)

    await asyncio.wait_for(poll(), 5.0)


def ready_replicas(record: ModelRecord) -> list[Replica]:
    return [r for r in record.replicas if r.state is ReplicaState.READY]


TWO_SETS = [
    DeviceConfig(name="cpu:0", memory_budget_mb=100),
    DeviceConfig(name="cpu:1", memory_budget_mb=100),
]


async def two_replicas(
    tmp_path: Path, memory_mb: int = 10
) -> tuple[ModelManager, FakeClock, list[FakeInstance], ModelRecord]:
    """Model ``m`` (min and max 2 replicas) loaded on cpu:0, its replica ready on cpu:1."""
    manager, clock, made = make(
        tmp_path,
        TWO_SETS,
        {
            "m": {
                "memory_mb": memory_mb,
                "devices": ["cpu:0", "cpu:1"],
                "replicas": {"min": 2, "max": 2},
            }
        },
    )
    record = await manager.load("m")
    manager.scaler.tick()
    await until(lambda: len(ready_replicas(record)) == 1)
    return manager, clock, made, record


async def test_min_replicas_start_on_another_device_with_their_own_reservation(
    tmp_path: Path,
) -> None:
    manager, _, _, record = await two_replicas(tmp_path, memory_mb=30)
    assert record.device == "cpu:0"
    [replica] = record.replicas
    assert replica.device == "cpu:1", "replicas spread over the allowed devices"
    assert manager.budget.reserved("cpu:1", replica.key) == 30 * MIB
    assert manager.budget.reserved("cpu:0", record.key) == 30 * MIB
    added = [e.message for e in manager.events.recent() if e.kind == "replica_added"]
    assert len(added) == 1
    assert "m:1#1 on cpu:1 (replicas.min)" in added[0]
    manager.scaler.tick()
    await asyncio.sleep(0.01)
    assert len(record.replicas) == 1, "max reached"
    await manager.close()
    assert manager.budget.device("cpu:1").reserved_bytes == 0, "unload stops every replica"


async def test_a_sustained_queue_adds_a_replica_and_idleness_removes_it(tmp_path: Path) -> None:
    replicas = {"min": 1, "max": 3, "target_queue_depth": 2, "scale_up_after_s": 1.0}
    replicas["scale_down_idle_s"] = 30.0
    manager, clock, _ = make(
        tmp_path,
        TWO_SETS,
        {"m": {"memory_mb": 10, "devices": ["cpu:0", "cpu:1"], "replicas": replicas}},
    )
    record = await manager.load("m")
    scaler = manager.scaler
    record.route_leases = 5  # five requests outstanding on one replica: over the target
    scaler.tick()
    clock.advance(0.5)
    scaler.tick()
    assert record.replicas == [], "not sustained for 1 s yet"
    clock.advance(0.6)
    scaler.tick()
    await until(lambda: len(ready_replicas(record)) == 1)
    record.route_leases = 0  # load gone
    clock.advance(29.0)
    scaler.tick()
    assert ready_replicas(record), "idle for 29 s only"
    clock.advance(2.0)
    scaler.tick()
    await until(lambda: record.replicas == [])
    kinds = [e.kind for e in manager.events.recent()]
    assert "replica_removed" in kinds
    assert manager.budget.device("cpu:1").reserved_bytes == 0
    assert record.is_ready, "the first replica keeps serving"
    await manager.close()


async def test_a_load_under_pressure_stops_spare_replicas_before_whole_models(
    tmp_path: Path,
) -> None:
    manager, clock, _ = make(
        tmp_path,
        [DeviceConfig(name="cpu", memory_budget_mb=100)],
        {
            "hot": {"memory_mb": 30, "replicas": {"min": 2, "max": 2}},
            "old": {"memory_mb": 20},
            "new": {"memory_mb": 30},
        },
    )
    old = await manager.load("old")  # least recently used of all
    clock.advance(1.0)
    hot = await manager.load("hot")
    manager.scaler.tick()
    await until(lambda: len(ready_replicas(hot)) == 1)
    assert manager.budget.device("cpu").reserved_bytes == 80 * MIB
    await manager.load("new")
    assert old.is_ready, "a spare replica left instead of a whole model"
    assert hot.is_ready
    assert hot.replicas == []
    assert manager.budget.device("cpu").reserved_bytes == 80 * MIB
    await manager.close()


async def test_requests_go_to_the_less_loaded_replica_ties_to_the_oldest(tmp_path: Path) -> None:
    manager, clock, _, record = await two_replicas(tmp_path)
    router = Router(manager)
    [replica] = record.replicas
    assert all(router.pick(record) is None for _ in range(20)), "a tie: the first replica"
    record.route_leases = 3
    assert all(router.pick(record) is replica for _ in range(20))
    async with router.route(record, started=clock.monotonic(), timeout_s=10.0) as route:
        assert route.replica is replica
        assert route.scheduler is replica.scheduler
        assert replica.leases == 1
        inputs = {"x": np.ones((1, 1), np.float32)}
        out = await route.scheduler.submit(inputs, priority=None, deadline=route.deadline)
        assert out["x"].shape == (1, 1)
    assert replica.leases == 0
    record.route_leases = 0  # the three made-up requests: an unload drains real ones
    await manager.close()


async def test_a_dead_replica_is_dropped_and_its_memory_given_back(tmp_path: Path) -> None:
    manager, _, made, record = await two_replicas(tmp_path)
    made[-1].crash("SIGKILL")
    await until(lambda: record.replicas == [])
    assert manager.budget.device("cpu:1").reserved_bytes == 0
    assert record.state is ModelState.READY, "the model itself never noticed"
    assert "replica_crashed" in [e.kind for e in manager.events.recent()]
    manager.scaler.tick()  # still below min: a new one starts
    await until(lambda: len(ready_replicas(record)) == 1)
    await manager.close()


async def test_submit_runs_on_the_replica_the_router_picked(tmp_path: Path) -> None:
    manager, clock, _, record = await two_replicas(tmp_path)
    router = Router(manager)
    [replica] = record.replicas
    record.route_leases = 3  # the first replica looks busier: the other one is picked
    seen: list[int] = []

    def prepare(specs: object) -> dict[str, np.ndarray]:
        seen.append(replica.leases)
        return {"x": np.ones((1, 1), np.float32)}

    calls = replica.scheduler.counters["accepted"] if replica.scheduler else 0
    _, out = await router.submit(record, prepare, None, clock.monotonic(), None)
    assert out["x"].shape == (1, 1)
    assert seen == [1], "the replica is leased while the request is submitted"
    assert replica.leases == 0
    assert replica.scheduler is not None
    assert replica.scheduler.counters["accepted"] == calls + 1, "it ran on the replica"
    assert record.route_leases == 3, "the first replica was not leased"
    record.route_leases = 0  # the three made-up requests: an unload drains real ones
    await manager.close()
